"""Async job types (``async def execute``): run on the consumer's event loop, with the same
outcomes, retry policy, time-outs, limits and shutdown as sync ones.

The consumers run in this process (a thread each), against the test Redis and database, so
that a job body can report to the test through events and the test can open its gates.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, ClassVar

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

import delayjobs
from delayjobs import transitions
from delayjobs.engine.consumer import Consumer
from delayjobs.engine.execution import run_claimed
from delayjobs.engine.workers import WorkerThreads
from delayjobs.jobtypes import registry, validate_job_type_class
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from tests.consumers import statuses, wait_final
from tests.delay_jobs import AsyncScripted, Scripted
from tests.models import Execution
from tests.utils import wait_for

QUEUE = "async-tests"
EVENT_LOOP_THREAD = "delayjobs-event-loop"

pytestmark = pytest.mark.django_db(transaction=True)


class Gate:
    """Holds async bodies until the test opens it; counts them in and the most at once."""

    def __init__(self, full_at: int) -> None:
        self.full_at = full_at
        self.active = 0
        self.most = 0
        self.entered = 0
        self.full = threading.Event()  # set once ``full_at`` bodies are inside at once
        self.entered_all = threading.Event()
        self._open: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def wait(self) -> None:
        if self._open is None:  # made on the loop that waits on it
            self._open = asyncio.Event()
            self._loop = asyncio.get_running_loop()
        self.active += 1  # only ever on the one event loop thread: no lock needed
        self.entered += 1
        self.most = max(self.most, self.active)
        if self.active >= self.full_at:
            self.full.set()
        try:
            await self._open.wait()
        finally:
            self.active -= 1

    def open(self) -> None:
        assert self._loop is not None and self._open is not None
        self._loop.call_soon_threadsafe(self._open.set)


class Gated(delayjobs.JobType):
    """Waits at the test's gate; at most two at once in one consumer (``concurrency``)."""

    name = "tests.async.gated"
    queue = QUEUE
    concurrency = 2
    gate: ClassVar[Gate]

    async def execute(self, job: DelayedJob) -> str:
        await self.gate.wait()
        return threading.current_thread().name


class Hangs(delayjobs.JobType):
    """Never returns on its own: times out, and its task is cancelled."""

    name = "tests.async.hangs"
    queue = QUEUE
    max_attempts = 1
    time_to_run = timedelta(milliseconds=200)
    cancelled: ClassVar[threading.Event]

    async def execute(self, job: DelayedJob) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


class SyncOnLoop(delayjobs.JobType):
    """A sync type on the same queue as the async ones: runs in a worker thread."""

    name = "tests.async.sync_neighbour"
    queue = QUEUE

    def execute(self, job: DelayedJob) -> str:
        return threading.current_thread().name


class AsyncChecked(delayjobs.JobType):
    """An async type with a sync ``should_run`` that reads the database (in a thread)."""

    name = "tests.async.checked"
    queue = QUEUE

    def should_run(self, job: DelayedJob) -> bool:
        return not Execution.objects.filter(job_id=job.pk).exists()

    async def execute(self, job: DelayedJob) -> int:
        row = await DelayedJob.objects.aget(pk=job.pk)
        return row.attempts


class SlowCheck(delayjobs.JobType):
    """An async type whose sync ``should_run`` (in a worker thread) outlasts its time."""

    name = "tests.async.slow_check"
    queue = QUEUE
    max_attempts = 1
    time_to_run = timedelta(milliseconds=200)
    checking: ClassVar[threading.Event]
    answer: ClassVar[threading.Event]

    def should_run(self, job: DelayedJob) -> bool:
        self.checking.set()
        self.answer.wait(30)
        return True

    async def execute(self, job: DelayedJob) -> None:
        raise AssertionError("never reached: timed out during should_run")


LOCAL_TYPES = (Gated, Hangs, SyncOnLoop, AsyncChecked, SlowCheck)


