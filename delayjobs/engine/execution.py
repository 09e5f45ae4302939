"""One execution of a job as a consumer tracks it, and how its end is reported."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections
from django.dispatch import Signal

from delayjobs import signals
from delayjobs.core import clock, metrics, tracing
from delayjobs.core.db import close_old_connections
from delayjobs.core.logfields import job_fields
from delayjobs.engine.outcome_log import log_outcome
from delayjobs.exceptions import InvalidJob, UnknownJobType, UnstorableResult
from delayjobs.jobtypes import MAX_RETRY_DELAY, JobType, registry
from delayjobs.models import DelayedJob
from delayjobs.payload import storable_json
from delayjobs.recurring.definitions import schedule_name_of
from delayjobs.recurring.ticks import runs_though_late
from delayjobs.transitions import Outcome

# The consumer's logger: these lines are what an operator follows a consumer by, whether
# the job ran in its thread pool or in a Celery worker.
logger = logging.getLogger("delayjobs.consumer")

#: Whose retry policy applies to a job of a type this process does not know.
_FALLBACK_JOB_TYPE = JobType()

#: A due job whose row was locked by a caller's open transaction is tried again after this;
#: so is a due job whose job type had no free slot.
LOCKED_RETRY = timedelta(milliseconds=50)


#: A timed wait wakes up to about a millisecond late (more on a busy machine); the last
#: stretch before a job's run_at is spun instead, so that it starts within microseconds.
SPIN = 0.0005
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(eq=False)
class Running:
    """One execution this consumer claimed, until its thread returns.

    A job may be claimed shortly before its run_at (``CLAIM_AHEAD``): its thread then
    waits for that moment before it starts it.
    """

    job: DelayedJob
    #: time.monotonic() past which it is timed out: time_to_run after its thread started
    #: it. None while it waits for a thread (claims take several jobs per idle thread):
    #: waiting is not running, and must not cost it its time_to_run.
    deadline: float | None = None
    #: When its thread started it (after waiting for its run_at), for a time-out's row.
    began_at: datetime | None = None
    thread_id: int | None = None
    finished: bool = False  # its thread returned; the outcome is being handed over
    timed_out: bool = False  # recorded as timed out; whatever it returns is ignored
    handed_over: bool = False  # published to Celery: its slot is freed once taken over
    #: For an async job, a task on the event loop: asks it to stop (from any thread), and
    #: says where it waits. None for a job in a thread, which cannot be stopped.
    cancel: Callable[[], None] | None = None
    stack: Callable[[], str] | None = None

    @functools.cached_property
    def due(self) -> int:
        """``due_ns(job)``, computed once: the claim sorts by it, the thread waits for it."""
        return due_ns(self.job)


def due_ns(job: DelayedJob) -> int:
    """``job.run_at`` in nanoseconds since the epoch, exactly (no float rounding)."""
    return (job.run_at - _EPOCH) // _MICROSECOND * 1000


def wait_until(moment_ns: int) -> None:
    """Return at ``moment_ns`` (``clock.time_ns()``), never before: sleep, then spin.

    The spin checks the very clock ``clock.now()`` reads, so a job started after this
    returns has started at or after its run_at, to the microsecond.
    """
    remaining = (moment_ns - clock.time_ns()) / 1e9 - SPIN
    if remaining > 0:
        time.sleep(remaining)
    while clock.time_ns() < moment_ns:
        pass


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


def _send(signal: Signal, job: DelayedJob, **kwargs: Any) -> None:
    """``signals.send``, skipped at once for a signal nobody connected (the common case:
    Django's own check of the receivers costs more, several times per job)."""
    if signal.receivers:
        signals.send(signal, job, **kwargs)


def signal_outcome(outcome: Outcome) -> None:
    """The signal that says how the attempt ended (and the metrics that count it)."""
    if metrics.ENABLED:  # nothing to compute without prometheus_client
        duration = (outcome.finished_at - outcome.started_at).total_seconds()
        metrics.job_finished(outcome.job.job_type, outcome.attempt_outcome.value, duration)
    job = outcome.job
    if outcome.expired:
        _send(signals.job_expired, job, lateness=outcome.started_at - job.run_at)
    elif outcome.skipped:
        _send(signals.job_skipped, job)
    elif outcome.succeeded:
        _send(signals.job_succeeded, job, duration=outcome.finished_at - outcome.started_at)
    elif outcome.retry_at is not None:
        _send(signals.job_retrying, job, error=outcome.error, retry_at=outcome.retry_at)
    else:
        _send(signals.job_failed, job, error=outcome.error, traceback=outcome.traceback)


#: The signals sent when an attempt ends (``signal_outcome``).
_OUTCOME_SIGNALS = (
    signals.job_expired,
    signals.job_skipped,
    signals.job_succeeded,
    signals.job_retrying,
    signals.job_failed,
)


def outcome_receivers() -> bool:
    """Whether any receiver listens to an attempt's end (sync code, kept off the loop)."""
    # ``receivers`` first: an empty list is the common case, and costs nothing to ask.
    return any(signal.receivers and signal.has_listeners(DelayedJob) for signal in _OUTCOME_SIGNALS)


def opens_apart(job: DelayedJob) -> bool:
    """Whether an async job's ``Attempt.open`` runs sync code, and so belongs in a worker
    thread: its type's own ``should_run``, ``job_started`` receivers, a tick's misfire."""
    try:
        jobtype = registry.get(job.job_type)
    except UnknownJobType:
        return False
    started = signals.job_started
    return (
        type(jobtype).should_run is not JobType.should_run
        or bool(started.receivers and started.has_listeners(DelayedJob))
        # A tick's job may read its schedule's row (runs_though_late): sync ORM.
        or schedule_name_of(job.key) is not None
    )


def run_claimed(
    job: DelayedJob,
    worker_id: str,
    *,
    log: bool = True,
    trace_carrier: Mapping[str, Any] | None = None,
) -> Outcome:
    """Execute one claimed job in this thread and say how it ended; never raises.

    An async job type's body runs to its end here too, on an event loop of this thread's
    own (a Celery worker, a test): the consumer's local executor awaits it on its event
    loop instead (``run_claimed_async``). The steps around the body are ``Attempt``'s.
    ``log``: log the line that says how it ended (else the caller does: the consumer's
    recorder logs the lines of a batch, off the threads that run jobs).
    ``trace_carrier``: the trace context a Celery task's headers carried (else the row's).
    """
    attempt = Attempt(job, worker_id, log=log, trace_carrier=trace_carrier)
    jobtype = attempt.open()
    if jobtype is None:
        return attempt.outcome()
    try:
        # The attempt's span is current while the body runs (an async body too: asgiref
        # copies this context to the loop it runs on), so the body's spans are its children.
        with attempt.traced():
            value = jobtype.execute(job)
            if inspect.isawaitable(value):
                value = async_to_sync(_awaited)(value)
    except BaseException as exc:  # a job's SystemExit must not end the consumer
        return attempt.close(error=exc)
    return attempt.close(value)


async def run_claimed_async(
    job: DelayedJob,
    worker_id: str,
    opener: Opener | None = None,
    *,
    log: bool = True,
) -> Outcome:
    """``run_claimed`` for an async job type, on the running event loop: the same steps,
    with the body awaited. ``opener`` runs ``Attempt.open`` (user code: ``should_run``,
    ``job_started`` receivers) elsewhere, in a thread, when it must not run on the loop."""
    # No connection handling on the loop's thread: it has none (the sync ORM refuses to
    # run there), and asking costs a fifth of an async job's time in asgiref's locals.
    attempt = Attempt(job, worker_id, connections=False, log=log)
    try:
        jobtype = attempt.open() if opener is None else await opener(attempt.open)
    except asyncio.CancelledError:
        attempt.abandoned = True
        raise
    if jobtype is None:
        return attempt.outcome()
    try:
        with attempt.traced():  # this task's own context: the span is current in the body
            value = await jobtype.execute(job)
    except BaseException as exc:  # its cancellation too: see the local executor
        return attempt.close(error=exc)
    return attempt.close(value)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


#: Runs a function elsewhere (in a worker thread) and awaits its value.
Opener = Callable[[Callable[[], "JobType | None"]], Awaitable["JobType | None"]]


class Attempt:
    """One execution of a claimed job, around its body: ``open`` asks the questions before
    it (the job type for the body, or None: no body to run), ``close`` decides the outcome
    from what the body returned or raised. Sync and async bodies share every step."""

    def __init__(
        self,
        job: DelayedJob,
        worker_id: str,
        *,
        connections: bool = True,
        log: bool = True,
        trace_carrier: Mapping[str, Any] | None = None,
    ) -> None:
        self._steps = _attempt(job, worker_id, connections, log, self)
        self._outcome: Outcome | None = None
        self.trace_carrier = trace_carrier
        # What the limited claim found this job held for (None: no fleet-wide limit).
        wait = job.limit_wait
        self.limit_wait_ms = None if wait is None else wait.total_seconds() * 1000
        #: Its CONSUMER span (None: tracing is off), made by ``open``, ended with its outcome.
        self.span: tracing.Processing | None = None
        #: Left without an end (its task cancelled while ``open`` ran elsewhere): when the
        #: garbage collector closes its steps, there is nothing to decide or log.
        self.abandoned = False

    def open(self) -> JobType | None:
        try:
            return next(self._steps)
        except StopIteration as stop:
            self._outcome = stop.value
            return None

    def close(self, value: Any = None, *, error: BaseException | None = None) -> Outcome:
        try:
            if error is None:
                self._steps.send(value)
            else:
                self._steps.throw(error)
        except StopIteration as stop:
            self._outcome = stop.value
        return self.outcome()

    def outcome(self) -> Outcome:
        assert self._outcome is not None, "the attempt has not ended"
        return self._outcome

    def traced(self) -> contextlib.AbstractContextManager[None]:
        """Makes its span the current one, around its body."""
        return contextlib.nullcontext() if self.span is None else self.span.current()


def _attempt(
    job: DelayedJob, worker_id: str, connections: bool, log: bool, attempt: Attempt
) -> Generator[JobType, Any, Outcome]:
    """The steps of one attempt; yields the job type when its body is to run, and is sent
    the body's value (or thrown its exception). Never raises.

    The order of the checks is the order of the questions: too late to matter
    (``expired``), no longer wanted (``skipped``), then the work itself. The caller
    records the outcome; this only decides it.
    """
    error = tb = ""
    retry_at = None
    result: Any = None
    skipped = expired = False
    failure: BaseException | None = None
    # The job's own queries get request semantics: CONN_MAX_AGE applies around each job.
    if connections:
        close_old_connections()
    started = clock.now()
    span = attempt.span = tracing.processing(
        job,
        worker_id,
        lateness_ms=(started - job.run_at).total_seconds() * 1000,
        schedule=schedule_name_of(job.key),
        carrier=attempt.trace_carrier,
        limit_wait_ms=attempt.limit_wait_ms,
    )
    if span is not None:
        tracing.attach(job, span)
    try:
        jobtype = registry.get(job.job_type)
        if _too_late(job, jobtype, started):
            expired = True
        elif not jobtype.should_run(job):
            skipped = True
        else:
            _send(signals.job_started, job)
            metrics.job_started(job, (started - job.run_at).total_seconds())
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "Job %s %s attempt %d started [trace %s]",
                    job.pk,
                    job.job_type,
                    job.attempts,
                    job.trace_id,
                    extra=job_fields(job, "started", started=started),
                )
            result = _storable_result((yield jobtype))
    except UnstorableResult as exc:
        # The work is done, its side effects happened: running it again would repeat them.
        error = describe(exc)
        tb = storable(traceback.format_exc())
        failure = exc
    except BaseException as exc:  # a job's SystemExit must not end the consumer
        if attempt.abandoned and isinstance(exc, GeneratorExit):
            if span is not None:
                span.finish(None)  # timed out or stopped before its body: no outcome here
            raise  # closed unended (see Attempt.abandoned): no outcome, no log line
        retry_at = retry_at_after(job, exc)  # first: it may add a note to the traceback
        error = describe(exc)
        tb = storable(traceback.format_exc())
        failure = exc
    finished = clock.now()
    if log:
        log_outcome(job, started, finished, error, retry_at, skipped=skipped, expired=expired)
    if connections:
        close_old_connections()
    outcome = Outcome(
        job=job,
        worker_id=worker_id,
        started_at=started,
        finished_at=finished,
        error=error,
        traceback=tb,
        retry_at=retry_at,
        result=result,
        skipped=skipped,
        expired=expired,
    )
    if span is not None:
        span.finish(outcome.attempt_outcome.value, failure)
    return outcome


