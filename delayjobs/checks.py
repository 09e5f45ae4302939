"""System checks of the DELAYJOBS settings and the registered job types.

Ids are stable (``delayjobs.E001`` ...) so that projects can silence one on purpose.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from redis.connection import parse_url

from delayjobs.conf import (
    DEFAULTS,
    DURATION_SETTINGS,
    EXECUTORS,
    MAX_CLAIM_AHEAD,
    MAX_PAYLOAD_DEPTH_LIMIT,
    MAX_SCHEDULE_AHEAD_LIMIT,
    as_timedelta,
    raw_settings,
)
from delayjobs.jobtypes import QUEUE_PATTERN, registry, validate_job_type_class
from delayjobs.redis_store import mask_url

#: Upper bounds, far above any sensible value and far below what breaks: a duration is
#: added to now() and slept on (threading's TIMEOUT_MAX is about 292 years), a timeout is
#: given to socket.settimeout(), and each unit of concurrency is a thread.
MAX_DURATION = timedelta(days=365)
MAX_TIMEOUT_SECONDS = 24 * 3600
MAX_CONCURRENCY = 1000


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
    messages += _check_claim_ahead(config)
    messages += _check_schedule_ahead(config)
    messages += _check_payload_depth(config)
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
    for name in sorted(set(config) - set(DEFAULTS), key=repr):  # keys of any type
        messages.append(
            checks.Warning(
                f"DELAYJOBS[{name!r}] is not a delayjobs setting; it is ignored.",
                hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
                id="delayjobs.W001",
            )
        )
    return messages


@checks.register("delayjobs")
def check_job_types(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[checks.Error]:
    """Every registered job type's declaration, again: ``@register`` refuses a bad one at
    import, but a class attribute changed afterwards (read from a setting, say) must not
    reach a consumer, where an unbounded ``time_to_run`` overflows at the first claim."""
    messages = []
    for jobtype in registry:
        try:
            validate_job_type_class(type(jobtype))
        except ImproperlyConfigured as exc:
            messages.append(
                checks.Error(
                    str(exc),
                    hint="Fix the job type's class attribute; the bounds keep leases and "
                    "retries within what dates can hold.",
                    id="delayjobs.E101",
                )
            )
    return messages


@checks.register("delayjobs", checks.Tags.urls)
def check_http_api(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[checks.Warning]:
    """The HTTP API mounted with no public job type: only keys listing job types can
    schedule anything, which after the upgrade that made job types private is a surprise."""
    if not _http_api_mounted() or any(jobtype.public for jobtype in registry):
        return []
    return [
        checks.Warning(
            "The HTTP API (delayjobs.http.urls) is mounted, but no job type is public: API "
            "keys can schedule only the private job types listed on them.",
            hint="Set public = True on the job types any key may schedule, or list them on "
            "each key (create_delay_api_key --job-type NAME, or the key's page in the admin).",
            id="delayjobs.W002",
        )
    ]


def _http_api_mounted() -> bool:
    from django.urls import NoReverseMatch, reverse

    try:
        reverse("delayjobs_api:not-found")
    except NoReverseMatch:
        return False
    except Exception:
        # No URLconf at all (a settings module for consumers only) or a broken one, which
        # Django's own checks report: either way, nothing of delayjobs is mounted to judge.
        return False
    return True


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


def _check_claim_ahead(config: dict[str, Any]) -> list[checks.CheckMessage]:
    raw = config.get("CLAIM_AHEAD", DEFAULTS["CLAIM_AHEAD"])
    value = as_timedelta(raw)
    if value is not None and timedelta(0) <= value <= MAX_CLAIM_AHEAD:
        return []
    return [
        checks.Error(
            f"DELAYJOBS['CLAIM_AHEAD'] must be 0 to {MAX_CLAIM_AHEAD.total_seconds():g} "
            f"seconds (a number or a timedelta); got {raw!r}.",
            hint="The default, 0.02 (20 ms), hides the claim's round trips; 0 claims a job "
            "only once it is due.",
            id="delayjobs.E014",
        )
    ]


def _check_payload_depth(config: dict[str, Any]) -> list[checks.CheckMessage]:
    value = config.get("MAX_PAYLOAD_DEPTH", DEFAULTS["MAX_PAYLOAD_DEPTH"])
    if _is_positive_int(value) and value <= MAX_PAYLOAD_DEPTH_LIMIT:
        return []
    return [
        checks.Error(
            f"DELAYJOBS['MAX_PAYLOAD_DEPTH'] must be an int from 1 to "
            f"{MAX_PAYLOAD_DEPTH_LIMIT}, got {value!r}.",
            hint="The default, 64, is deeper than any payload of ids and values needs.",
            id="delayjobs.E016",
        )
    ]


def _check_schedule_ahead(config: dict[str, Any]) -> list[checks.CheckMessage]:
    raw = config.get("MAX_SCHEDULE_AHEAD", DEFAULTS["MAX_SCHEDULE_AHEAD"])
    value = as_timedelta(raw)
    if value is not None and timedelta(0) < value <= MAX_SCHEDULE_AHEAD_LIMIT:
        return []
    return [
        checks.Error(
            f"DELAYJOBS['MAX_SCHEDULE_AHEAD'] must be a positive number of seconds or a "
            f"positive timedelta, at most {MAX_SCHEDULE_AHEAD_LIMIT.days} days; got {raw!r}.",
            hint="The default, timedelta(days=36525), lets jobs be scheduled up to 100 years "
            "ahead.",
            id="delayjobs.E015",
        )
    ]


def _check_durations(config: dict[str, Any]) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    values = {}
    for name in DURATION_SETTINGS:
        raw = config.get(name, DEFAULTS[name])
        value = as_timedelta(raw)
        if value is None or not timedelta(0) < value <= MAX_DURATION:
            value = None  # reported here, not again by E006
            messages.append(
                checks.Error(
                    f"DELAYJOBS[{name!r}] must be a positive number of seconds or a positive "
                    f"timedelta, at most {MAX_DURATION.days} days; got {raw!r}.",
                    hint=f"For example {name!r}: {DEFAULTS[name].total_seconds():g} (seconds), "
                    f"or datetime.timedelta(seconds={DEFAULTS[name].total_seconds():g}).",
                    id="delayjobs.E005",
                )
            )
        values[name] = value
    interval, window = values["PRELOAD_INTERVAL"], values["PRELOAD_WINDOW"]
    if interval is not None and window is not None and window <= interval:
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
    for name, most in (("PRELOAD_BATCH_SIZE", None), ("CONCURRENCY", MAX_CONCURRENCY)):
        value = config.get(name, DEFAULTS[name])
        if not _is_positive_int(value) or (most is not None and value > most):
            limit = f" up to {most}" if most is not None else ""
            messages.append(
                checks.Error(
                    f"DELAYJOBS[{name!r}] must be a positive integer{limit}, got {value!r}.",
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
        if not _is_number(value) or not 0 < value <= MAX_TIMEOUT_SECONDS:
            messages.append(
                checks.Error(
                    f"DELAYJOBS[{name!r}] must be a positive number of seconds, at most "
                    f"{MAX_TIMEOUT_SECONDS}; got {value!r}.",
                    hint=f"The default is {DEFAULTS[name]:g} seconds.",
                    id="delayjobs.E010",
                )
            )
    return messages


def _check_limits(config: dict[str, Any]) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    limits = config.get("QUEUE_CONCURRENCY", DEFAULTS["QUEUE_CONCURRENCY"])
    if not isinstance(limits, dict) or not all(
        isinstance(queue, str) and QUEUE_PATTERN.fullmatch(queue) and _is_positive_int(limit)
        for queue, limit in limits.items()
    ):
        messages.append(
            checks.Error(
                f"DELAYJOBS['QUEUE_CONCURRENCY'] must map queue names (1-100 letters, digits "
                f"and '_.-') to positive integers, got {limits!r}.",
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
    executor = config.get("EXECUTOR", DEFAULTS["EXECUTOR"])
    if executor not in EXECUTORS:
        messages.append(
            checks.Error(
                f"DELAYJOBS['EXECUTOR'] must be one of {', '.join(map(repr, EXECUTORS))}, "
                f"got {executor!r}.",
                hint="'local' runs jobs in each consumer's thread pool; 'celery' hands each "
                "claimed job to a Celery task run by your Celery workers.",
                id="delayjobs.E013",
            )
        )
    return messages


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _is_number(value: Any) -> bool:
    """An int or a finite float (not a bool, not NaN, not infinite)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


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