@pytest.fixture(autouse=True)
def job_types(redis_client: redis.Redis) -> Iterator[None]:
    Gated.gate = Gate(full_at=2)
    Hangs.cancelled = threading.Event()
    SlowCheck.checking, SlowCheck.answer = threading.Event(), threading.Event()
    for cls in LOCAL_TYPES:
        delayjobs.register(cls)
    try:
        yield
    finally:
        for cls in LOCAL_TYPES:
            registry.remove(cls.name)


@contextmanager
def consumer_thread(**options: Any) -> Iterator[Consumer]:
    """A consumer running in a thread of this process; stopped (and joined) on exit."""
    consumer = Consumer(queues=[QUEUE, "default"], preload=False, **options)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(consumer.run()), daemon=True)
    thread.start()
    try:
        yield consumer
    finally:
        if not consumer._stopping:
            consumer.request_stop()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the consumer did not stop"
    assert codes == [0]


def history_of(job: DelayedJob) -> list[tuple[int, str]]:
    return list(
        JobAttempt.objects.filter(job=job).order_by("number").values_list("number", "outcome")
    )


def without_pk(error: str) -> str:
    return re.sub(r"of job \d+", "of job N", error)


def test_an_async_job_runs_on_the_event_loop_and_its_value_is_stored() -> None:
    job = delayjobs.schedule(AsyncScripted.name)

    with consumer_thread(concurrency=4):
        wait_final([job.pk])

    job.refresh_from_db()
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, EVENT_LOOP_THREAD)
    assert history_of(job) == [(1, AttemptOutcome.SUCCEEDED)]
    assert list(Execution.objects.values_list("job_id", "attempt")) == [(job.pk, 1)]


def test_an_async_failure_is_retried_by_its_policy_exactly_like_a_sync_one() -> None:
    fails_twice = {"fail_attempts": [1, 2]}
    always = {"fail_attempts": [1, 2, 3]}
    jobs = {
        (kind, script): delayjobs.schedule(kind, payload)
        for kind in (Scripted.name, AsyncScripted.name)
        for script, payload in (("twice", fails_twice), ("always", always))
    }

    with consumer_thread(concurrency=4):
        wait_final([job.pk for job in jobs.values()])

    ended = {key: DelayedJob.objects.get(pk=job.pk) for key, job in jobs.items()}
    for script in ("twice", "always"):
        sync, asynchronous = ended[Scripted.name, script], ended[AsyncScripted.name, script]
        assert history_of(asynchronous) == history_of(sync)
        assert (asynchronous.status, asynchronous.attempts) == (sync.status, sync.attempts)
        assert without_pk(asynchronous.last_error) == without_pk(sync.last_error)
    assert ended[AsyncScripted.name, "twice"].status == JobStatus.SUCCEEDED
    failed = ended[AsyncScripted.name, "always"]
    assert failed.status == JobStatus.FAILED
    assert "ScriptedFailure: scripted failure" in failed.last_error
    # The traceback reaches into the coroutine, where it raised.
    last = JobAttempt.objects.get(job=failed, number=3)
    assert "in execute" in last.traceback and "raise ScriptedFailure" in last.traceback
    assert Execution.objects.filter(job_id=failed.pk).count() == 3


def test_an_async_job_past_its_time_to_run_times_out_and_its_task_is_cancelled() -> None:
    job = delayjobs.schedule(Hangs.name)
    after = delayjobs.schedule(SyncOnLoop.name)

    with consumer_thread(concurrency=4) as consumer:
        wait_final([job.pk, after.pk])
        assert Hangs.cancelled.wait(30), "the timed-out task was never cancelled"
        # Cancelled, it gave its slot back: nothing is stuck.
        wait_for(lambda: not consumer.inflight.stuck_jobs())

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert history_of(job) == [(1, AttemptOutcome.TIMED_OUT)]
    assert "JobTimeout" in job.last_error
    assert DelayedJob.objects.get(pk=after.pk).status == JobStatus.SUCCEEDED


