"""Executors: what runs a claimed job once the main loop has claimed it.

The loop never asks which one it has. It calls ``start`` with the executions it claimed,
``hold_off`` before it claims again, ``poll`` on each turn and ``stop`` at shutdown. An
executor is named in settings and on the command line (``EXECUTOR``, ``--executor``) and
found here by dotted path, so that the engine never imports what lives in contrib (Celery).
"""

from __future__ import annotations

import logging
import time
from typing import ClassVar, Protocol, cast

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from delayjobs.engine.execution import Running, due_ns, run_claimed, signal_outcome, wait_until
from delayjobs.engine.inflight import InFlight
from delayjobs.engine.recorder import Recorder
from delayjobs.engine.workers import WorkerThreads

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
            wait_until(due_ns(running.job))  # claimed up to CLAIM_AHEAD early: never early
            timed_out = self._run(running, time.monotonic())
        finally:
            self._release(running, timed_out)

    def _run(self, running: Running, began: float) -> bool:
        """Run ``running`` (due now, its clock started); whether it timed out meanwhile."""
        raise NotImplementedError


class LocalExecutor(ThreadedExecutor):
    """Runs jobs in this process's threads: ``JobType.execute`` right here."""

    name = "local"

    @classmethod
    def prepare(cls, option: str | None) -> None:
        if option is not None:
            raise ImproperlyConfigured(
                "--celery-app is for the Celery executor: add --executor celery."
            )

    def _run(self, running: Running, began: float) -> bool:
        job = running.job
        outcome = run_claimed(job, self.worker_id)
        timed_out = self._finish(running, time.monotonic() - began)
        if timed_out:
            logger.warning(
                "Job %s %s attempt %d returned after it had timed out; its outcome (%s) "
                "is ignored [trace %s]",
                job.pk,
                job.job_type,
                job.attempts,
                outcome.error or "success",
                job.trace_id,
            )
        else:
            # Past the time-out's reach now (finished is set): a slow receiver cannot
            # turn this outcome into a time-out, and a timed-out one sends nothing here.
            signal_outcome(outcome)
            # Handed over before the slot is freed, so that an idle consumer is never
            # one with an outcome still unrecorded.
            self._put(outcome)
        return timed_out


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
