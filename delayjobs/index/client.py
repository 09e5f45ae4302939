"""The shared Redis client: made from ``REDIS_URL`` (one server or a Redis Cluster) or
taken from a django-redis cache, and forgotten when those settings change.
"""

from __future__ import annotations

import threading
from typing import Any

import redis
from django.core.signals import setting_changed
from django.dispatch import receiver
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from delayjobs.conf import mask_url, settings

#: What ``get_client()`` returns: a client of one server, or of a Redis Cluster.
Client = redis.Redis | RedisCluster

_client_lock = threading.Lock()
_client: Client | None = None
_client_owned = False  # made from REDIS_URL by us (so ours to close), not django-redis's


def get_client() -> Client:
    """The shared Redis client (thread-safe; connection-pooled)."""
    global _client, _client_owned
    if _client is None:
        with _client_lock:
            if _client is None:
                _client_owned = settings.redis_target[0] == "url"
                _client = _connect()
    return _client


def _connect() -> Client:
    kind, target = settings.redis_target
    if kind == "cache":
        from django_redis import get_redis_connection

        return get_redis_connection(target)
    options: dict[str, Any] = {
        "socket_connect_timeout": settings.REDIS_CONNECT_TIMEOUT,
        "socket_timeout": settings.REDIS_SOCKET_TIMEOUT,
        "health_check_interval": 30,
    }
    if settings.REDIS_CLUSTER:
        # The URL names any one node; the client asks it for the others and for who owns
        # each slot, and follows MOVED/ASK redirections when slots move.
        try:
            return RedisCluster.from_url(target, **options)
        except RedisClusterException as exc:  # no node answered: see _redis_errors
            raise ClusterUnreachable(str(exc)) from exc
    return redis.Redis.from_url(target, **options)


def reset_client() -> None:
    """Forget the client, so the next use reads the settings again."""
    global _client
    with _client_lock:
        if _client is not None and _client_owned:
            _client.close()
        _client = None
        # The store over it is replaced by get_store(), which sees the client change.


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("DELAYJOBS", "CACHES"):
        reset_client()


def describe_target() -> str:
    """Where Redis is, for logs and errors, with any password masked."""
    kind, target = settings.redis_target
    if kind == "cache":
        return f"django-redis cache {target!r}"
    if settings.REDIS_CLUSTER:
        return f"Redis Cluster at {mask_url(target)}"
    return mask_url(target)


class ClusterUnreachable(redis.ConnectionError):
    """No node of the Redis Cluster answers (redis-py's RedisClusterException)."""
