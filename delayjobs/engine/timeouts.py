"""Time-outs of a consumer's executions: a mixin of ``Consumer``.

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

from delayjobs import clock
from delayjobs.engine.execution import (
    Running,
    describe,
    retry_at_after,
    signal_outcome_apart,
    storable,
    time_to_run_of,
)
from delayjobs.engine.state import ConsumerState
from delayjobs.exceptions import JobTimeout
from delayjobs.logfields import job_fields
from delayjobs.transitions import Outcome

logger = logging.getLogger("delayjobs.consumer")

#: Exit code when threads stuck in timed-out jobs fill every thread, or every slot of a
#: limited queue or job type: a supervisor should start a fresh process, the only way to
#: get those threads back.
EXIT_STUCK = 3
#: While draining, how long to wait at most between two looks at the running jobs (a
#: finishing job wakes the drain anyway).
DRAIN_WAIT = 1.0


class TimeOuts(ConsumerState):
    """Mixed into ``Consumer``, whose state (running jobs, slots, recorder) it uses."""

    def _time_out_overdue(self) -> float | None:
        """Record executions past their time_to_run as timed out; seconds to the next one.

        A thread cannot be stopped, so a timed-out job keeps its thread and its slots
        until it returns, and nothing it returns counts. The attempt is recorded at once,
        with the stack where it is stuck, and retried or failed like any failure.
        """
        now = time.monotonic()
        expired: list[Running] = []
        next_deadline: float | None = None
        with self._cond:
            for running in self._in_flight.values():
                if running.finished or running.deadline is None:  # done, or not started
                    continue
                if running.deadline <= now:
                    expired.append(running)
                elif next_deadline is None or running.deadline < next_deadline:
                    next_deadline = running.deadline
            for running in expired:
                running.timed_out = True
                del self._in_flight[running.job.pk]
                self._stuck.add(running)
        if expired:
            frames = sys._current_frames()
            for running in expired:
                self._record_time_out(running, frames.get(running.thread_id or -1))
            filled = self._filled_by_stuck_threads()
            if filled and not self._stopping:
                logger.error(
                    "Consumer %s: threads stuck in timed-out jobs fill %s; stopping so that a "
                    "fresh process can take over (exit code %d).",
                    self.worker_id,
                    filled,
                    EXIT_STUCK,
                )
                self.exit_code = EXIT_STUCK
                self._stopping = True
                self._stop_event.set()
        return None if next_deadline is None else max(next_deadline - now, 0.0)

    def _filled_by_stuck_threads(self) -> str | None:
        """What stuck threads have filled for good, if anything: every thread, or every
        slot of a limited queue or job type (whose jobs this process could never run again).
        """
        with self._cond:
            stuck = [running.job for running in self._stuck]
        if len(stuck) >= self.concurrency:
            return f"all {self.concurrency} worker thread(s)"
        for queue, count in Counter(job.queue for job in stuck).items():
            limit = self._slots.queue_limits.get(queue)
            if limit is not None and count >= limit:
                return f"all {limit} slot(s) of the queue {queue!r}"
        for job_type, count in Counter(job.job_type for job in stuck).items():
            limit = self._slots.type_limits.get(job_type)
            if limit is not None and count >= limit:
                return f"all {limit} slot(s) of the job type {job_type!r}"
        return None

    def _record_time_out(self, running: Running, frame: FrameType | None) -> None:
        job = running.job
        time_to_run = time_to_run_of(job)
        exc = JobTimeout(
            f"attempt {job.attempts} ran past the time_to_run of {job.job_type} "
            f"({time_to_run}); its thread is left to finish on its own"
        )
        if frame is None:
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
        self._recorder.put(outcome)
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

    def _drain(self) -> None:
        """Wait for running jobs to finish, timing out those that run past time_to_run.

        Jobs claimed but not started wait for a thread; if stuck threads hold every
        thread, none ever will: they are left to their leases, which expire once this
        process stops renewing them, as if it had died (another consumer runs them).
        """
        while True:
            wait = self._time_out_overdue()
            with self._cond:
                if not self._in_flight:
                    return
                if len(self._stuck) >= self.concurrency:
                    logger.warning(
                        "Consumer %s: %d claimed job(s) cannot start, every thread is "
                        "stuck; they run elsewhere once their leases expire.",
                        self.worker_id,
                        len(self._in_flight),
                    )
                    return
                self._cond.wait(DRAIN_WAIT if wait is None else max(wait, 0.001))
