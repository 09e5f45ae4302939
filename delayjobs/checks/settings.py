"""The checks of the other DELAYJOBS settings: durations, sizes, limits, the executor."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django.core import checks

from delayjobs.conf import (
    DEFAULTS,
    DURATION_SETTINGS,
    EXECUTORS,
    MAX_CLAIM_AHEAD,
    MAX_PAYLOAD_DEPTH_LIMIT,
    MAX_SCHEDULE_AHEAD_LIMIT,
    as_timedelta,
)
from delayjobs.jobtypes import QUEUE_PATTERN

#: Upper bounds, far above any sensible value and far below what breaks: a duration is
#: added to now() and slept on (threading's TIMEOUT_MAX is about 292 years), a timeout is
#: given to socket.settimeout(), and each unit of concurrency is a thread.
MAX_DURATION = timedelta(days=365)
MAX_TIMEOUT_SECONDS = 24 * 3600
MAX_CONCURRENCY = 1000


def _duration_within(
    config: dict[str, Any], name: str, most: timedelta, *, zero: bool = False
) -> tuple[Any, bool]:
    """The setting as given, and whether it is a duration above 0 (or 0 itself, with
    ``zero``) and at most ``most``."""
    raw = config.get(name, DEFAULTS[name])
    value = as_timedelta(raw)
    if value is None:
        return raw, False
    above_least = value >= timedelta(0) if zero else value > timedelta(0)
    return raw, above_least and value <= most


def check_ahead(config: dict[str, Any]) -> list[checks.CheckMessage]:
    """How far ahead a consumer claims (CLAIM_AHEAD) and a job may be scheduled
    (MAX_SCHEDULE_AHEAD): durations with a bound each."""
    messages: list[checks.CheckMessage] = []
    raw, valid = _duration_within(config, "CLAIM_AHEAD", MAX_CLAIM_AHEAD, zero=True)
    if not valid:
        messages.append(
            checks.Error(
                f"DELAYJOBS['CLAIM_AHEAD'] must be 0 to {MAX_CLAIM_AHEAD.total_seconds():g} "
                f"seconds (a number or a timedelta); got {raw!r}.",
                hint="The default, 0.02 (20 ms), hides the claim's round trips; 0 claims a "
                "job only once it is due.",
                id="delayjobs.E014",
            )
        )
    raw, valid = _duration_within(config, "MAX_SCHEDULE_AHEAD", MAX_SCHEDULE_AHEAD_LIMIT)
    if not valid:
        messages.append(
            checks.Error(
                f"DELAYJOBS['MAX_SCHEDULE_AHEAD'] must be a positive number of seconds or a "
                f"positive timedelta, at most {MAX_SCHEDULE_AHEAD_LIMIT.days} days; "
                f"got {raw!r}.",
                hint="The default, timedelta(days=36525), lets jobs be scheduled up to 100 "
                "years ahead.",
                id="delayjobs.E015",
            )
        )
    return messages


def check_payload_depth(config: dict[str, Any]) -> list[checks.CheckMessage]:
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


def check_durations(config: dict[str, Any]) -> list[checks.CheckMessage]:
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


def check_scalars(config: dict[str, Any]) -> list[checks.CheckMessage]:
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
    estimate_above = config.get("ADMIN_ESTIMATE_ABOVE", DEFAULTS["ADMIN_ESTIMATE_ABOVE"])
    if (
        not isinstance(estimate_above, int)
        or isinstance(estimate_above, bool)
        or estimate_above < 0
    ):
        messages.append(
            checks.Error(
                f"DELAYJOBS['ADMIN_ESTIMATE_ABOVE'] must be a whole number of rows, 0 or more, "
                f"got {estimate_above!r}.",
                hint=f"The default is {DEFAULTS['ADMIN_ESTIMATE_ABOVE']}; 0 always counts exactly.",
                id="delayjobs.E018",
            )
        )
    return messages


def check_limits(config: dict[str, Any]) -> list[checks.CheckMessage]:
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