def test_an_async_job_timed_out_in_its_should_run_gives_its_slot_back() -> None:
    job = delayjobs.schedule(SlowCheck.name)

    with consumer_thread(concurrency=4) as consumer:
        assert SlowCheck.checking.wait(30)
        wait_final([job.pk])
        # Its task, cancelled while its should_run ran in a thread, let its slot go.
        wait_for(lambda: not consumer.inflight.stuck_jobs() and not consumer.inflight.count())
        SlowCheck.answer.set()

    assert history_of(job) == [(1, AttemptOutcome.TIMED_OUT)]


def test_a_timed_out_async_job_holding_the_last_slot_does_not_stop_the_consumer() -> None:
    job = delayjobs.schedule(Hangs.name)
    after = delayjobs.schedule(SyncOnLoop.name)

    with consumer_thread(concurrency=1):
        wait_final([job.pk, after.pk], timeout=10)

    assert DelayedJob.objects.get(pk=after.pk).status == JobStatus.SUCCEEDED
    # Where it waited, from its task's stack (not the loop thread's).
    attempt = JobAttempt.objects.get(job=job)
    assert "in execute" in attempt.traceback


def test_sync_and_async_types_run_side_by_side_in_one_consumer() -> None:
    sync = [delayjobs.schedule(SyncOnLoop.name) for _ in range(3)]
    asynchronous = [delayjobs.schedule(AsyncScripted.name) for _ in range(3)]

    with consumer_thread(concurrency=4):
        wait_final([job.pk for job in sync + asynchronous])

    for job in sync:
        job.refresh_from_db()
        assert job.status == JobStatus.SUCCEEDED
        assert job.result.startswith("delayjobs-worker-")
    for job in asynchronous:
        job.refresh_from_db()
        assert (job.status, job.result) == (JobStatus.SUCCEEDED, EVENT_LOOP_THREAD)


def test_a_job_types_concurrency_limits_its_async_jobs_as_it_does_threads() -> None:
    gate = Gated.gate
    jobs = [delayjobs.schedule(Gated.name) for _ in range(5)]

    with consumer_thread(concurrency=50) as consumer:
        assert gate.full.wait(30), "two gated jobs never ran at once"
        # The limit holds at the claim: the others are not even claimed while two run.
        wait_for(lambda: consumer.inflight.count() == 2)
        assert statuses(job.pk for job in jobs) == {JobStatus.RUNNING: 2, JobStatus.SCHEDULED: 3}
        gate.open()
        wait_final([job.pk for job in jobs])

    assert gate.most == 2
    assert gate.entered == 5
    assert statuses(job.pk for job in jobs) == {JobStatus.SUCCEEDED: 5}


def test_an_async_body_uses_the_async_orm_and_a_sync_should_run_runs_off_the_loop() -> None:
    runs = delayjobs.schedule(AsyncChecked.name)
    skipped = delayjobs.schedule(AsyncChecked.name)
    Execution.objects.create(job_id=skipped.pk, attempt=0, worker_id="test")

    with consumer_thread(concurrency=2):
        wait_final([runs.pk, skipped.pk])

    runs.refresh_from_db()
    assert (runs.status, runs.result) == (JobStatus.SUCCEEDED, 1)
    assert DelayedJob.objects.get(pk=skipped.pk).status == JobStatus.SKIPPED


def test_a_stop_while_async_jobs_run_waits_for_them_and_records_them() -> None:
    gate = Gated.gate
    jobs = [delayjobs.schedule(Gated.name) for _ in range(2)]

    with consumer_thread(concurrency=4) as consumer:
        assert gate.full.wait(30)
        consumer.request_stop()
        # Stopping, it still waits on them: their outcomes are not written yet.
        assert statuses(job.pk for job in jobs) == {JobStatus.RUNNING: 2}
        gate.open()

    assert statuses(job.pk for job in jobs) == {JobStatus.SUCCEEDED: 2}
    assert all(history_of(job) == [(1, AttemptOutcome.SUCCEEDED)] for job in jobs)


