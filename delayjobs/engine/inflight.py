"""What a consumer has claimed and not finished with: executions, their slots, the loop's
wake-ups, all under one lock.

The lock is the only one a job's path takes (a second one cost 12.0k -> 10.4k jobs/s in a
burst): each method takes it once, and nothing slow happens under it (no Redis, no
database, no user code, no logging). Per local job that is one share of ``add`` (one per
claim batch), then ``begin``, ``finish`` and ``release``, as before the consumer was split.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from delayjobs.core import clock
from delayjobs.engine.execution import Running, time_to_run_of
from delayjobs.engine.slots import Budget, Candidate, Slots
from delayjobs.lanes import split_lane
from delayjobs.models import DelayedJob
from delayjobs.pauses import Paused

#: The most jobs claimed per idle worker thread: a claim of many jobs costs about what a
#: claim of one does, so in a backlog each idle thread is given a few to run back to back,
#: in due order. Only idle threads count: threads busy with long jobs claim nothing more.
#: Per-queue and per-job-type limits stay exact (a limited lane is never claimed past its
#: limit).
PREFETCH = 40
#: How much work (by the recent average execution time) one idle thread may be given
#: beyond its current job: jobs of up to 0.125 ms get PREFETCH each (40 per idle thread:
#: in a W2 burst, 15.7k jobs/s instead of 11.7k with 10, as each claim's round trips and
#: commit are shared by more jobs), jobs of a few milliseconds one or two, a job of a second
#: gets none extra, so no job waits here behind slow ones while another consumer could run
#: it, and none waits so long that its time-out (counted from the claim) runs out.
PREFETCH_BUDGET = 0.005
#: Weight of the latest execution in the running average of execution times.
AVERAGE_WEIGHT = 0.05

#: A job handed over to another executor (Celery) and when, by id.
HandedOver = dict[int, tuple[Running, float]]


class InFlight:
    """Executions this consumer claimed, their slots and threads, under one lock."""

    def __init__(
        self,
        *,
        concurrency: int,
        slots: Slots,
        longest_sleep: float,
        limited_types: Iterable[str] = (),
    ) -> None:
        self.concurrency = concurrency
        self.slots = slots
        self._cond = threading.Condition()
        self._wake_seq = 0  # bumped by anything that should end the main loop's sleep
        # When the main loop looks for time-outs next, at the latest; see begin().
        # Awake, it may next sleep as long as it ever does (ERROR_BACKOFF after a failure).
        self._longest_sleep = longest_sleep
        self._next_timeout_check = float("inf")
        # No started execution's deadline comes before this (a bound, not exact: a job may
        # have finished since), so the look for time-outs is skipped before it. See
        # expire_overdue.
        self._earliest_deadline = float("inf")
        # A release wakes the main loop only once this many jobs may be claimed (None:
        # never), as the loop asked before it slept (see release_wakes_at); a drain is
        # woken by every release.
        self._release_wake: int | None = 1
        self._draining = False
        self._in_flight: dict[int, Running] = {}
        # Jobs handed over to another executor (Celery) and not taken over by its worker
        # yet. Each keeps its slot, so that the broker never holds more than this
        # consumer's slots of claimed jobs whose leases run (backpressure), and its lease is
        # renewed here meanwhile, so that a long broker queue costs no attempt.
        self._handed_over: HandedOver = {}
        self._busy = 0  # threads that took a job and have not returned from it
        # Running average of how long an execution takes, in seconds (None: none yet),
        # which decides how many jobs an idle thread is given at once (see PREFETCH).
        self._average_run: float | None = None
        # The same, for each type with fleet-wide limits (see limited_room).
        self._limited_average: dict[str, float | None] = dict.fromkeys(limited_types)
        self._stuck: set[Running] = set()  # timed out, their threads still busy
        self._processed = 0

    @property
    def processed(self) -> int:
        return self._processed

    # Wake-ups and the main loop's sleep -------------------------------------------------

    def wake(self) -> None:
        with self._cond:
            self._wake_seq += 1
            self._cond.notify_all()

    def seq(self) -> int:
        """A snapshot of the wake-ups so far, taken before a turn (see ``sleep``).

        The turn starts woken by every release, unless it says otherwise
        (``release_wakes_at``).
        """
        with self._cond:
            self._release_wake = 1
            return self._wake_seq

    def release_wakes_at(self, claimable: int | None) -> None:
        """Until the next turn, a release wakes the main loop only once ``claimable`` jobs
        may be claimed (None: not at all). For a loop asleep until a due time with every
        lane open, or waiting for enough slots to claim a batch: a wake-up per finished
        job would cost a turn (and its look at Redis) for nothing."""
        with self._cond:
            self._release_wake = claimable

    def sleep(self, seen: int, wait: float, stopping: Callable[[], bool]) -> None:
        """Sleep up to ``wait`` seconds unless woken since ``seen`` or stopping."""
        with self._cond:
            if not stopping() and self._wake_seq == seen:
                # A job started meanwhile with an earlier deadline wakes the loop.
                self._next_timeout_check = time.monotonic() + wait
                self._cond.wait(wait)
            self._next_timeout_check = time.monotonic() + self._longest_sleep

    # How much may be claimed -------------------------------------------------------------

    def claimable(self) -> int:
        with self._cond:
            return self._claimable()

    def _claimable(self, per_thread: int | None = None) -> int:
        """How many more jobs may be claimed now (call with the lock held): ``per_thread``
        (default: ``prefetch()``) per idle thread, less those claimed and not taken by a
        thread yet, within the slots."""
        idle = self.concurrency - self._busy
        waiting = self.slots.used - self._busy
        per_thread = self.prefetch() if per_thread is None else per_thread
        return max(min(self.slots.free(), idle * per_thread - waiting), 0)

    def limited_room(self, job_type: str) -> int:
        """How many jobs of ``job_type``, a type with fleet-wide limits, may be claimed now:
        as ``claimable``, but prefetched by that type's own average execution time, not
        the consumer's. A limit counts a job from its claim (a slot) or its admission (a
        rate's start), so a job of it may wait for a thread only as long as a short job
        does: PREFETCH_BUDGET, well within a rate's guard. A slow limited type among fast
        ones is claimed for idle threads only, and holds no slot while another consumer
        has a thread free for it."""
        with self._cond:
            return self._claimable(_prefetch(self._limited_average.get(job_type)))

    def prefetch(self) -> int:
        """Jobs per idle thread: as many as fit PREFETCH_BUDGET by the average execution
        time, from 1 (nothing known yet, or slow jobs) to PREFETCH."""
        return _prefetch(self._average_run)

    def budget(self) -> Budget:
        """What one claim may take. Slots only ever free up meanwhile (the main loop alone
        takes them), so a snapshot under the lock is safe to spend without it."""
        with self._cond:
            return self.slots.budget(self._claimable())

    def open_types(self, known: Iterable[str]) -> list[str]:
        with self._cond:
            return self.slots.open_types(known)

    def open_queues(self, queues: Iterable[str], paused: Paused) -> tuple[int, list[str]]:
        """How many may be claimed, and from which queues (not paused, with room)."""
        with self._cond:
            free = self._claimable()
            open_queues = [
                queue
                for queue in queues
                if self.slots.queue_room(queue) > 0 and queue not in paused.queues
            ]
        return free, open_queues

    def open_lanes(self, lanes: Iterable[str], paused: Paused) -> list[str]:
        """The lanes from which a job may start now: not paused, with room."""
        with self._cond:
            room = self.slots.budget()
            return [
                name
                for name in lanes
                if room.room(*split_lane(name)) > 0 and not paused.covers(*split_lane(name))
            ]

    def choose(self, candidates: list[Candidate]) -> list[Candidate]:
        with self._cond:
            fit, _over = self.slots.choose(candidates)
        return fit

    # A job's life here ---------------------------------------------------------------------

    def add(self, jobs: list[DelayedJob]) -> list[Running]:
        """Register claimed jobs and take their slots; their executions, in start order."""
        # In due order (a job claimed early waits for its run_at in its thread, and the
        # threads take jobs in this order); among jobs already due, the higher priority
        # first. (The Redis index orders by due time only.)
        now_ns = clock.time_ns()
        # No deadline yet: a job's time_to_run counts from when its thread starts it.
        started = [Running(job) for job in jobs]
        started.sort(key=lambda running: (max(running.due, now_ns), -running.job.priority))
        with self._cond:
            for running in started:
                self._in_flight[running.job.pk] = running
                self.slots.take(running.job.queue, running.job.job_type)
        return started

    def begin(self, running: Running) -> bool:
        """A thread takes ``running``; whether it timed out before (then it must not run)."""
        with self._cond:
            running.thread_id = threading.get_ident()
            timed_out = running.timed_out
            self._busy += 1
            if not timed_out:
                self._start_clock(running)
        return timed_out

    def _start_clock(self, running: Running) -> None:
        """Start ``running``'s time_to_run as its thread takes it (lock held): from now, or
        from its run_at if it was claimed early (its thread waits until then). Wake the
        main loop if that deadline comes before it would next look for time-outs."""
        job = running.job
        early = max(running.due - clock.time_ns(), 0) / 1e9
        running.began_at = job.run_at if early else clock.now()
        running.deadline = time.monotonic() + early + time_to_run_of(job).total_seconds()
        self._earliest_deadline = min(self._earliest_deadline, running.deadline)
        if running.deadline < self._next_timeout_check:
            self._wake_seq += 1
            self._cond.notify_all()

    def finish(self, running: Running, seconds: float) -> bool:
        """Its thread returned after ``seconds``; whether it had timed out meanwhile."""
        with self._cond:
            running.finished = True
            timed_out = running.timed_out
            self._note_run_time(running.job.job_type, seconds)
        return timed_out

    def abandon(self, running: Running) -> bool:
        """Its thread returned without running it; whether it had timed out meanwhile."""
        with self._cond:
            running.finished = True  # past the time-out's reach from here
            return running.timed_out

    def hand_over(self, running: Running, seconds: float) -> bool:
        """Handed to another executor's worker: its thread is free, its slot is not until
        that worker takes the job over (see ``settle``); whether it had timed out."""
        with self._cond:
            running.finished = True
            timed_out = running.timed_out
            self._note_run_time(running.job.job_type, seconds)
            if not timed_out:
                self._hand_over(running)
        return timed_out

    def _note_run_time(self, job_type: str, seconds: float) -> None:
        """Fold one execution's duration into the averages (call with the lock held)."""
        self._average_run = _fold(self._average_run, seconds)
        if job_type in self._limited_average:
            self._limited_average[job_type] = _fold(self._limited_average[job_type], seconds)

    def _hand_over(self, running: Running) -> None:
        job = running.job
        running.handed_over = True
        if self._in_flight.get(job.pk) is running:
            del self._in_flight[job.pk]
        earlier = self._handed_over.pop(job.pk, None)
        if earlier is not None:
            # An earlier claim of this job, handed over too: a worker took it over and it
            # came back for a retry before the last look. Its slot is free now.
            self._let_go(earlier[0])
        self._handed_over[job.pk] = (running, time.monotonic())
        self._busy -= 1
        self._wake_seq += 1
        self._cond.notify_all()

    def release(self, running: Running, timed_out: bool) -> None:
        """Give back the slots of an execution whose thread is done with it."""
        job = running.job
        with self._cond:
            if running.handed_over:
                return  # its slot stays taken until a worker takes the job over
            if timed_out:
                self._stuck.discard(running)
            elif self._in_flight.get(job.pk) is running:
                # Only this very execution: once its outcome is with the recorder, a quick
                # retry may already have been claimed again under the same id.
                del self._in_flight[job.pk]
            self.slots.release(job.queue, job.job_type)
            self._busy -= 1
            self._processed += 1
            wake_at = self._release_wake
            if self._draining or (wake_at is not None and self._claimable() >= wake_at):
                self._wake_seq += 1
                self._cond.notify_all()

    # Hand-overs ------------------------------------------------------------------------------

    def handed_over(self) -> HandedOver:
        with self._cond:
            return dict(self._handed_over)

    def settle(self, waiting: HandedOver, still_ours: set[int], now: float) -> list[DelayedJob]:
        """Free the slots of handed-over jobs taken over, or waiting past their
        time_to_run; those given up while still claimed by this consumer."""
        given_up = []
        with self._cond:
            for pk, (running, handed_at) in waiting.items():
                current = self._handed_over.get(pk)
                if current is None or current[0] is not running:
                    continue  # replaced meanwhile by a later claim (see _hand_over)
                overdue = now - handed_at > time_to_run_of(running.job).total_seconds()
                if pk in still_ours and not overdue:
                    continue
                if pk in still_ours:
                    given_up.append(running.job)
                del self._handed_over[pk]
                self._let_go(running)
            self._cond.notify_all()
        return given_up

    def _let_go(self, running: Running) -> None:
        """Free the slot of a handed-over job taken over or given up (lock held)."""
        self.slots.release(running.job.queue, running.job.job_type)
        self._processed += 1
        self._wake_seq += 1

    # Time-outs ---------------------------------------------------------------------------------

    def expire_overdue(self, now: float) -> tuple[list[Running], float | None]:
        """Mark executions past their deadline timed out (their threads stay stuck); those,
        and the next deadline (monotonic), if any."""
        expired: list[Running] = []
        next_deadline: float | None = None
        with self._cond:
            if now < self._earliest_deadline:
                # Nothing can be overdue yet: no look at every claimed job on every turn.
                earliest = self._earliest_deadline
                return expired, None if earliest == float("inf") else earliest
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
            self._earliest_deadline = float("inf") if next_deadline is None else next_deadline
        return expired, next_deadline

    def stuck_jobs(self) -> list[DelayedJob]:
        """Timed-out jobs whose threads are still busy. An async job's task is not stuck:
        cancelled, it gives its slot back by itself."""
        with self._cond:
            return [running.job for running in self._stuck if running.cancel is None]

    def drain_step(self, timeout: float) -> tuple[int, bool]:
        """One look while draining: claimed jobs not done yet, and whether stuck threads
        hold every thread; unless either ends the drain, waits up to ``timeout`` for a
        job to finish."""
        with self._cond:
            self._draining = True
            left = len(self._in_flight)
            all_stuck = sum(r.cancel is None for r in self._stuck) >= self.concurrency
            if left and not all_stuck:
                self._cond.wait(timeout)
            return left, all_stuck

    # Reading ---------------------------------------------------------------------------------

    def held_jobs(self) -> list[DelayedJob]:
        """Jobs whose leases this consumer holds: in flight, and handed over."""
        with self._cond:
            held = [execution.job for execution in self._in_flight.values()]
            held += [execution.job for execution, _ in self._handed_over.values()]
        return held

    def count(self) -> int:
        with self._cond:
            return len(self._in_flight)

    def held(self) -> int:
        with self._cond:
            return len(self._in_flight) + len(self._handed_over)

    def idle(self, pending: Callable[[], int]) -> bool:
        """Nothing in flight or handed over, and ``pending()`` (outcomes unwritten) is 0."""
        with self._cond:
            return not self._in_flight and not self._handed_over and pending() == 0


def _prefetch(average: float | None) -> int:
    """Jobs per idle thread for jobs that take ``average`` seconds (None: not known yet)."""
    if average is None:
        return 1
    return max(1, min(PREFETCH, int(PREFETCH_BUDGET / max(average, 1e-6))))


def _fold(average: float | None, seconds: float) -> float:
    """A running average with one more execution's duration."""
    return seconds if average is None else average + AVERAGE_WEIGHT * (seconds - average)
