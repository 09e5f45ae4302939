"""Time-outs of a consumer's executions.

A thread cannot be stopped, so an execution past its job type's ``time_to_run`` is
recorded as timed out (with the stack where it is stuck) and retried or failed like any
failure, while its thread keeps its slots until it returns; what it returns then is
ignored. When stuck threads fill every thread, or every slot of a limited queue or job
type, the consumer stops with EXIT_STUCK so that a fresh process takes over.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections import Counter
from types import FrameType

from delayjobs.core import clock, tracing
from delayjobs.core.logfields import job_fields
from delayjobs.engine.execution import (
    Running,
    describe,
    retry_at_after,
    signal_outcome_apart,
    storable,
    time_to_run_of,
)
from delayjobs.engine.inflight import InFlight
from delayjobs.engine.recorder import Recorder
from delayjobs.exceptions import JobTimeout
from delayjobs.transitions import Outcome

logger = logging.getLogger("delayjobs.consumer")

#: Exit code when threads stuck in timed-out jobs fill every thread, or every slot of a
#: limited queue or job type: a supervisor should start a fresh process, the only way to
#: get those threads back.
EXIT_STUCK = 3
#: While draining, how long to wait at most between two looks at the running jobs (a
#: finishing job wakes the drain anyway).
DRAIN_WAIT = 1.0


class TimeOuts:
    """Finds executions past their time_to_run and records them as timed out."""

    def __init__(
        self, *, inflight: InFlight, recorder: Recorder, worker_id: str, concurrency: int
    ) -> None:
        self.inflight = inflight
        self.recorder = recorder
        self.worker_id = worker_id
        self.concurrency = concurrency

    def check(self) -> tuple[float | None, str | None]:
        """Record executions past their time_to_run as timed out: seconds to the next
        deadline, and what threads stuck in timed-out jobs fill for good, if anything.

        A thread cannot be stopped, so a timed-out job keeps its thread and its slots
        until it returns, and nothing it returns counts. The attempt is recorded at once,
        with the stack where it is stuck, and retried or failed like any failure.
        """
        now = time.monotonic()
        expired, next_deadline = self.inflight.expire_overdue(now)
        filled = None
        if expired:
            frames = sys._current_frames()
            for running in expired:
                self._record_time_out(running, frames.get(running.thread_id or -1))
                if running.cancel is not None:  # an async job: its task can be stopped
                    running.cancel()
            filled = self._filled_by_stuck_threads()
        return (None if next_deadline is None else max(next_deadline - now, 0.0)), filled

    def _filled_by_stuck_threads(self) -> str | None:
        """What stuck threads have filled for good, if anything: every thread, or every
        slot of a limited queue or job type (whose jobs this process could never run again).
        """
        stuck = self.inflight.stuck_jobs()
        if len(stuck) >= self.concurrency:
            return f"all {self.concurrency} worker thread(s)"
        for queue, count in Counter(job.queue for job in stuck).items():
            limit = self.inflight.slots.queue_limits.get(queue)
            if limit is not None and count >= limit:
                return f"all {limit} slot(s) of the queue {queue!r}"
        for job_type, count in Counter(job.job_type for job in stuck).items():
            limit = self.inflight.slots.type_limits.get(job_type)
            if limit is not None and count >= limit:
                return f"all {limit} slot(s) of the job type {job_type!r}"
        return None

    def _record_time_out(self, running: Running, frame: FrameType | None) -> None:
        job = running.job
        time_to_run = time_to_run_of(job)
        left = (
            "its task is cancelled" if running.cancel else "its thread is left to finish on its own"
        )
        exc = JobTimeout(
            f"attempt {job.attempts} ran past the time_to_run of {job.job_type} "
            f"({time_to_run}); {left}"
        )
        if running.stack is not None:  # an async job: where its coroutines wait
            stack = running.stack()
        elif frame is None:
            stack = "(its thread's stack could not be read)\n"
        else:
            stack = "".join(traceback.format_stack(frame))
        retry_at = retry_at_after(job, exc)
        outcome = Outcome(
            job=job,
            worker_id=self.worker_id,
            started_at=running.began_at or clock.now(),
            finished_at=clock.now(),
            error=describe(exc),
            traceback=storable(f"Where the job was when it timed out:\n{stack}"),
            retry_at=retry_at,
            timed_out=True,
        )
        self.recorder.put(outcome)
        tracing.timed_out(job, exc)  # its span ends now, whenever its body returns
        # Receivers are user code: not on this thread, which claims for every queue.
        threading.Thread(target=signal_outcome_apart, args=(outcome,), daemon=True).start()
        logger.warning(
            "Job %s %s attempt %d timed out after %s, started %.1f ms after run_at; %s [trace %s]",
            job.pk,
            job.job_type,
            job.attempts,
            time_to_run,
            (outcome.started_at - job.run_at).total_seconds() * 1000,
            f"retrying at {retry_at.isoformat()}" if retry_at else "no retries left, marked failed",
            job.trace_id,
            extra=job_fields(job, "timed_out", started=outcome.started_at),
        )

    def drain(self) -> None:
        """Wait for running jobs to finish, timing out those that run past time_to_run.

        Jobs claimed but not started wait for a thread; if stuck threads hold every
        thread, none ever will: they are left to their leases, which expire once this
        process stops renewing them, as if it had died (another consumer runs them).
        """
        while True:
            wait, _filled = self.check()
            left, all_stuck = self.inflight.drain_step(
                DRAIN_WAIT if wait is None else max(wait, 0.001)
            )
            if not left:
                return
            if all_stuck:
                logger.warning(
                    "Consumer %s: %d claimed job(s) cannot start, every thread is "
                    "stuck; they run elsewhere once their leases expire.",
                    self.worker_id,
                    left,
                )
                return
