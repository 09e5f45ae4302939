"""Executors: what runs a claimed job once the main loop has claimed it.

The loop never asks which one it has. It calls ``start`` with the executions it claimed,
``hold_off`` before it claims again, ``poll`` on each turn and ``stop`` at shutdown. An
executor is named in settings and on the command line (``EXECUTOR``, ``--executor``) and
found here by dotted path, so that the engine never imports what lives in contrib (Celery).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import ClassVar, Protocol, cast

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from delayjobs.core.db import close_old_connections
from delayjobs.engine.event_loop import EventLoopThread, wait_until_async
from delayjobs.engine.execution import (
    Running,
    opens_apart,
    outcome_receivers,
    run_claimed,
    run_claimed_async,
    signal_outcome,
    wait_until,
)
from delayjobs.engine.inflight import InFlight
from delayjobs.engine.outcome_log import log_outcome_of
from delayjobs.engine.recorder import Recorder
from delayjobs.engine.workers import WorkerThreads
from delayjobs.jobtypes import JobType, registry
from delayjobs.transitions import Outcome

logger = logging.getLogger("delayjobs.consumer")

#: Each executor's name (``conf.EXECUTORS``) and where its class lives.
EXECUTOR_PATHS = {
    "local": "delayjobs.engine.executors.LocalExecutor",
    "celery": "delayjobs.contrib.celery.executor.CeleryExecutor",
}


class Executor(Protocol):
    """Runs claimed jobs; all the consumer knows of an executor. A new kind (async, say)
    implements these and gets a name in EXECUTOR_PATHS; it need not use threads."""

    name: ClassVar[str]

    def __init__(
        self, *, inflight: InFlight, recorder: Recorder, worker_id: str, concurrency: int
    ) -> None: ...

    @classmethod
    def prepare(cls, option: str | None) -> None:
        """Check what the executor needs before anything is claimed (``--celery-app``)."""

    def start(self, runnings: list[Running]) -> None:
        """Run these (claimed, registered in flight, in start order)."""

    def hold_off(self) -> float:
        """Seconds before jobs may be claimed again (0: go ahead)."""

    def poll(self) -> float | None:
        """Periodic bookkeeping on the main loop; seconds until it is due again, if ever."""

    def stop(self) -> None:
        """Let the threads exit once idle (threads stuck in a job are left behind)."""


class ThreadedExecutor:
    """Runs each execution in one of ``concurrency`` threads of this process: the thread
    takes it, waits for its run_at, ``_run``s it, and gives its slot back."""

    name: ClassVar[str]

    @classmethod
    def prepare(cls, option: str | None) -> None:
        """Check what this executor needs before anything is claimed; ``option`` is
        ``--celery-app``, for the executors that publish to Celery."""

    def __init__(
        self, *, inflight: InFlight, recorder: Recorder, worker_id: str, concurrency: int
    ) -> None:
        self.worker_id = worker_id
        self._workers = WorkerThreads(concurrency, name="delayjobs-worker")
        # Bound once: these run for every job, on the hot path.
        self._submit = self._workers.submit
        self._begin = inflight.begin
        self._finish = inflight.finish
        self._release = inflight.release
        self._put = recorder.put
        self.inflight = inflight
        self.recorder = recorder

    def start(self, runnings: list[Running]) -> None:
        execute = self._execute
        for running in runnings:
            self._submit(execute, running)

    def hold_off(self) -> float:
        return 0.0

    def poll(self) -> float | None:
        return None

    def stop(self) -> None:
        self._workers.stop()

    def _execute(self, running: Running) -> None:
        """Run one claimed job in a worker thread (its outcome goes to the recorder)."""
        timed_out = False
        try:
            timed_out = self._begin(running)
            if timed_out:  # before it even started: its time-out is recorded, do not run it
                return
            wait_until(running.due)  # claimed up to CLAIM_AHEAD early: never early
            timed_out = self._run(running, time.monotonic())
        finally:
            self._release(running, timed_out)

    def _run(self, running: Running, began: float) -> bool:
        """Run ``running`` (due now, its clock started); whether it timed out meanwhile."""
        raise NotImplementedError


class LocalExecutor(ThreadedExecutor):
    """Runs jobs in this process: ``JobType.execute`` right here, in a worker thread, or,
    for an ``async def execute``, as a task on the consumer's event loop (``event_loop``).

    Both paths take the same steps in the same order (begin, wait for run_at, the
    attempt, finish, signals, recorder, release); only the body's call differs. An async
    job holds its slot until its task ends, so per-queue and per-type limits (enforced
    when jobs are claimed) and ``--concurrency`` count it like a thread.
    """

    name = "local"

    def __init__(
        self, *, inflight: InFlight, recorder: Recorder, worker_id: str, concurrency: int
    ) -> None:
        super().__init__(
            inflight=inflight, recorder=recorder, worker_id=worker_id, concurrency=concurrency
        )
        self._loop = EventLoopThread(self._execute_async, name="delayjobs-event-loop")

    @classmethod
    def prepare(cls, option: str | None) -> None:
        if option is not None:
            raise ImproperlyConfigured(
                "--celery-app is for the Celery executor: add --executor celery."
            )

    def start(self, runnings: list[Running]) -> None:
        is_async = registry.is_async
        on_loop = [running for running in runnings if is_async(running.job.job_type)]
        if not on_loop:
            super().start(runnings)
            return
        super().start([running for running in runnings if not is_async(running.job.job_type)])
        self._loop.run(on_loop)  # one wake-up of the loop for the whole batch

    def stop(self) -> None:
        super().stop()
        self._loop.stop()

    def _run(self, running: Running, began: float) -> bool:
        outcome = run_claimed(running.job, self.worker_id, log=False)
        timed_out = self._finish(running, time.monotonic() - began)
        if timed_out:
            self._log_ignored(outcome)
        else:
            self._report(outcome)
        return timed_out

    async def _execute_async(self, running: Running) -> None:
        """``_execute`` for an async job, as a task on the event loop."""
        timed_out = False
        report_apart = False
        settled = True  # whether timed_out says how it ended (else: cancelled midway)
        try:
            timed_out = self._begin(running)
            if timed_out:
                return
            settled = False
            # Its stack is its task's, not the loop thread's (which runs every async job).
            running.thread_id = None
            await wait_until_async(running.due)
            began = time.monotonic()
            job = running.job
            opener = self._open_in_thread if opens_apart(job) else None
            outcome = await run_claimed_async(job, self.worker_id, opener, log=False)
            timed_out = self._finish(running, time.monotonic() - began)
            settled = True
            if timed_out:
                self._log_ignored(outcome)
            elif outcome_receivers():  # the common case has none: stay on the loop
                # Signal receivers are sync code (the ORM, say): never on the loop.
                report_apart = True
                self._submit(self._report_and_release, (running, outcome))
            else:
                self._report(outcome)
        finally:
            if not settled:
                # Cancelled before its outcome (timed out while waiting for its run_at or
                # its should_run, or the consumer stopped): whether it was timed out
                # decides which of InFlight's lists its slot is given back from.
                timed_out = self.inflight.abandon(running)
            if not report_apart:
                self._release(running, timed_out)

    def _report_and_release(self, item: tuple[Running, Outcome]) -> None:
        running, outcome = item
        try:
            self._report(outcome)
        finally:
            self._release(running, False)

    def _report(self, outcome: Outcome) -> None:
        # Past the time-out's reach now (finished is set): a slow receiver cannot
        # turn this outcome into a time-out, and a timed-out one sends nothing here.
        signal_outcome(outcome)
        # Handed over before the slot is freed, so that an idle consumer is never
        # one with an outcome still unrecorded. The recorder logs its line, with the
        # others of its batch: no logging work on the threads that run jobs.
        self._put(outcome, log=True)

    def _open_in_thread(
        self, open_attempt: Callable[[], JobType | None]
    ) -> Awaitable[JobType | None]:
        """Run ``Attempt.open`` (``should_run``, ``job_started`` receivers: sync user code)
        in a worker thread; the loop awaits its value meanwhile."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[JobType | None] = loop.create_future()

        def call(_: object) -> None:
            try:
                # A worker thread's job queries get request semantics, as in run_claimed.
                close_old_connections()
                value = open_attempt()
                close_old_connections()
            except BaseException as exc:  # Attempt.open never raises; a bug must not hang
                loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, value, None)

        self._submit(call, None)
        return future

    def _log_ignored(self, outcome: Outcome) -> None:
        log_outcome_of(outcome)
        job = outcome.job
        logger.warning(
            "Job %s %s attempt %d returned after it had timed out; its outcome (%s) "
            "is ignored [trace %s]",
            job.pk,
            job.job_type,
            job.attempts,
            outcome.error or "success",
            job.trace_id,
        )


def _settle(
    future: asyncio.Future[JobType | None], value: JobType | None, exc: BaseException | None
) -> None:
    if future.cancelled():  # its task was cancelled (timed out) meanwhile
        return
    if exc is None:
        future.set_result(value)
    else:
        future.set_exception(exc)


#: What an executor class must offer (the methods of ``Executor``).
EXECUTOR_METHODS = ("prepare", "start", "hold_off", "poll", "stop")


def executor_class(name: str) -> type[Executor]:
    """The class of the executor called ``name`` (a key of EXECUTOR_PATHS)."""
    found = import_string(EXECUTOR_PATHS[name])
    if not (
        isinstance(found, type)
        and all(callable(getattr(found, method, None)) for method in EXECUTOR_METHODS)
    ):
        raise ImproperlyConfigured(f"{EXECUTOR_PATHS[name]} is not an executor class.")
    return cast("type[Executor]", found)
