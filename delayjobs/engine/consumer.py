"""The consumer: pop due ids, claim their rows, run them in a bounded pool, record outcomes.

Threads of one consumer process:
- main: the loop below; it sleeps until the earliest due time it knows of, and times out
  executions that run past their job type's ``time_to_run``;
- listener: Redis pub/sub; wakes main when a sooner job is added (no poll interval); in
  Redis-down mode it also notices when Redis answers again;
- workers (``concurrency`` daemon threads): run ``JobType.execute``;
- recorder: writes outcomes in batches;
- heartbeat: renews the leases of running jobs;
- pre-loader: a pass every PRELOAD_INTERVAL (one process at a time, by a Redis lock).

Redis-down mode: when Redis fails twice in a row (or times out once), main claims due jobs
straight from the database every DATABASE_POLL_INTERVAL (sooner when it knows a job is
due sooner) and reaps expired leases itself, until the listener sees Redis answer again;
then main drops Redis' entries already due (a promoted replica has those of jobs run from
the database meanwhile), one pre-loader pass refills Redis (it may have come back empty)
and main goes back to Redis. Each change of mode is logged once. It lives in
``consumer_database_mode``, the time-outs in ``consumer_timeouts``, both mixins of
``Consumer``; what one execution is, in ``execution``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from redis import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayjobs import clock, metrics, pauses, transitions
from delayjobs.conf import EXECUTORS, settings
from delayjobs.contrib.celery import executor as celery_executor
from delayjobs.db import drop_broken_connections
from delayjobs.engine import preloader, presence
from delayjobs.engine.execution import (
    LOCKED_RETRY,
    Running,
    due_ns,
    run_claimed,
    signal_outcome,
    time_to_run_of,
    wait_until,
)
from delayjobs.engine.fallback import DatabaseMode
from delayjobs.engine.recorder import Recorder
from delayjobs.engine.slots import Slots
from delayjobs.engine.timeouts import EXIT_STUCK, TimeOuts
from delayjobs.engine.workers import WorkerThreads
from delayjobs.handoff import index_due_soon
from delayjobs.jobtypes import JobType, registry
from delayjobs.logfields import job_fields
from delayjobs.models import DelayedJob, JobStatus
from delayjobs.redis_store import (
    RedisStore,
    control_channel,
    describe_target,
    get_store,
    index_entry,
    lanes,
    split_lane,
)

__all__ = ["EXIT_STUCK", "Consumer", "default_worker_id"]

logger = logging.getLogger("delayjobs.consumer")

#: Back-off after the database or Redis failed in the main loop.
ERROR_BACKOFF = 1.0
#: In a backlog, how long a free slot may wait for others to free up, so that one claim
#: fills many slots instead of one claim (a Redis and a database round trip) per slot.
REFILL_WAIT = 0.002
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
#: With the Celery executor, how often to look whether Celery workers took the jobs
#: handed to them over (each one taken over frees its slot for the next claim).
HANDOVER_POLL = 0.05
#: The GIL is handed between threads at most this often (CPython's default is 5 ms). A
#: worker waking up to start a due job waits for it while another thread runs Python, so
#: the default would make a job up to 5 ms late whenever the recorder or a claim is busy.
SWITCH_INTERVAL = 0.0005


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Consumer(DatabaseMode, TimeOuts):
    def __init__(
        self,
        *,
        queues: Iterable[str] | None = None,
        concurrency: int | None = None,
        burst: bool = False,
        preload: bool = True,
        worker_id: str | None = None,
        store: RedisStore | None = None,
        executor: str | None = None,
        celery_app: str | None = None,
    ) -> None:
        self.queues = sorted(set(queues or registry.queues() or ["default"]))
        self.concurrency = concurrency or settings.CONCURRENCY
        self.burst = burst
        self.preload = preload
        self.worker_id = worker_id or default_worker_id()
        # "local": jobs run in this process's threads; "celery": each claimed job is
        # published as a Celery task and its slot freed at once (see celery_executor).
        self.executor = executor or settings.EXECUTOR
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {self.executor!r}")
        # Celery executor: the broker is checked now, before anything is claimed; after a
        # failed publish, nothing is claimed or published until the back-off is over.
        self._publish_backoff: celery_executor.PublishBackoff | None = None
        if self.executor == "celery":
            celery_executor.prepare(celery_app)
            self._publish_backoff = celery_executor.PublishBackoff()
        elif celery_app is not None:
            raise ImproperlyConfigured(
                "--celery-app is for the Celery executor: add --executor celery."
            )
        self.store = store or get_store()
        self.processed = 0
        self.exit_code = 0

        self._cond = threading.Condition()
        self._wake_seq = 0  # bumped by anything that should end the main loop's sleep
        self._stopping = False
        self._stop_event = threading.Event()  # the same, for the helper threads
        # Set once no job runs any more: the heartbeat renews leases until then, so that
        # a job finishing during a graceful shutdown is not taken over by another consumer.
        self._drained = threading.Event()
        self._in_flight: dict[int, Running] = {}
        # Celery executor: jobs published to Celery and not taken over by a worker yet.
        # Each keeps its slot, so that the broker never holds more than this consumer's
        # slots of claimed jobs whose leases run (backpressure), and its lease is renewed
        # here meanwhile, so that a long broker queue costs no attempt. A job no worker
        # took over within its time_to_run is let go: its lease then expires.
        self._handed_over: dict[int, tuple[Running, float]] = {}
        self._next_handover_check = 0.0
        self._busy = 0  # threads that took a job and have not returned from it
        # Running average of how long an execution takes, in seconds (None: none yet),
        # which decides how many jobs an idle thread is given at once (see PREFETCH).
        self._average_run: float | None = None
        self._stuck: set[Running] = set()  # timed out, their threads still busy
        # When the main loop looks for time-outs next, at the latest; see _start_clock.
        # Awake, it may next sleep as long as it ever does (ERROR_BACKOFF after a failure).
        self._longest_sleep = max(
            settings.IDLE_TIMEOUT.total_seconds(),
            settings.DATABASE_POLL_INTERVAL.total_seconds(),
            ERROR_BACKOFF,
        )
        self._next_timeout_check = float("inf")
        self._slots = Slots(
            self.concurrency * PREFETCH,
            queue_limits=settings.QUEUE_CONCURRENCY,
            type_limits={jt.name: jt.concurrency for jt in registry if jt.concurrency},
        )
        self._last_claim: datetime | None = None
        # Jobs are claimed up to this long before they are due, then started by their
        # thread at their exact run_at: the claim's round trips (Redis, the database and
        # its commit) are then out of the way when the job is due. A job claimed early is
        # running as far as the database is concerned: cancel() and reschedule() no longer
        # move it, as with any job claimed a moment after it was due; its lease covers a
        # consumer dying meanwhile.
        self._ahead = settings.CLAIM_AHEAD
        self._job_types = registry.names()
        self._leases = {
            jobtype.name: jobtype.time_to_run
            for jobtype in registry
            if jobtype.time_to_run != JobType.time_to_run
        }
        self._unknown_types: set[str] = set()  # warned about once each
        # Each queue's lanes (see redis_store.lane); which one pops first rotates, so that
        # no queue starves the others.
        self._lanes = [name for queue in self.queues for name in lanes(queue)]
        self._rotation = 0
        self._database_failures = 0
        self._redis_failures = 0
        self._backlog = False  # the last pop left due jobs behind
        self._refill_deadline: float | None = None
        self._database_down = False  # logged once per change
        # Redis-down mode: claiming from the database until the listener sets _redis_back.
        self._database_mode = False
        self._redis_back = threading.Event()
        self._next_probe = 0.0  # monotonic time before which the listener does not probe
        self._return_failed = False  # logged once per streak
        self._next_reap = 0.0
        # Paused queues and job types: re-read when the listener hears of a change, and
        # at least every IDLE_TIMEOUT in case it missed one.
        self._paused = pauses.Paused()
        self._pauses_stale = True
        self._next_pause_refresh = 0.0
        self._workers = WorkerThreads(self.concurrency, name="delayjobs-worker")
        self._recorder = Recorder(on_retries=index_due_soon, on_idle=self.wake)
        self._threads: list[threading.Thread] = []

    # Lifecycle ------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (or, with ``burst``, until nothing is due); return an exit code."""
        logger.info(
            "Consumer %s: queues %s, concurrency %d, Redis at %s%s.",
            self.worker_id,
            ", ".join(self.queues),
            self.concurrency,
            describe_target(),
            ", burst" if self.burst else "",
        )
        self._sync_clock(always=True)
        self._announce()
        metrics.consumer_running(True)
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(switch_interval, SWITCH_INTERVAL))
        self._recorder.start()
        self._start_thread(self._listen, "delayjobs-listener")
        self._start_thread(self._heartbeat, "delayjobs-heartbeat")
        if self.preload:
            if self.burst:
                self._preload_once()
            else:
                self._start_thread(self._preload_forever, "delayjobs-preloader")
        try:
            self._loop()
        finally:
            self._shutdown()
            sys.setswitchinterval(switch_interval)
        return self.exit_code

    def request_stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        """First call: claim nothing more and let running jobs finish. Second: leave now."""
        name = signal.Signals(signum).name if signum else "stop request"
        if self._stopping:
            logger.warning("%s again: exiting now; running jobs return after their lease.", name)
            os._exit(1)
        logger.warning(
            "%s: finishing %d running job(s), claiming no more (again to exit at once).",
            name,
            len(self._in_flight),
        )
        self._stopping = True
        self._stop_event.set()
        self.wake()

    def wake(self) -> None:
        with self._cond:
            self._wake_seq += 1
            self._cond.notify_all()

    def _start_thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _shutdown(self) -> None:
        self._stopping = True
        self._stop_event.set()
        self._drain()
        self._workers.stop()
        self._drained.set()
        self._recorder.stop()
        for thread in self._threads:
            thread.join(timeout=10)
        try:
            presence.withdraw(self.worker_id)
        except DatabaseError as exc:
            logger.warning("Could not remove this consumer's heartbeat row (%s).", exc)
        connections.close_all()
        metrics.consumer_running(False)
        logger.info("Consumer %s stopped after %d job(s).", self.worker_id, self.processed)

    # Main loop ------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping:
            with self._cond:
                seen = self._wake_seq
            next_timeout: float | None = None
            try:
                next_timeout = self._time_out_overdue()
                handover_wait = self._check_handed_over()
                if handover_wait is not None:
                    next_timeout = min(next_timeout or handover_wait, handover_wait)
                self._refresh_pauses()
                wait: float | None = self._broker_wait()
                if not wait:
                    wait = self._database_turn() if self._database_mode else self._redis_turn()
                self._database_recovered()
            except (DatabaseError, RedisError) as exc:
                drop_broken_connections()
                wait = self._failed(exc)
            except Exception:
                # A bug or a value nobody foresaw must not stop every job on this host:
                # say so loudly, back off, and carry on. Only a signal stops the loop.
                logger.exception(
                    "Consumer %s: unexpected error in its main loop; retrying in %g s.",
                    self.worker_id,
                    ERROR_BACKOFF,
                )
                drop_broken_connections()
                wait = ERROR_BACKOFF
            if wait is None:  # burst mode and nothing left to do
                return
            if next_timeout is not None:
                wait = min(wait, next_timeout)
            if wait <= 0:
                continue
            with self._cond:
                if not self._stopping and self._wake_seq == seen:
                    # A job started meanwhile with an earlier deadline wakes the loop.
                    self._next_timeout_check = time.monotonic() + wait
                    self._cond.wait(wait)
                self._next_timeout_check = time.monotonic() + self._longest_sleep

    def _broker_wait(self) -> float:
        """Seconds before jobs may be claimed for Celery again after a failed publish."""
        return self._publish_backoff.remaining() if self._publish_backoff else 0.0

    def _redis_turn(self) -> float | None:
        """Claim what Redis says is due; return how long to sleep (None: burst done)."""
        free = self._free()
        wait = self._refill_wait(free)
        if wait is not None:
            return wait
        if free > 0 and self._claim_from_redis():
            return 0.0  # more may be due right now: look again before sleeping
        return self._time_to_next(free)

    def _free(self) -> int:
        with self._cond:
            return self._claimable()

    def _claimable(self) -> int:
        """How many more jobs may be claimed now (call with the lock held): PREFETCH per
        idle thread, less those claimed and not taken by a thread yet, within the slots."""
        idle = self.concurrency - self._busy
        waiting = self._slots.used - self._busy
        return max(min(self._slots.free(), idle * self._prefetch() - waiting), 0)

    def _prefetch(self) -> int:
        """Jobs per idle thread: as many as fit PREFETCH_BUDGET by the average execution
        time, from 1 (nothing known yet, or slow jobs) to PREFETCH."""
        average = self._average_run
        if average is None:
            return 1
        return max(1, min(PREFETCH, int(PREFETCH_BUDGET / max(average, 1e-6))))

    def _note_run_time(self, seconds: float) -> None:
        """Fold one execution's duration into the average (call with the lock held)."""
        average = self._average_run
        if average is None:
            self._average_run = seconds
        else:
            self._average_run = average + AVERAGE_WEIGHT * (seconds - average)

    def _refill_wait(self, free: int) -> float | None:
        """In a backlog, seconds to let more slots free up before popping; None: go on now.

        Jobs in a backlog are late already; batching their claims drains it faster. A
        job due while there is no backlog is never held back.
        """
        if not self._backlog or free <= 0 or free >= self.concurrency * self._prefetch() // 2:
            self._refill_deadline = None
            return None
        now = time.monotonic()
        if self._refill_deadline is None:
            self._refill_deadline = now + REFILL_WAIT
        if now >= self._refill_deadline:
            self._refill_deadline = None
            return None
        return self._refill_deadline - now

    def _claim_from_redis(self) -> int:
        popped: dict[int, tuple[str, float]] = {}  # id -> (lane, score)
        now = clock.epoch() + self._ahead.total_seconds()
        backlog = False
        first = self._rotation
        self._rotation = (self._rotation + 1) % len(self._lanes)
        # Slots only ever free up meanwhile (this thread alone takes them), so a snapshot
        # under the lock is safe to spend without it.
        with self._cond:
            budget = self._slots.budget(self._claimable())
        try:
            for name in self._lanes[first:] + self._lanes[:first]:
                queue, job_type = split_lane(name)
                if self._paused.covers(queue, job_type):
                    continue
                wanted = budget.room(queue, job_type)
                if wanted <= 0:
                    continue
                taken, more_due = self.store.pop_due(name, now, wanted)
                backlog = backlog or more_due
                budget.spend(queue, job_type, len(taken))
                for pk, score in taken:
                    popped[pk] = (name, score)
                if budget.free <= 0:
                    break
        except Exception:
            # A later lane failed: the ids popped from the earlier ones go back now, or
            # they would wait for the next pre-loader pass, up to a window late.
            self._put_back(popped)
            raise
        # Redis answered. Only then: a turn that did not ask it (waiting for slots to free
        # up in a backlog) says nothing of Redis, and must not end a streak of failures.
        self._redis_failures = 0
        self._backlog = backlog
        if not popped:
            return 0
        try:
            # Types without a free slot are not claimed. Their jobs are in their own lanes,
            # not popped; one found in the queue's lane (indexed by a process that did not
            # know the type's limit yet) is put back, into its lane, by _reindex_unclaimed.
            jobs = transitions.claim(
                list(popped),
                worker_id=self.worker_id,
                now=self._claim_time(),
                job_types=self._open_types(),
                leases=self._leases,
                default_lease=JobType.time_to_run,
                ahead=self._ahead,
            )
        except Exception:
            # The ids left Redis but no row was claimed: put them back, or they would wait
            # for the next pre-loader pass.
            self._put_back(popped)
            raise
        # Claimed rows run before anything else can fail: a claimed job left unstarted
        # would only come back after its lease, with an attempt spent.
        self._start(jobs)
        if len(jobs) < len(popped):
            claimed = {job.pk for job in jobs}
            try:
                self._reindex_unclaimed([pk for pk in popped if pk not in claimed])
            except DatabaseError:
                logger.warning("Could not re-index unclaimed jobs; the pre-loader will.")
        return len(jobs)

    def _put_back(self, popped: dict[int, tuple[str, float]]) -> None:
        """Return popped ids to their lanes, best effort: if Redis refuses even that, the
        pre-loader's next pass puts them back (the rows are the truth)."""
        if not popped:
            return
        try:
            self.store.add((pk, name, score) for pk, (name, score) in popped.items())
        except RedisError as exc:
            logger.warning(
                "Could not put %d popped job(s) back into Redis (%s); the pre-loader will.",
                len(popped),
                exc,
            )

    def _lane_room(self, name: str) -> int:
        """How many jobs may start from this lane now (call with the lock held)."""
        queue, job_type = split_lane(name)
        return self._slots.budget().room(queue, job_type)

    def _open_types(self) -> list[str]:
        """Known job types that may start a job now: not paused, with a free slot."""
        known = [name for name in self._job_types if name not in self._paused.job_types]
        with self._cond:
            return self._slots.open_types(known)

    def _start(self, jobs: list[DelayedJob]) -> None:
        if not jobs:
            return
        # In due order (a job claimed early waits for its run_at in its thread, and the
        # threads take jobs in this order); among jobs already due, the higher priority
        # first. (The Redis index orders by due time only.)
        now_ns = clock.time_ns()
        jobs.sort(key=lambda job: (max(due_ns(job), now_ns), -job.priority))
        # No deadline yet: a job's time_to_run counts from when its thread starts it.
        started = [Running(job) for job in jobs]
        with self._cond:
            for running in started:
                self._in_flight[running.job.pk] = running
                self._slots.take(running.job.queue, running.job.job_type)
        for running in started:
            self._workers.submit(self._execute, running)

    def _reindex_unclaimed(self, ids: list[int]) -> None:
        """Ids popped but not claimed: put back those that should run later.

        Cancelled, finished or taken by another consumer: dropped. Still scheduled: moved
        later (back at its time), locked by a caller's open transaction (back in a
        moment), of a job type this consumer does not know (left to the pre-loader, and
        so to a consumer that knows it), or paused (left out until resume() puts it back).
        """
        now = clock.now()
        entries = []
        rows = DelayedJob.objects.filter(pk__in=ids, status=JobStatus.SCHEDULED).order_by()
        found = list(rows.values_list("pk", "queue", "run_at", "job_type"))
        if any(run_at <= now for _pk, _queue, run_at, _job_type in found):
            # Due yet not claimed: perhaps paused or resumed since this consumer last
            # looked. Dropping resumed work would delay it to the next pre-loader pass.
            self._paused = pauses.paused()
        for pk, queue, run_at, job_type in found:
            if job_type not in self._job_types:
                self._warn_unknown_type(job_type)
                continue
            if self._paused.covers(queue, job_type):
                continue  # out of Redis while paused; resume() puts it back
            # Not sooner than LOCKED_RETRY: a row due within CLAIM_AHEAD that was locked
            # would otherwise be popped again at once, over and over until its run_at.
            due = max(run_at, now + LOCKED_RETRY)
            entries.append(index_entry(pk, queue, job_type, due.timestamp()))
        index_due_soon(entries)

    def _warn_unknown_type(self, job_type: str) -> None:
        if job_type not in self._unknown_types:
            self._unknown_types.add(job_type)
            logger.warning(
                "Consumer %s does not know job type %r and leaves its jobs to a consumer "
                "that does (deploy in progress?). Known: %s.",
                self.worker_id,
                job_type,
                ", ".join(self._job_types),
            )

    def _time_to_next(self, free: int) -> float | None:
        """Seconds to sleep; None when a burst run is done."""
        idle = settings.IDLE_TIMEOUT.total_seconds()
        with self._cond:
            open_lanes = [
                name
                for name in self._lanes
                if self._lane_room(name) > 0 and not self._paused.covers(*split_lane(name))
            ]
        if free <= 0 or not open_lanes:
            return idle  # a finishing job wakes us
        due = self.store.next_due(open_lanes)
        self._redis_failures = 0  # Redis answered
        now = clock.epoch()
        if self.burst and (due is None or due > now) and self._idle():
            return None
        if due is None:
            return idle
        return min(max(due - self._ahead.total_seconds() - now, 0.0), idle)

    def _idle(self) -> bool:
        with self._cond:
            return not self._in_flight and not self._handed_over and self._recorder.pending == 0

    def _claim_time(self) -> datetime:
        """Now, but strictly after the previous claim: the claim's token (see ``claim``)."""
        now = clock.now()
        if self._last_claim is not None and now <= self._last_claim:
            now = self._last_claim + timedelta(microseconds=1)
        self._last_claim = now
        return now

    # Workers --------------------------------------------------------------------------

    def _execute(self, running: Running) -> None:
        """Run one claimed job in a worker thread and hand its outcome to the recorder."""
        job = running.job
        timed_out = False
        try:
            with self._cond:
                running.thread_id = threading.get_ident()
                timed_out = running.timed_out
                self._busy += 1
                if not timed_out:
                    self._start_clock(running)
            if timed_out:  # before it even started: its time-out is recorded, do not run it
                return
            wait_until(due_ns(job))  # claimed up to CLAIM_AHEAD early: never start early
            began = time.monotonic()
            if self._publish_backoff is not None:
                timed_out = self._publish(running, began)
                return
            outcome = run_claimed(job, self.worker_id)
            with self._cond:
                running.finished = True
                timed_out = running.timed_out
                self._note_run_time(time.monotonic() - began)
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
                self._recorder.put(outcome)
        finally:
            self._release(running, timed_out)

    def _publish(self, running: Running, began: float) -> bool:
        """Hand a claimed job to Celery, or give it back if the broker does not take it;
        whether the job had timed out meanwhile."""
        assert self._publish_backoff is not None
        job = running.job
        try:
            if self._publish_backoff.remaining():
                raise celery_executor.BrokerUnavailable("backing off after a failed publish")
            celery_executor.dispatch(job, self.worker_id)
        except celery_executor.BrokerUnavailable as exc:
            with self._cond:
                running.finished = True  # past the time-out's reach from here
                timed_out = running.timed_out
            # A publish that outlasted time_to_run was timed out meanwhile: that outcome,
            # attempt spent, is being recorded; giving the job back too would contradict it.
            if not timed_out:
                self._give_back(job, exc)
            return timed_out
        if self._publish_backoff.succeeded():
            logger.warning("Consumer %s: the Celery broker takes tasks again.", self.worker_id)
        with self._cond:
            running.finished = True
            timed_out = running.timed_out
            self._note_run_time(time.monotonic() - began)
            if not timed_out:
                self._hand_over(running)
        if timed_out:
            logger.warning(
                "Job %s %s attempt %d was published to Celery after it had timed out; a "
                "Celery worker finds its claim gone and does nothing [trace %s]",
                job.pk,
                job.job_type,
                job.attempts,
                job.trace_id,
            )
        return timed_out

    def _give_back(self, job: DelayedJob, exc: celery_executor.BrokerUnavailable) -> None:
        """Return a job the broker did not take to ``scheduled``, its attempt unspent, due
        again once the back-off is over (the broker is down: nothing is lost meanwhile)."""
        assert self._publish_backoff is not None
        wait = self._publish_backoff.failed()
        logger.warning(
            "Job %s %s: the Celery broker did not take its task (%s); it goes back without "
            "spending its attempt, and no task is published for %.1f s [trace %s]",
            job.pk,
            job.job_type,
            exc,
            wait,
            job.trace_id,
            extra=job_fields(job, "given_back"),
        )
        try:
            entry = transitions.give_back(
                job, worker_id=self.worker_id, due=clock.now() + timedelta(seconds=wait)
            )
        except DatabaseError as error:
            logger.error(
                "Job %s: could not give it back (%s); it runs again once its lease expires, "
                "with an attempt spent.",
                job.pk,
                error,
            )
            return
        if entry is not None:
            index_due_soon([entry])  # best effort: the pre-loader re-indexes the row anyway

    def _start_clock(self, running: Running) -> None:
        """Start ``running``'s time_to_run as its thread takes it (lock held): from now, or
        from its run_at if it was claimed early (its thread waits until then). Wake the
        main loop if that deadline comes before it would next look for time-outs."""
        job = running.job
        early = max(due_ns(job) - clock.time_ns(), 0) / 1e9
        running.began_at = job.run_at if early else clock.now()
        running.deadline = time.monotonic() + early + time_to_run_of(job).total_seconds()
        if running.deadline < self._next_timeout_check:
            self._wake_seq += 1
            self._cond.notify_all()

    def _release(self, running: Running, timed_out: bool) -> None:
        """Give back the slots of an execution whose thread is done with it."""
        job = running.job
        with self._cond:
            if running.handed_over:
                return  # its slot stays taken until a Celery worker takes the job over
            if timed_out:
                self._stuck.discard(running)
            elif self._in_flight.get(job.pk) is running:
                # Only this very execution: once its outcome is with the recorder, a quick
                # retry may already have been claimed again under the same id.
                del self._in_flight[job.pk]
            self._slots.release(job.queue, job.job_type)
            self._busy -= 1
            self.processed += 1
            self._wake_seq += 1
            self._cond.notify_all()

    def _hand_over(self, running: Running) -> None:
        """A job published to Celery: its thread is free, its slot is not (lock held)."""
        job = running.job
        running.handed_over = True
        if self._in_flight.get(job.pk) is running:
            del self._in_flight[job.pk]
        earlier = self._handed_over.pop(job.pk, None)
        if earlier is not None:
            # An earlier claim of this job, handed over too: a Celery worker took it over
            # and it came back for a retry before the last look. Its slot is free now.
            self._let_go(earlier[0])
        self._handed_over[job.pk] = (running, time.monotonic())
        self._busy -= 1
        self._wake_seq += 1
        self._cond.notify_all()

    def _check_handed_over(self) -> float | None:
        """Free the slots of jobs Celery workers took over (or that waited too long);
        seconds until the next look, None if nothing is waiting."""
        with self._cond:
            if not self._handed_over:
                return None
            waiting = dict(self._handed_over)
        now = time.monotonic()
        if now < self._next_handover_check:
            return self._next_handover_check - now
        self._next_handover_check = now + HANDOVER_POLL
        still_ours = transitions.still_claimed(
            [running.job for running, _ in waiting.values()], worker_id=self.worker_id
        )
        let_go = []
        with self._cond:
            for pk, (running, handed_at) in waiting.items():
                current = self._handed_over.get(pk)
                if current is None or current[0] is not running:
                    continue  # replaced meanwhile by a later claim (see _hand_over)
                overdue = now - handed_at > time_to_run_of(running.job).total_seconds()
                if pk in still_ours and not overdue:
                    continue
                if pk in still_ours:
                    let_go.append(running.job)
                del self._handed_over[pk]
                self._let_go(running)
            self._cond.notify_all()
        for job in let_go:
            logger.warning(
                "Job %s attempt %d: no Celery worker took it over within its time_to_run; "
                "its lease is no longer renewed, so it runs again once the lease expires "
                "[trace %s]",
                job.pk,
                job.attempts,
                job.trace_id,
            )
        return HANDOVER_POLL

    def _let_go(self, running: Running) -> None:
        """Free the slot of a handed-over job taken over or given up (lock held)."""
        self._slots.release(running.job.queue, running.job.job_type)
        self.processed += 1
        self._wake_seq += 1

    # Helper threads -------------------------------------------------------------------

    def _listen(self) -> None:
        """Wake the main loop whenever a queue's earliest due time moves earlier."""
        while not self._stop_event.is_set():
            try:
                pubsub = self.store.subscribe_wake(self.queues)
            except RedisError:
                self._stop_event.wait(ERROR_BACKOFF)
                continue
            try:
                self.wake()  # anything published while we were not subscribed is missed
                while not self._stop_event.is_set():
                    self._probe_redis()
                    message = pubsub.get_message(timeout=0.5)
                    if message is not None:
                        if _channel_name(message) == control_channel():
                            self._pauses_stale = True
                        self.wake()
            except RedisError:
                self._stop_event.wait(ERROR_BACKOFF)
            except Exception:
                # This thread alone ends Redis-down mode: it must outlive any surprise.
                logger.exception("Consumer %s: wake listener error; resubscribing", self.worker_id)
                self._stop_event.wait(ERROR_BACKOFF)
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()

    def _heartbeat(self) -> None:
        """Renew the leases of running jobs well before they expire."""
        while not self._drained.wait(self._heartbeat_interval()):
            with self._cond:
                metrics.consumer_beat(len(self._in_flight) + len(self._handed_over))
            drop_broken_connections()
            self._sync_clock(always=False)
            try:
                if not presence.beat(
                    self.worker_id,
                    processed=self.processed,
                    database_mode=self._database_mode,
                    clock_offset=clock.shared.offset(),
                ):
                    self._announce()
            except DatabaseError as exc:
                logger.warning("Could not record the heartbeat (%s); retrying.", exc)
            try:
                self._renew_leases()
            except DatabaseError as exc:
                logger.warning("Could not renew leases (%s); retrying.", exc)
        connections.close_all()

    def _renew_leases(self) -> None:
        """Push out the leases of the jobs this consumer runs, and of those it ran whose
        outcomes still wait in the recorder: a lease ends only once the outcome is durable."""
        with self._cond:
            held = [execution.job for execution in self._in_flight.values()]
            held += [execution.job for execution, _ in self._handed_over.values()]
        held += self._recorder.waiting_jobs()
        if not held:
            return
        by_lease: dict[timedelta, set[int]] = defaultdict(set)
        for job in held:
            by_lease[time_to_run_of(job)].add(job.pk)
        transitions.renew_leases(by_lease, worker_id=self.worker_id)

    def _announce(self) -> None:
        """Write this consumer's heartbeat row (the dashboard's list of live consumers)."""
        try:
            presence.announce(
                self.worker_id,
                queues=self.queues,
                concurrency=self.concurrency,
                clock_offset=clock.shared.offset(),
            )
        except DatabaseError as exc:
            logger.warning("Could not record this consumer's heartbeat row (%s).", exc)

    def _sync_clock(self, *, always: bool) -> None:
        """Read the database server's clock, every due and lease decision's time (see
        ``delayjobs.clock``): at start, then on the heartbeat once the reading is old."""
        shared = clock.shared
        if always or shared.due():
            offset = shared.sync()
            clock.report_offset(offset, self.worker_id)
            metrics.clock_offset(offset)

    def _refresh_pauses(self) -> None:
        """Re-read the paused queues and job types when told to, or every IDLE_TIMEOUT."""
        now = time.monotonic()
        if not self._pauses_stale and now < self._next_pause_refresh:
            return
        self._pauses_stale = False
        self._next_pause_refresh = now + settings.IDLE_TIMEOUT.total_seconds()
        paused = pauses.paused()
        if paused != self._paused:
            logger.info(
                "Consumer %s: paused queues %s, job types %s.",
                self.worker_id,
                ", ".join(sorted(paused.queues)) or "none",
                ", ".join(sorted(paused.job_types)) or "none",
            )
        self._paused = paused

    def _heartbeat_interval(self) -> float:
        shortest = min((jt.time_to_run for jt in registry), default=JobType.time_to_run)
        return min(max(shortest.total_seconds() / 3, 0.5), 30.0)

    def _preload_forever(self) -> None:
        preloader.run_forever(self._stop_event)
        connections.close_all()

    def _preload_once(self) -> None:
        try:
            result = preloader.preload(store=self.store)
            logger.info("Pre-loader pass: %s", result)
        except (DatabaseError, RedisError) as exc:
            logger.error("Pre-loader pass failed: %s", exc)

    # Error reporting ------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> float:
        """Log a failure of the main loop; return how long to wait before trying again.

        The first failure is retried at once: usually an idle connection that the server,
        a pooler or the network dropped, which a reconnect mends. A second Redis failure,
        or a first that is a time-out, switches to Redis-down mode; the database is
        waited for, with a back-off.
        """
        if isinstance(exc, RedisError):
            self._redis_back.clear()
            # What the last pop said of a backlog is stale: try Redis again at once.
            self._backlog = False
            self._refill_deadline = None
            if self._database_mode:
                return 0.0  # it failed again on the way back: stay, say nothing new
            self._redis_failures += 1
            # A time-out is conclusive at once: it already waited the whole socket timeout
            # (Redis frozen, or the network dropping packets), and a retry would only wait
            # it out again before the fallback, doubling every job's lateness.
            if self._redis_failures == 1 and not isinstance(exc, RedisTimeoutError):
                logger.info("Consumer %s: Redis error (%s); retrying at once.", self.worker_id, exc)
            else:
                self._enter_database_mode(exc)
            return 0.0
        self._database_failures += 1
        if self._database_failures == 1:
            logger.info("Consumer %s: database error (%s); retrying at once.", self.worker_id, exc)
            return 0.0
        if not self._database_down:
            logger.error("Consumer %s: database unavailable (%s); retrying.", self.worker_id, exc)
            self._database_down = True
        return ERROR_BACKOFF

    def _database_recovered(self) -> None:
        self._database_failures = 0
        if self._database_down:
            logger.warning("Consumer %s: database is back.", self.worker_id)
            self._database_down = False


def _channel_name(message: dict[str, Any]) -> str:
    channel = message.get("channel", b"")
    return channel.decode() if isinstance(channel, bytes) else str(channel)
