"""Unit tests need settings only: no database, no Redis, no process.

Nothing here cleans Redis (tests/integration's conftest does that), and a unit test that asks
for a service fails at once, saying where it belongs.
"""

from __future__ import annotations

import pytest

#: Fixtures that reach a service; a test asking for one is an integration or e2e test.
SERVICE_FIXTURES = frozenset(
    {"db", "transactional_db", "live_server", "redis_client", "_clean_redis", "consumer_process"}
)


@pytest.fixture(autouse=True)
def _no_services(request: pytest.FixtureRequest) -> None:
    asked = sorted(SERVICE_FIXTURES.intersection(request.fixturenames))
    if request.node.get_closest_marker("django_db"):
        asked.append("the django_db marker")
    if asked:
        pytest.fail(
            f"a unit test uses {', '.join(asked)}: move it to tests/integration (in-process) "
            "or tests/e2e (processes)"
        )
