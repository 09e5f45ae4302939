"""The checks of the Redis settings: REDIS_URL or REDIS_CACHE_ALIAS (one of them),
REDIS_CLUSTER, and the socket timeouts a reused django-redis cache must set."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from redis.connection import parse_url

from delayjobs.conf import DEFAULTS
from delayjobs.index.client import mask_url


def check_redis(config: dict[str, Any]) -> list[checks.CheckMessage]:
    url, alias = config.get("REDIS_URL"), config.get("REDIS_CACHE_ALIAS")
    if url and alias:
        return [
            checks.Error(
                "DELAYJOBS sets both REDIS_URL and REDIS_CACHE_ALIAS.",
                hint="Keep one: a URL, or the alias of a django-redis cache to reuse.",
                id="delayjobs.E002",
            )
        ]
    if url is not None and not _is_redis_url(url):
        hint = "For example 'redis://127.0.0.1:6379/0', or 'rediss://user:pass@host/0' for TLS."
        if isinstance(url, str) and "sentinel" in url.partition("://")[0].lower():
            # redis-py has no URL for Sentinel, and a grammar of our own would be one more
            # to learn: Sentinel goes through django-redis's documented configuration.
            hint = (
                "Redis Sentinel has no URL: configure a django-redis cache with "
                "'django_redis.pool.SentinelConnectionFactory' and name it in "
                "REDIS_CACHE_ALIAS instead (see the Redis Sentinel how-to)."
            )
        return [
            checks.Error(
                f"DELAYJOBS['REDIS_URL'] must be a valid redis://, rediss:// or unix:// URL, "
                f"got {_shown_url(url)}.",
                hint=hint,
                id="delayjobs.E003",
            )
        ]
    cluster = config.get("REDIS_CLUSTER", DEFAULTS["REDIS_CLUSTER"])
    problem = _cluster_problem(cluster, url, alias) if cluster is not False else None
    if problem:
        return [
            checks.Error(
                f"DELAYJOBS['REDIS_CLUSTER'] is {cluster!r}, but {problem}",
                hint="REDIS_CLUSTER = True with REDIS_URL naming any one node of the "
                "cluster, e.g. 'redis://10.0.0.1:6379/0'.",
                id="delayjobs.E017",
            )
        ]
    if alias is not None:
        caches = getattr(django_settings, "CACHES", {})
        cache = caches.get(alias) if isinstance(alias, str) else None
        if not isinstance(cache, dict):
            return [
                checks.Error(
                    f"DELAYJOBS['REDIS_CACHE_ALIAS'] names the cache {alias!r}, which is not in "
                    f"CACHES.",
                    hint="Add it to CACHES with BACKEND 'django_redis.cache.RedisCache'.",
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
    return []


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


def _cluster_problem(cluster: Any, url: Any, alias: Any) -> str | None:
    """What is wrong with REDIS_CLUSTER and the URL it applies to, or None."""
    if not isinstance(cluster, bool):
        return "it must be True or False."
    if alias is not None:
        # django-redis has no Redis Cluster client: its pool would talk to one node and
        # fail with MOVED on the keys of the others.
        return "REDIS_CACHE_ALIAS is set: django-redis caches cannot reach a Redis Cluster."
    if isinstance(url, str) and url.startswith("unix://"):
        return "REDIS_URL is a unix:// socket: cluster nodes announce each other by host and port."
    database = parse_url(url).get("db", 0) if isinstance(url, str) else 0
    if int(database) != 0:
        return f"REDIS_URL selects database {database}: a Redis Cluster has only database 0."
    return None


def _is_redis_url(url: Any) -> bool:
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        return False
    try:
        parse_url(url)  # what redis-py does with it: a bad port fails here, not at runtime
    except ValueError:
        return False
    return True


def _shown_url(url: object) -> str:
    """The value as a message may show it: a string that may hold a password is masked."""
    return repr(mask_url(url)) if isinstance(url, str) else repr(url)
