"""The checks of the Redis settings together: REDIS_URL or REDIS_CACHE_ALIAS (one of them),
the cache the alias names, REDIS_CLUSTER with the URL it applies to, and the socket
timeouts a reused django-redis cache must set. Each setting's own value is checked by its
row of ``delayjobs.conf.SETTINGS`` (``checks.settings``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from redis.connection import parse_url

from delayjobs.conf import BY_NAME

NAMES = ("REDIS_URL", "REDIS_CACHE_ALIAS", "REDIS_CLUSTER")


def check_redis(config: dict[str, Any], values: dict[str, Any]) -> list[checks.CheckMessage]:
    """``config``: the DELAYJOBS dict as written; ``values``: the settings that read fine."""
    if config.get("REDIS_URL") and config.get("REDIS_CACHE_ALIAS"):
        return [
            checks.Error(
                "DELAYJOBS sets both REDIS_URL and REDIS_CACHE_ALIAS.",
                hint="Keep one: a URL, or the alias of a django-redis cache to reuse.",
                id="delayjobs.E002",
            )
        ]
    if any(name not in values for name in NAMES):
        return []  # a bad value, reported by its own row
    url, alias, cluster = (values[name] for name in NAMES)
    problem = _cluster_problem(url, alias) if cluster else None
    if problem:
        return [
            checks.Error(
                f"DELAYJOBS['REDIS_CLUSTER'] is True, but {problem}",
                hint=BY_NAME["REDIS_CLUSTER"].hint,
                id="delayjobs.E017",
            )
        ]
    if alias is not None:
        return _check_cache(alias)
    return []


def _check_cache(alias: str) -> list[checks.CheckMessage]:
    caches = getattr(django_settings, "CACHES", {})
    cache = caches.get(alias)
    if not isinstance(cache, dict):
        return [
            checks.Error(
                f"DELAYJOBS['REDIS_CACHE_ALIAS'] names the cache {alias!r}, which is not in "
                f"CACHES.",
                hint=BY_NAME["REDIS_CACHE_ALIAS"].hint,
                id="delayjobs.E004",
            )
        ]
    if not str(cache.get("BACKEND", "")).startswith("django_redis."):
        return [
            checks.Error(
                f"CACHES[{alias!r}] is not a django-redis cache ({cache.get('BACKEND')!r}).",
                hint="Use BACKEND 'django_redis.cache.RedisCache', or set REDIS_URL instead.",
                id="delayjobs.E004",
            )
        ]
    return _check_cache_timeouts(alias, cache)


#: The socket timeouts a django-redis cache must set (django-redis sets none).
CACHE_TIMEOUTS = ("SOCKET_CONNECT_TIMEOUT", "SOCKET_TIMEOUT")


def _check_cache_timeouts(alias: str, cache: dict[str, Any]) -> list[checks.CheckMessage]:
    """django-redis sets no socket timeout by default: a Redis that stops answering would
    hold every call on it for ever, and consumers would never fall back to the database."""
    options = cache.get("OPTIONS")
    options = options if isinstance(options, dict) else {}
    missing = [name for name in CACHE_TIMEOUTS if options.get(name) is None]
    if not missing:
        return []
    return [
        checks.Warning(
            f"CACHES[{alias!r}]['OPTIONS'] sets no {' and no '.join(missing)}: a Redis that "
            "stops answering (frozen, or behind a network partition that drops packets) would "
            "hold up schedule() and the consumers without limit, and consumers would never "
            "fall back to the database.",
            hint="Add 'SOCKET_CONNECT_TIMEOUT': 1 and 'SOCKET_TIMEOUT': 2 to the cache's "
            "OPTIONS (what delayjobs itself uses with REDIS_URL).",
            id="delayjobs.W003",
        )
    ]


def _cluster_problem(url: str | None, alias: str | None) -> str | None:
    """What is wrong with a Redis Cluster reached through this URL or alias, or None."""
    if alias is not None:
        # django-redis has no Redis Cluster client: its pool would talk to one node and
        # fail with MOVED on the keys of the others.
        return "REDIS_CACHE_ALIAS is set: django-redis caches cannot reach a Redis Cluster."
    if url is not None and url.startswith("unix://"):
        return "REDIS_URL is a unix:// socket: cluster nodes announce each other by host and port."
    database = parse_url(url).get("db", 0) if url is not None else 0
    if int(database) != 0:
        return f"REDIS_URL selects database {database}: a Redis Cluster has only database 0."
    return None
