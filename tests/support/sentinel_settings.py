"""The Redis Sentinel names tests/settings.py and the scale suite (tests/scale/sentinel.py) share.

Here, not in tests/scale, so that the main suite's settings import nothing of the scale suite.
"""

from __future__ import annotations

from typing import Any

#: Environment of the tests' Django processes: the sentinels ("host:port,host:port,...")
#: and the master's service name. tests.settings reads them.
SENTINELS_ENV = "DELAYJOBS_TEST_SENTINELS"
SERVICE_ENV = "DELAYJOBS_TEST_SENTINEL_SERVICE"
#: The alias of the cache delayjobs uses in those processes.
CACHE_ALIAS = "sentinel"

__all__ = ["CACHE_ALIAS", "SENTINELS_ENV", "SERVICE_ENV", "parse_sentinels", "sentinel_cache"]


def sentinel_cache(sentinels: list[tuple[str, int]], service: str) -> dict[str, Any]:
    """A CACHES entry for a Sentinel-managed master, as django-redis's README gives it.

    ``CONNECTION_FACTORY`` in OPTIONS (rather than the global
    DJANGO_REDIS_CONNECTION_FACTORY) is the README's form for a project whose other caches
    are plain Redis. The socket timeouts bound how long a dead master (or sentinel) holds
    up a call: with a cache alias, delayjobs' own REDIS_*_TIMEOUT settings do not apply.
    """
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        # The host part is the master's service name, not a host.
        "LOCATION": f"redis://{service}/0",
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "SENTINELS": sentinels,
            "SOCKET_CONNECT_TIMEOUT": 1,
            "SOCKET_TIMEOUT": 2,
        },
    }


def parse_sentinels(value: str) -> list[tuple[str, int]]:
    """``"127.0.0.1:26379,127.0.0.1:26380"`` as [(host, port), ...]."""
    pairs = (item.rpartition(":") for item in value.split(",") if item)
    return [(host, int(port)) for host, _sep, port in pairs]
