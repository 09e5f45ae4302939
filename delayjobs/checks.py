"""System checks of the DELAYJOBS settings and the registered job types.

Ids are stable (``delayjobs.E001`` ...) so that projects can silence one on purpose.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core import checks

from delayjobs.conf import DEFAULTS, DURATION_SETTINGS, as_timedelta, raw_settings


@checks.register("delayjobs")
def check_settings(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    value = getattr(django_settings, "DELAYJOBS", {})
    if not isinstance(value, dict):
        return [
            checks.Error(
                f"DELAYJOBS must be a dict, got {type(value).__name__}.",
                hint="DELAYJOBS = {'REDIS_URL': 'redis://127.0.0.1:6379/0'}",
                id="delayjobs.E001",
            )
        ]
    config = raw_settings()
    messages += _check_redis(config)
    messages += _check_durations(config)
    messages += _check_scalars(config)
    messages += _check_limits(config)
    if not getattr(django_settings, "USE_TZ", False):
        messages.append(
            checks.Error(
                "delayjobs needs USE_TZ = True: job times are compared across processes and "
                "hosts, which only aware datetimes make safe.",
                hint="Set USE_TZ = True in your settings.",
                id="delayjobs.E008",
            )
        )
    for name in sorted(set(config) - set(DEFAULTS)):
        messages.append(
            checks.Warning(
                f"DELAYJOBS[{name!r}] is not a delayjobs setting; it is ignored.",
                hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
                id="delayjobs.W001",
            )
        )
    return messages


def _check_redis(config: dict[str, Any]) -> list[checks.CheckMessage]:
    url, alias = config.get("REDIS_URL"), config.get("REDIS_CACHE_ALIAS")
    if url and alias:
        return [
            checks.Error(
                "DELAYJOBS sets both REDIS_URL and REDIS_CACHE_ALIAS.",
                hint="Keep one: a URL, or the alias of a django-redis cache to reuse.",
                id="delayjobs.E002",
            )
        ]
    if url is not None and (
        not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://"))
    ):
        return [
            checks.Error(
                f"DELAYJOBS['REDIS_URL'] must be a redis://, rediss:// or unix:// URL, "
                f"got {url!r}.",
                hint="For example 'redis://127.0.0.1:6379/0', or 'rediss://user:pass@host/0' "
                "for TLS.",
                id="delayjobs.E003",
            )
        ]
    if alias is not None:
        caches = getattr(django_settings, "CACHES", {})
        cache = caches.get(alias) if isinstance(alias, str) else None
        if cache is None:
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
    return []


def _check_durations(config: dict[str, Any]) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    values = {}
    for name in DURATION_SETTINGS:
        raw = config.get(name, DEFAULTS[name])
        value = as_timedelta(raw)
        if value is None or value.total_seconds() <= 0:
            messages.append(
                checks.Error(
                    f"DELAYJOBS[{name!r}] must be a positive number of seconds or a positive "
                    f"timedelta, got {raw!r}.",
                    hint=f"For example {name!r}: {DEFAULTS[name].total_seconds():g} (seconds), "
                    f"or datetime.timedelta(seconds={DEFAULTS[name].total_seconds():g}).",
                    id="delayjobs.E005",
                )
            )
        values[name] = value
    interval, window = values["PRELOAD_INTERVAL"], values["PRELOAD_WINDOW"]
    if interval and window and interval.total_seconds() > 0 and window <= interval:
        messages.append(
            checks.Error(
                f"PRELOAD_WINDOW ({window.total_seconds():g} s) must be longer than "
                f"PRELOAD_INTERVAL ({interval.total_seconds():g} s).",
                hint="Otherwise a job can come due between two pre-loader passes without ever "
                "having been loaded into Redis, and fire up to an interval late. A window of "
                "3-6 intervals is a good choice.",
                id="delayjobs.E006",
            )
        )
    return messages


def _check_scalars(config: dict[str, Any]) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    for name in ("PRELOAD_BATCH_SIZE", "CONCURRENCY"):
        value = config.get(name, DEFAULTS[name])
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            messages.append(
                checks.Error(
                    f"DELAYJOBS[{name!r}] must be a positive integer, got {value!r}.",
                    hint=f"The default is {DEFAULTS[name]}.",
                    id="delayjobs.E007",
                )
            )
    prefix = config.get("KEY_PREFIX", DEFAULTS["KEY_PREFIX"])
    if not isinstance(prefix, str) or not prefix or any(c in prefix for c in "{} "):
        messages.append(
            checks.Error(
                f"DELAYJOBS['KEY_PREFIX'] must be a non-empty string without braces or spaces, "
                f"got {prefix!r}.",
                hint="Braces would break the Redis Cluster hash tags of the queue keys.",
                id="delayjobs.E009",
            )
        )
    for name in ("REDIS_CONNECT_TIMEOUT", "REDIS_SOCKET_TIMEOUT"):
        value = config.get(name, DEFAULTS[name])
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            messages.append(
                checks.Error(
                    f"DELAYJOBS[{name!r}] must be a positive number of seconds, got {value!r}.",
                    hint=f"The default is {DEFAULTS[name]:g} seconds.",
                    id="delayjobs.E010",
                )
            )
    return messages


def _check_limits(config: dict[str, Any]) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    limits = config.get("QUEUE_CONCURRENCY", DEFAULTS["QUEUE_CONCURRENCY"])
    if not isinstance(limits, dict) or not all(
        isinstance(queue, str) and queue and _is_positive_int(limit)
        for queue, limit in limits.items()
    ):
        messages.append(
            checks.Error(
                f"DELAYJOBS['QUEUE_CONCURRENCY'] must map queue names to positive integers, "
                f"got {limits!r}.",
                hint="For example {'sms': 2}: at most two jobs of the queue 'sms' run at once "
                "in each consumer process.",
                id="delayjobs.E011",
            )
        )
    size = config.get("MAX_PAYLOAD_BYTES", DEFAULTS["MAX_PAYLOAD_BYTES"])
    if size is not None and not _is_positive_int(size):
        messages.append(
            checks.Error(
                f"DELAYJOBS['MAX_PAYLOAD_BYTES'] must be a positive integer or None, got {size!r}.",
                hint=f"The default is {DEFAULTS['MAX_PAYLOAD_BYTES']} (64 KiB). Store ids in "
                "payloads, not documents.",
                id="delayjobs.E012",
            )
        )
    return messages


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
