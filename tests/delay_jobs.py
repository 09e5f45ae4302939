"""Job types of the test suite, autodiscovered like any app's ``delay_jobs`` module."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

from django.utils import timezone

import delayjobs
from delayjobs.models import DelayedJob
from tests.models import Execution


class ScriptedFailure(RuntimeError):
    """Raised on purpose by ``tests.scripted``."""


@delayjobs.register
class Scripted(delayjobs.JobType):
    """Records every execution in the ledger, then does what the payload scripts.

    Payload keys (all optional):
    - ``fail_attempts``: attempt numbers that raise ``ScriptedFailure``;
    - ``hold_attempts``: attempt numbers that hold until the file ``release_file`` exists
      (at most ``hold_seconds``, default 60), standing in for a long job.
    """

    name = "tests.scripted"
    # Open to every API key: the HTTP API's tests schedule it (job types are private unless
    # they say so).
    public = True
    max_attempts = 3
    # A short lease so that a killed consumer's job comes back within seconds.
    time_to_run = timedelta(seconds=2)
    retry_backoff_base = timedelta(milliseconds=50)
    retry_backoff_cap = timedelta(milliseconds=200)

    def execute(self, job: DelayedJob) -> None:
        Execution.objects.create(job_id=job.pk, attempt=job.attempts, worker_id=job.worker_id)
        payload = job.payload if isinstance(job.payload, dict) else {}
        if job.attempts in payload.get("hold_attempts", ()):
            release = Path(payload["release_file"])
            deadline = time.monotonic() + payload.get("hold_seconds", 60)
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        if job.attempts in payload.get("fail_attempts", ()):
            raise ScriptedFailure(f"scripted failure of job {job.pk} on attempt {job.attempts}")


@delayjobs.register
class Noop(delayjobs.JobType):
    """Does nothing; for API tests that never run the job."""

    name = "tests.noop"
    queue = "other"
    public = True

    def execute(self, job: DelayedJob) -> None:
        return None


@delayjobs.register
class NulError(delayjobs.JobType):
    """Fails with a NUL character in its message, which PostgreSQL text cannot store."""

    name = "tests.nul_error"
    max_attempts = 1

    def execute(self, job: DelayedJob) -> None:
        raise ValueError("bad byte \x00 in input")


@delayjobs.register
class Limited(Scripted):
    """``tests.scripted`` with a limit of its own: at most 2 running per consumer, and a
    time_to_run long enough for the tests to hold it."""

    name = "tests.limited"
    concurrency = 2
    # Held on purpose by the tests of limits, which must not time out meanwhile.
    time_to_run = timedelta(seconds=60)


@delayjobs.register
class Counted(Scripted):
    """``tests.scripted`` with a lease no busy machine outlasts, for the tests that count
    each job's executions exactly: with tests.scripted's 2 s, a consumer starved on a loaded
    machine (a SQLite write lock held meanwhile, say) may see a lease expire and the job run
    again, as the lease rules allow, which those tests would take for a double run."""

    name = "tests.counted"
    time_to_run = timedelta(seconds=60)


@delayjobs.register
class Brokered(Scripted):
    """``tests.scripted`` with attempts to spare, for the Celery broker's outage: a task lost
    with the broker, or not taken over within its time_to_run (the Celery worker still
    reconnecting), costs an attempt each time, and the test allows any number of those."""

    name = "tests.brokered"
    max_attempts = 10


@delayjobs.register
class SlowQueue(Scripted):
    """``tests.scripted`` on the queue "slow", which tests limit with QUEUE_CONCURRENCY, and
    a time_to_run long enough for the tests to hold it."""

    name = "tests.slow_queue"
    queue = "slow"
    time_to_run = timedelta(seconds=60)


class StrFails(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be described")


#: What ``tests.raises`` raises, by the payload's "raise": BaseException subclasses that
#: would end a careless consumer, and an exception whose str() itself fails.
RAISES: dict[str, type[BaseException]] = {
    "SystemExit": SystemExit,
    "KeyboardInterrupt": KeyboardInterrupt,
    "GeneratorExit": GeneratorExit,
    "StrFails": StrFails,
}


@delayjobs.register
class Raises(delayjobs.JobType):
    """Records its execution, then raises ``RAISES[payload["raise"]]`` on every attempt."""

    name = "tests.raises"
    max_attempts = 2
    retry_backoff_base = timedelta(milliseconds=50)
    retry_backoff_cap = timedelta(milliseconds=100)

    def execute(self, job: DelayedJob) -> None:
        Execution.objects.create(job_id=job.pk, attempt=job.attempts, worker_id=job.worker_id)
        raise RAISES[job.payload["raise"]]()


@delayjobs.register
class Conditional(delayjobs.JobType):
    """Runs only while its payload lets it: ``should_run`` returns ``payload["run"]``
    (default True) or raises if ``payload["should_run_raises"]``; ``execute`` records its
    execution and returns ``payload["returns"]``, or an unstorable object if
    ``payload["unstorable"]``."""

    name = "tests.conditional"
    max_attempts = 2
    retry_backoff_base = timedelta(milliseconds=50)
    retry_backoff_cap = timedelta(milliseconds=100)

    def should_run(self, job: DelayedJob) -> bool:
        if job.payload.get("should_run_raises"):
            raise RuntimeError("should_run exploded")
        return bool(job.payload.get("run", True))

    def execute(self, job: DelayedJob) -> object:
        Execution.objects.create(job_id=job.pk, attempt=job.attempts, worker_id=job.worker_id)
        if job.payload.get("unstorable"):
            return {"when": timezone.now()}  # a datetime: not JSON
        return job.payload.get("returns")


@delayjobs.register
class Expiring(Conditional):
    """``tests.conditional`` that is pointless a minute late (a job type's max_lateness)."""

    name = "tests.expiring"
    max_lateness = timedelta(minutes=1)


# The fault suite's job type (tests/faults/jobs.py), found by the same autodiscovery.
import tests.faults.jobs  # noqa: E402, F401


# Async job types (tests/integration/test_async_jobs.py, tests/e2e/test_async_consumer.py).
@delayjobs.register
class AsyncScripted(Scripted):
    """``tests.scripted`` with an ``async def execute``: the same policy and payload keys,
    its ledger row written through the async ORM, its holds awaited (the loop runs on).
    Returns the name of the thread it ran on (the consumer's event loop, or not)."""

    name = "tests.async_scripted"

    async def execute(self, job: DelayedJob) -> str:  # type: ignore[override]
        import asyncio  # here: this block only appends to the module
        import threading

        await Execution.objects.acreate(
            job_id=job.pk, attempt=job.attempts, worker_id=job.worker_id
        )
        payload = job.payload if isinstance(job.payload, dict) else {}
        if job.attempts in payload.get("hold_attempts", ()):
            release = Path(payload["release_file"])
            deadline = time.monotonic() + payload.get("hold_seconds", 60)
            while not release.exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        if job.attempts in payload.get("fail_attempts", ()):
            raise ScriptedFailure(f"scripted failure of job {job.pk} on attempt {job.attempts}")
        return threading.current_thread().name


@delayjobs.register
class AsyncHeld(AsyncScripted):
    """``tests.async_scripted`` with a time to run of 15 minutes: jobs held until a test
    releases them, which must not time out (2 s) while a loaded machine starts the rest."""

    name = "tests.async_held"
    time_to_run = timedelta(minutes=15)


# Job types with fleet-wide limits, in consumer processes the limits tests start (see
# tests/limit_jobs.py for why not always).
if os.environ.get("DELAYJOBS_TEST_LIMITS"):
    from tests.limit_jobs import register_all

    register_all()


# Traced job types (tests/integration/test_tracing.py): the body opens a span of its own,
# which must be a child of the attempt's span. OpenTelemetry is imported in the body only:
# a test runs the suite's job types with opentelemetry-api hidden.
@delayjobs.register
class Traced(Scripted):
    """``tests.scripted`` inside a span ``tests.inside``."""

    name = "tests.traced"

    def execute(self, job: DelayedJob) -> None:
        from opentelemetry import trace

        with trace.get_tracer("tests").start_as_current_span("tests.inside"):
            super().execute(job)


@delayjobs.register
class AsyncTraced(AsyncScripted):
    """``tests.async_scripted`` inside a span ``tests.inside``."""

    name = "tests.async_traced"

    async def execute(self, job: DelayedJob) -> str:  # type: ignore[override]
        from opentelemetry import trace

        with trace.get_tracer("tests").start_as_current_span("tests.inside"):
            return await super().execute(job)
