"""The one backoff function gives, bit for bit, what the two formulas it replaced gave.

The old formulas are kept here verbatim (``JobType.retry_delay`` and
``task_jobs.unregistered_retry_delay`` as of 765889c). Under the same ``random.seed`` the
new function must return the same timedelta and leave the generator in the same state
(one ``random.uniform`` call, with the same bounds). Needs neither a database nor Redis.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import pytest

from delayjobs.core.backoff import MAX_EXPONENT, equal_jitter_backoff
from delayjobs.jobtypes import JobType

#: task_jobs.UNREGISTERED_RETRY_BASE and _CAP as of 765889c.
UNREGISTERED_RETRY_BASE = timedelta(minutes=2)
UNREGISTERED_RETRY_CAP = timedelta(minutes=30)

DAY = 86_400
#: Seconds: 1 µs, 50 ms, 2 s, 2 min, 366 days (the smallest and largest a job type may declare).
BASES = [timedelta(seconds=seconds) for seconds in (1e-6, 0.05, 2, 120, 366 * DAY)]
#: Seconds: 1 µs, 200 ms, 30 min, 1 h, 366 days.
CAPS = [timedelta(seconds=seconds) for seconds in (1e-6, 0.2, 1800, 3600, 366 * DAY)]
ATTEMPTS = range(-1, 201)
Draw = Callable[[], "timedelta | None"]


def old_job_type_retry_delay(attempts: int, base: timedelta, cap: timedelta) -> timedelta:
    """JobType.retry_delay's body, with ``job.attempts`` and the two attributes as arguments."""
    exponent = min(max(attempts - 1, 0), 32)  # bounded so the float never overflows
    ceiling = min(
        base.total_seconds() * 2**exponent,
        cap.total_seconds(),
    )
    # Full jitter spreads a burst of failures so the retries do not land together.
    return timedelta(seconds=random.uniform(ceiling / 2, ceiling))


def old_unregistered_retry_delay(attempt: int) -> timedelta:
    """The wait after ``attempt`` failed because this consumer does not know the task."""
    exponent = min(max(attempt - 1, 0), 16)
    ceiling = min(
        UNREGISTERED_RETRY_BASE.total_seconds() * 2**exponent,
        UNREGISTERED_RETRY_CAP.total_seconds(),
    )
    return timedelta(seconds=random.uniform(ceiling / 2, ceiling))


def assert_same_draws(old: Draw, new: Draw, seed: int) -> None:
    """``old()`` and ``new()`` return the same value from the same seed, and consume the
    generator alike."""
    random.seed(seed)
    expected = old()
    state_after_old = random.getstate()
    random.seed(seed)
    got = new()
    assert got == expected, (seed, got, expected)
    assert random.getstate() == state_after_old


@pytest.mark.parametrize("base", BASES, ids=str)
@pytest.mark.parametrize("cap", CAPS, ids=str)
def test_the_job_types_backoff_is_unchanged(base: timedelta, cap: timedelta) -> None:
    for attempt in ATTEMPTS:
        assert_same_draws(
            partial(old_job_type_retry_delay, attempt, base, cap),
            partial(equal_jitter_backoff, attempt, base=base, cap=cap),
            seed=attempt,
        )


def test_the_unregistered_tasks_backoff_is_unchanged() -> None:
    # The old exponent bound was 16, the new one 32: the ceiling reaches the cap at
    # exponent 4 (120 s * 2**4 > 1,800 s), so every attempt from 5 on gives the cap.
    for attempt in ATTEMPTS:
        assert_same_draws(
            partial(old_unregistered_retry_delay, attempt),
            partial(
                equal_jitter_backoff,
                attempt,
                base=UNREGISTERED_RETRY_BASE,
                cap=UNREGISTERED_RETRY_CAP,
            ),
            seed=attempt,
        )


class Flaky(JobType):
    retry_backoff_base = timedelta(milliseconds=50)
    retry_backoff_cap = timedelta(minutes=30)


class Job:
    """What retry_delay reads of a job: its attempts (no row: no database)."""

    def __init__(self, attempts: int) -> None:
        self.attempts = attempts


def test_job_type_retry_delay_calls_it_with_the_type_s_base_and_cap() -> None:
    for attempt in ATTEMPTS:
        job: Any = Job(attempt)
        assert_same_draws(
            partial(
                old_job_type_retry_delay, attempt, Flaky.retry_backoff_base, Flaky.retry_backoff_cap
            ),
            partial(Flaky().retry_delay, job, RuntimeError()),
            seed=attempt,
        )


def test_the_draw_is_equal_jitter_and_bounded() -> None:
    base, cap = timedelta(seconds=2), timedelta(hours=1)
    for attempt in ATTEMPTS:
        ceiling = min(base * 2 ** min(max(attempt - 1, 0), MAX_EXPONENT), cap)
        delay = equal_jitter_backoff(attempt, base=base, cap=cap)
        assert ceiling / 2 <= delay <= ceiling