def max_lateness_of(job: DelayedJob, jobtype: JobType) -> timedelta | None:
    return job.max_lateness if job.max_lateness is not None else jobtype.max_lateness


def _too_late(job: DelayedJob, jobtype: JobType, now: datetime) -> bool:
    limit = max_lateness_of(job, jobtype)
    if limit is None or now - job.run_at <= limit:
        return False
    # A recurring schedule's missed tick (its max_lateness is the grace) may be the one
    # its misfire policy runs anyway.
    return not runs_though_late(job, jobtype, now)


def _storable_result(value: Any) -> Any:
    if value is None:
        return None
    try:
        return storable_json(value, "The value execute() returned")
    except InvalidJob as exc:
        # Failing the job, rather than dropping the value, tells the author at once.
        raise UnstorableResult(str(exc)) from None


def retry_at_after(job: DelayedJob, exc: BaseException) -> datetime | None:
    """When to run a job again after ``exc``, by its type's policy; None: mark it failed."""
    if job.max_attempts is not None and job.attempts >= job.max_attempts:
        return None
    try:
        jobtype = registry.get(job.job_type)
    except UnknownJobType:
        jobtype = _FALLBACK_JOB_TYPE
    try:
        delay = jobtype.retry_delay(job, exc)
    except BaseException:  # user code, in a worker thread: nothing may escape
        logger.exception("%s.retry_delay() failed; using the default backoff", jobtype.name)
        delay = JobType.retry_delay(jobtype, job, exc)
    if delay is None:
        return None
    if problem := _unusable_retry_delay(delay):
        # The job fails for good, and its history says why: the note ends the traceback.
        note = f"Not retried: {jobtype.name}.retry_delay() returned {problem}."
        logger.error("Job %s: %s", job.pk, note)
        with contextlib.suppress(Exception):  # an exception class may refuse attributes
            exc.add_note(note)
        return None
    return clock.now() + max(delay, timedelta(0))


def _unusable_retry_delay(delay: object) -> str:
    """What is wrong with a retry_delay() value ("" if nothing): not a timedelta, or a wait
    so long that adding it to now overflows, or beyond any sensible retry."""
    if not isinstance(delay, timedelta):
        return f"{delay!r}, not a timedelta or None"
    if delay > MAX_RETRY_DELAY:
        return f"{delay}, more than the {MAX_RETRY_DELAY.days} days a retry may wait"
    return ""
