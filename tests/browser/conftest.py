"""Every test here starts and ends with an empty Redis (never so in tests/unit)."""

from tests.support.fixtures import clean_redis_autouse  # noqa: F401 (autouse here)
