"""Every test here starts and ends with an empty Redis (never so in tests/unit)."""

from typing import Any

import pytest
from django.test import Client

from tests.support.fixtures import clean_redis_autouse  # noqa: F401 (autouse here)


@pytest.fixture
def api(client: Client) -> Any:
    """The HTTP API's test client with a key of a user who has every permission of it."""
    from tests.integration.http_client import ALL_PERMISSIONS, Api, key_of, make_user

    return Api(client, key_of(make_user(*ALL_PERMISSIONS)))
