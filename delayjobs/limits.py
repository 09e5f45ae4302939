"""Fleet-wide limits of a job type: ``Rate`` and what makes a declared limit valid.

A job type may declare ``global_concurrency`` (jobs running at once, across every consumer)
and ``rate_limit`` (starts in any sliding window). Both are enforced by the database in the
claim (``delayjobs.transitions.limiter``); here are only the values and their rules, with
no registry and no database, so that ``delayjobs.jobtypes`` can declare and check them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from delayjobs.names import NAME_RULE, is_name

#: A window shorter than this cannot be told apart from the claim's own round trips; one
#: longer than a day keeps a start row per start for a day, which is a table, not a limit.
MIN_RATE_WINDOW = timedelta(milliseconds=10)
MAX_RATE_WINDOW = timedelta(days=1)
#: More starts per window than this are no limit a window table should count row by row.
MAX_RATE_COUNT = 100_000
#: The most jobs a global concurrency may allow at once.
MAX_GLOBAL_CONCURRENCY = 100_000
#: Separates a group's name and a type's key in the stored key; names cannot contain it.
KEY_SEPARATOR = "/"
#: A limit key is stored on the row (group, "/", key): what the column holds.
LIMIT_KEY_MAX_LENGTH = 255


@dataclass(frozen=True)
class Rate:
    """At most ``count`` starts in any window of length ``per``, fleet-wide.

    ``delayjobs.Rate(10, per=timedelta(seconds=1))``: a sliding window, so never more than
    ten starts in any second, wherever that second begins.
    """

    count: int
    per: timedelta

    def __init__(self, count: int, per: timedelta) -> None:
        problem = rate_problem(count, per)
        if problem:
            raise ValueError(problem)
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "per", per)

    def __repr__(self) -> str:
        return f"Rate({self.count}, per={self.per!r})"


def rate_problem(count: Any, per: Any) -> str:
    """What is wrong with ``Rate(count, per=per)``; "" if nothing."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_RATE_COUNT:
        return f"a Rate's count must be an int from 1 to {MAX_RATE_COUNT}; got {count!r}."
    if not isinstance(per, timedelta) or not MIN_RATE_WINDOW <= per <= MAX_RATE_WINDOW:
        return f"a Rate's per must be a timedelta from 10 ms to 1 day; got {per!r}."
    return ""


def global_concurrency_problem(value: Any) -> str:
    """What is wrong with a declared ``global_concurrency``; "" if nothing."""
    if value is None:
        return ""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= MAX_GLOBAL_CONCURRENCY
    ):
        return (
            f"global_concurrency must be an int from 1 to {MAX_GLOBAL_CONCURRENCY}, or None "
            f"(no fleet-wide limit); got {value!r}."
        )
    return ""


def rate_limit_problem(value: Any) -> str:
    """What is wrong with a declared ``rate_limit``; "" if nothing."""
    if value is None or isinstance(value, Rate):
        return ""
    return f"rate_limit must be delayjobs.Rate(N, per=timedelta(...)) or None; got {value!r}."


def limit_group_problem(value: Any) -> str:
    """What is wrong with a declared ``limit_group``; "" if nothing."""
    if value is None or is_name(value):
        return ""
    return f"limit_group must be {NAME_RULE}, or None (the type's own name); got {value!r}."


@dataclass(frozen=True)
class Limits:
    """The limits a group of job types shares: what the claim enforces per limit key."""

    group: str
    global_concurrency: int | None
    rate: Rate | None

    def stored_key(self, key: str | None) -> str:
        """What the row's ``limit_key`` column holds: the group, and the type's key if any.

        The key is free text from ``limit_key()``: it comes after the group's name, whose
        rule (``NAME_RULE``) has no slash, so two (group, key) pairs never share a value.
        """
        return self.group if key is None else f"{self.group}{KEY_SEPARATOR}{key}"


def limit_key_problem(value: Any, room: int) -> str:
    """What is wrong with what ``limit_key(job)`` returned; "" if nothing."""
    if value is None:
        return ""
    if not isinstance(value, str) or not value:
        return f"limit_key(job) must return a non-empty str or None; got {value!r}."
    if len(value) > room:
        return f"limit_key(job) returned {len(value)} characters; at most {room} fit."
    return ""
