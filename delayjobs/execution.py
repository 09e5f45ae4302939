"""One execution of a job as a consumer tracks it, and how its end is reported."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import connections

from delayjobs import signals
from delayjobs.exceptions import UnknownJobType
from delayjobs.jobtypes import JobType, registry
from delayjobs.models import DelayedJob
from delayjobs.transitions import Outcome

#: A due job whose row was locked by a caller's open transaction is tried again after this;
#: so is a due job whose job type had no free slot.
LOCKED_RETRY = timedelta(milliseconds=50)


@dataclass(eq=False)
class Running:
    """One execution this consumer started, until its thread returns."""

    job: DelayedJob
    deadline: float  # time.monotonic() past which it is timed out
    thread_id: int | None = None
    finished: bool = False  # its thread returned; the outcome is being handed over
    timed_out: bool = False  # recorded as timed out; whatever it returns is ignored


def time_to_run_of(job: DelayedJob) -> timedelta:
    try:
        return registry.get(job.job_type).time_to_run
    except UnknownJobType:
        return JobType.time_to_run


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, storable even if its ``__str__`` fails."""
    try:
        message = str(exc)
    except Exception:
        message = "<the exception's str() failed>"
    return storable(f"{type(exc).__name__}: {message}")


def storable(text: str) -> str:
    # NUL cannot be stored in a PostgreSQL text column.
    return text.replace("\x00", "\\x00")


def signal_outcome_apart(outcome: Outcome) -> None:
    """``_signal_outcome`` in a thread of its own, which closes what receivers opened."""
    try:
        signal_outcome(outcome)
    finally:
        connections.close_all()


def signal_outcome(outcome: Outcome) -> None:
    """job_succeeded, job_retrying or job_failed (final), as the attempt ended."""
    job = outcome.job
    if outcome.succeeded:
        signals.send(signals.job_succeeded, job, duration=outcome.finished_at - outcome.started_at)
    elif outcome.retry_at is not None:
        signals.send(signals.job_retrying, job, error=outcome.error, retry_at=outcome.retry_at)
    else:
        signals.send(signals.job_failed, job, error=outcome.error, traceback=outcome.traceback)