def test_run_claimed_runs_an_async_body_to_its_end_outside_the_consumer() -> None:
    """The Celery worker's path (``run_claimed`` in a sync thread) runs async types too."""
    job = delayjobs.schedule(AsyncScripted.name, {"fail_attempts": [1]})
    (row,) = transitions.claim(
        [job.pk],
        worker_id="here",
        now=timezone.now(),
        job_types=registry.names(),
        leases={},
        default_lease=timedelta(minutes=1),
    )

    outcome = run_claimed(row, "here")

    assert outcome.retry_at is not None
    assert "ScriptedFailure" in outcome.error
    assert Execution.objects.filter(job_id=job.pk).count() == 1


class TestRegistration:
    def test_an_async_generator_execute_is_refused(self) -> None:
        class Streams(delayjobs.JobType):
            name = "tests.async.streams"

            async def execute(self, job: DelayedJob) -> AsyncIterator[int]:
                yield 1

        with pytest.raises(ImproperlyConfigured, match=r"execute is a generator function"):
            validate_job_type_class(Streams)

    @pytest.mark.parametrize("method", ["should_run", "retry_delay", "plan", "queues_served"])
    def test_async_hooks_are_refused(self, method: str) -> None:
        async def hook(self: object, *args: object) -> None:
            return None

        cls = type(
            "AsyncHook",
            (delayjobs.JobType,),
            {"name": "tests.async.hook", "execute": lambda self, job: None, method: hook},
        )
        with pytest.raises(ImproperlyConfigured, match=rf"\.{method} must be a plain def"):
            validate_job_type_class(cls)

    def test_the_registry_knows_which_types_are_async(self) -> None:
        assert registry.is_async(AsyncScripted.name)
        assert not registry.is_async(Scripted.name)
        assert not registry.is_async("tests.nobody")


def test_a_celery_worker_runs_an_async_job_to_its_end() -> None:
    pytest.importorskip("celery")
    from delayjobs.contrib.celery.worker import run_dispatched

    job = delayjobs.schedule(AsyncScripted.name)
    (row,) = transitions.claim(
        [job.pk],
        worker_id="consumer-a",
        now=timezone.now(),
        job_types=registry.names(),
        leases={},
        default_lease=timedelta(minutes=1),
    )
    assert row.claimed_at is not None

    claimed_at = row.claimed_at.isoformat()
    assert run_dispatched(row.pk, row.attempts, "consumer-a", claimed_at, "w") == "succeeded"

    row.refresh_from_db()
    assert (row.status, row.worker_id) == (JobStatus.SUCCEEDED, "w")
    assert list(Execution.objects.values_list("job_id", "worker_id")) == [(job.pk, "w")]


def test_worker_threads_start_as_work_needs_them() -> None:
    workers = WorkerThreads(3, name="test-worker")
    release = threading.Event()
    started: list[threading.Event] = [threading.Event() for _ in range(4)]

    def hold(number: int) -> None:
        started[number].set()
        release.wait(30)

    assert workers.started == 0
    workers.submit(hold, 0)
    assert started[0].wait(30) and workers.started == 1
    workers.submit(hold, 1)  # the only thread is busy: a second one starts
    assert started[1].wait(30) and workers.started == 2
    release.set()
    wait_for(lambda: workers.spare == 2)
    done = threading.Event()
    workers.submit(lambda _: done.set(), None)
    assert done.wait(30)
    assert workers.started == 2  # an idle thread took it: none more
    wait_for(lambda: workers.spare == 2)
    release.clear()
    for number in (2, 3):  # three busy at most: the fourth waits for one of them
        workers.submit(hold, number)
    workers.submit(hold, 0)
    wait_for(lambda: started[2].is_set() and started[3].is_set())
    assert workers.started == 3
    release.set()
    workers.stop()
