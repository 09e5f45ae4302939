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

Redis-down mode: when Redis cannot be reached twice in a row, main claims due jobs
straight from the database every DATABASE_POLL_INTERVAL (sooner when it knows a job is
due sooner) and reaps expired leases itself, until the listener sees Redis answer again;
then one pre-loader pass refills Redis (it may have come back empty) and main goes back
to Redis. Each change of mode is logged once.
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
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

from django.db import DatabaseError, close_old_connections, connections
from django.utils import timezone
from redis import RedisError

from delayjobs import pauses, preloader, presence, signals, transitions
from delayjobs.conf import settings
from delayjobs.db import drop_broken_connections
from delayjobs.exceptions import JobTimeout, UnknownJobType
from delayjobs.handoff import index_due_soon
from delayjobs.jobtypes import JobType, registry
from delayjobs.models import DelayedJob, JobStatus
from delayjobs.recorder import Recorder
from delayjobs.redis_store import (
    RedisStore,
    control_channel,
    describe_target,
    get_store,
    index_entry,
    lanes,
    split_lane,
)
from delayjobs.slots import Candidate, Slots
from delayjobs.transitions import Outcome
from delayjobs.workers import WorkerThreads

logger = logging.getLogger("delayjobs.consumer")

#: Back-off after the database or Redis failed in the main loop.
ERROR_BACKOFF = 1.0
#: In a backlog, how long a free slot may wait for others to free up, so that one claim
#: fills many slots instead of one claim (a Redis and a database round trip) per slot.
REFILL_WAIT = 0.002
#: A due job whose row was locked by a caller's open transaction is tried again after this;
#: so is a due job whose job type had no free slot.
LOCKED_RETRY = timedelta(milliseconds=50)
#: Exit code when threads stuck in timed-out jobs fill every thread, or every slot of a
#: limited queue or job type: a supervisor should start a fresh process, the only way to
#: get those threads back.
EXIT_STUCK = 3
#: Redis-down mode: after Redis answered but refilling it failed, wait this long before
#: trying to go back to it again.
REDIS_RETURN_BACKOFF = 5.0


@dataclass(eq=False)
class Running:
    """One execution this consumer started, until its thread returns."""

    job: DelayedJob
    deadline: float  # time.monotonic() past which it is timed out
    thread_id: int | None = None
    finished: bool = False  # its thread returned; the outcome is being handed over
    timed_out: bool = False  # recorded as timed out; whatever it returns is ignored


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Consumer:
    def __init__(
        self,
        *,
        queues: Iterable[str] | None = None,
        concurrency: int | None = None,
        burst: bool = False,
        preload: bool = True,
        worker_id: str | None = None,
        store: RedisStore | None = None,
    ) -> None:
        self.queues = sorted(set(queues or registry.queues() or ["default"]))
        self.concurrency = concurrency or settings.CONCURRENCY
        self.burst = burst
        self.preload = preload
        self.worker_id = worker_id or default_worker_id()
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
        self._stuck: set[Running] = set()  # timed out, their threads still busy
        self._slots = Slots(
            self.concurrency,
            queue_limits=settings.QUEUE_CONCURRENCY,
            type_limits={jt.name: jt.concurrency for jt in registry if jt.concurrency},
        )
        self._last_claim: datetime | None = None
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
        self._announce()
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
        logger.info("Consumer %s stopped after %d job(s).", self.worker_id, self.processed)

    # Main loop ------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping:
            with self._cond:
                seen = self._wake_seq
            next_timeout = self._time_out_overdue()
            try:
                self._refresh_pauses()
                if self._database_mode:
                    wait = self._database_turn()
                else:
                    wait = self._redis_turn()
                    self._redis_failures = 0
                self._database_recovered()
            except (DatabaseError, RedisError) as exc:
                drop_broken_connections()
                wait = self._failed(exc)
            if wait is None:  # burst mode and nothing left to do
                return
            if next_timeout is not None:
                wait = min(wait, next_timeout)
            if wait <= 0:
                continue
            with self._cond:
                if not self._stopping and self._wake_seq == seen:
                    self._cond.wait(wait)

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
            return self._slots.free()

    def _refill_wait(self, free: int) -> float | None:
        """In a backlog, seconds to let more slots free up before popping; None: go on now.

        Jobs in a backlog are late already; batching their claims drains it faster. A
        job due while there is no backlog is never held back.
        """
        if not self._backlog or free <= 0 or free >= self.concurrency:
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
        now = time.time()
        backlog = False
        first = self._rotation
        self._rotation = (self._rotation + 1) % len(self._lanes)
        # Slots only ever free up meanwhile (this thread alone takes them), so a snapshot
        # under the lock is safe to spend without it.
        with self._cond:
            budget = self._slots.budget()
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
            )
        except DatabaseError:
            # The ids left Redis but no row was claimed: put them back, or they would wait
            # for the next pre-loader pass.
            self.store.add((pk, name, score) for pk, (name, score) in popped.items())
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
        now = time.monotonic()
        started = [Running(job, now + _time_to_run(job).total_seconds()) for job in jobs]
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
        now = timezone.now()
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
            due = run_at if run_at > now else now + LOCKED_RETRY
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
        now = time.time()
        if self.burst and (due is None or due > now) and self._idle():
            return None
        if due is None:
            return idle
        return min(max(due - now, 0.0), idle)

    def _idle(self) -> bool:
        with self._cond:
            return not self._in_flight and self._recorder.pending == 0

    def _claim_time(self) -> datetime:
        """Now, but strictly after the previous claim: the claim's token (see ``claim``)."""
        now = timezone.now()
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
            if timed_out:  # before it even started: its time-out is recorded, do not run it
                return
            outcome = self._run_job(job)
            with self._cond:
                running.finished = True
                timed_out = running.timed_out
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
                _signal_outcome(outcome)
                # Handed over before the slot is freed, so that an idle consumer is never
                # one with an outcome still unrecorded.
                self._recorder.put(outcome)
        finally:
            self._release(running, timed_out)

    def _release(self, running: Running, timed_out: bool) -> None:
        """Give back the slots of an execution whose thread is done with it."""
        job = running.job
        with self._cond:
            if timed_out:
                self._stuck.discard(running)
            else:
                self._in_flight.pop(job.pk, None)
            self._slots.release(job.queue, job.job_type)
            self.processed += 1
            self._wake_seq += 1
            self._cond.notify_all()

    def _run_job(self, job: DelayedJob) -> Outcome:
        error = tb = ""
        retry_at = None
        # The job's own queries get request semantics: CONN_MAX_AGE applies around each job.
        close_old_connections()
        started = timezone.now()
        signals.send(signals.job_started, job)
        try:
            jobtype = registry.get(job.job_type)
            jobtype.execute(job)
        except BaseException as exc:  # a job's SystemExit must not end the consumer
            error = _describe(exc)
            tb = _storable(traceback.format_exc())
            retry_at = self._retry_at(job, exc)
        finished = timezone.now()
        self._log_outcome(job, started, finished, error, retry_at)
        close_old_connections()
        return Outcome(
            job=job,
            worker_id=self.worker_id,
            started_at=started,
            finished_at=finished,
            error=error,
            traceback=tb,
            retry_at=retry_at,
        )

    # Time-outs ------------------------------------------------------------------------

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
                if running.finished:
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
        time_to_run = _time_to_run(job)
        exc = JobTimeout(
            f"attempt {job.attempts} ran past the time_to_run of {job.job_type} "
            f"({time_to_run}); its thread is left to finish on its own"
        )
        if frame is None:
            stack = "(the job had not started in its thread yet)\n"
        else:
            stack = "".join(traceback.format_stack(frame))
        retry_at = self._retry_at(job, exc)
        outcome = Outcome(
            job=job,
            worker_id=self.worker_id,
            started_at=job.started_at or timezone.now(),
            finished_at=timezone.now(),
            error=_describe(exc),
            traceback=_storable(f"Where the job was when it timed out:\n{stack}"),
            retry_at=retry_at,
            timed_out=True,
        )
        self._recorder.put(outcome)
        # Receivers are user code: not on this thread, which claims for every queue.
        threading.Thread(target=_signal_outcome_apart, args=(outcome,), daemon=True).start()
        logger.warning(
            "Job %s %s attempt %d timed out after %s, started %.1f ms after run_at; %s [trace %s]",
            job.pk,
            job.job_type,
            job.attempts,
            time_to_run,
            (outcome.started_at - job.run_at).total_seconds() * 1000,
            f"retrying at {retry_at.isoformat()}" if retry_at else "no retries left, marked failed",
            job.trace_id,
        )

    def _drain(self) -> None:
        """Wait for running jobs to finish, timing out those that run past time_to_run."""
        while True:
            wait = self._time_out_overdue()
            with self._cond:
                if not self._in_flight:
                    return
                self._cond.wait(ERROR_BACKOFF if wait is None else max(wait, 0.001))

    def _retry_at(self, job: DelayedJob, exc: BaseException) -> datetime | None:
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
        if not isinstance(delay, timedelta):
            logger.error(
                "%s.retry_delay() returned %r, not a timedelta or None; not retrying job %s.",
                jobtype.name,
                delay,
                job.pk,
            )
            return None
        return timezone.now() + max(delay, timedelta(0))

    def _log_outcome(
        self,
        job: DelayedJob,
        started: datetime,
        finished: datetime,
        error: str,
        retry_at: datetime | None,
    ) -> None:
        lateness_ms = (started - job.run_at).total_seconds() * 1000
        took_ms = (finished - started).total_seconds() * 1000
        if not error:
            if logger.isEnabledFor(logging.INFO):
                logger.info(
                    "Job %s %s attempt %d succeeded in %.1f ms, started %.1f ms after run_at "
                    "[trace %s]",
                    job.pk,
                    job.job_type,
                    job.attempts,
                    took_ms,
                    lateness_ms,
                    job.trace_id,
                )
        elif retry_at is not None:
            logger.warning(
                "Job %s %s attempt %d failed (%s), started %.1f ms after run_at; retrying at "
                "%s [trace %s]",
                job.pk,
                job.job_type,
                job.attempts,
                error,
                lateness_ms,
                retry_at.isoformat(),
                job.trace_id,
            )
        else:
            logger.error(
                "Job %s %s attempt %d failed (%s), started %.1f ms after run_at; no retries "
                "left, marked failed [trace %s]",
                job.pk,
                job.job_type,
                job.attempts,
                error,
                lateness_ms,
                job.trace_id,
            )

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

    def _probe_redis(self) -> None:
        """In Redis-down mode, tell the main loop as soon as Redis answers again."""
        if (
            self._database_mode
            and not self._redis_back.is_set()
            and time.monotonic() >= self._next_probe
        ):
            self.store.ping()
            self._redis_back.set()
            self.wake()

    def _heartbeat(self) -> None:
        """Renew the leases of running jobs well before they expire."""
        while not self._drained.wait(self._heartbeat_interval()):
            drop_broken_connections()
            try:
                if not presence.beat(
                    self.worker_id, processed=self.processed, database_mode=self._database_mode
                ):
                    self._announce()
            except DatabaseError as exc:
                logger.warning("Could not record the heartbeat (%s); retrying.", exc)
            with self._cond:
                running = [execution.job for execution in self._in_flight.values()]
            if not running:
                continue
            by_lease: dict[timedelta, list[int]] = defaultdict(list)
            for job in running:
                by_lease[_time_to_run(job)].append(job.pk)
            try:
                transitions.renew_leases(by_lease, worker_id=self.worker_id)
            except DatabaseError as exc:
                logger.warning("Could not renew leases (%s); retrying.", exc)
        connections.close_all()

    def _announce(self) -> None:
        """Write this consumer's heartbeat row (the dashboard's list of live consumers)."""
        try:
            presence.announce(self.worker_id, queues=self.queues, concurrency=self.concurrency)
        except DatabaseError as exc:
            logger.warning("Could not record this consumer's heartbeat row (%s).", exc)

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

    # Redis-down mode ------------------------------------------------------------------

    def _database_turn(self) -> float | None:
        """Claim due jobs straight from the database; return how long to sleep."""
        if self._redis_back.is_set() and self._leave_database_mode():
            return 0.0
        interval = settings.DATABASE_POLL_INTERVAL.total_seconds()
        self._reap_expired_leases(interval)
        open_types = self._open_types()
        with self._cond:
            free = self._slots.free()
            open_queues = [
                queue
                for queue in self.queues
                if self._slots.queue_room(queue) > 0 and queue not in self._paused.queues
            ]
        if free > 0 and open_queues and open_types:
            jobs = transitions.claim_due(
                queues=open_queues,
                job_types=open_types,
                limit=free,
                choose=self._choose,
                worker_id=self.worker_id,
                now=self._claim_time(),
                leases=self._leases,
                default_lease=JobType.time_to_run,
            )
            self._start(jobs)
            if jobs:
                return 0.0
        if free <= 0 or not open_queues or not open_types:
            return interval  # a finishing job wakes us
        # Only what could be claimed: a backlog of a type or queue without a free slot must
        # not turn this into a poll every LOCKED_RETRY (a finishing job wakes us).
        claimable = DelayedJob.objects.filter(queue__in=open_queues, job_type__in=open_types)
        due = claimable.next_run_at()
        if due is None or due > timezone.now():
            if self.burst and self._idle():
                return None
            if due is None:
                return interval
            return min((due - timezone.now()).total_seconds(), interval)
        # Due but not claimed: locked by a caller's transaction, or taken by a consumer
        # polling at the same moment. Look again shortly.
        return LOCKED_RETRY.total_seconds()

    def _choose(self, candidates: list[Candidate]) -> list[Candidate]:
        with self._cond:
            fit, _over = self._slots.choose(candidates)
        return fit

    def _reap_expired_leases(self, interval: float) -> None:
        """The pre-loader reaps under a Redis lock, so without Redis the consumers do it."""
        now = time.monotonic()
        if now < self._next_reap:
            return
        self._next_reap = now + interval
        reaped = transitions.reap_expired_leases(timezone.now())
        if reaped:
            logger.warning(
                "Consumer %s: returned %d job(s) whose lease expired to the schedule.",
                self.worker_id,
                len(reaped),
            )

    def _enter_database_mode(self, exc: BaseException) -> None:
        self._database_mode = True
        self._redis_back.clear()
        self._backlog = False
        logger.warning(
            "Consumer %s: Redis unreachable (%s); claiming due jobs from the database every "
            "%g s until it is back.",
            self.worker_id,
            exc,
            settings.DATABASE_POLL_INTERVAL.total_seconds(),
        )

    def _leave_database_mode(self) -> bool:
        """Go back to Redis once it is refilled; False (and stay) if that fails."""
        self._redis_back.clear()
        try:
            refilled = self._refill_redis()
        except RedisError as exc:
            # It answers PING but not writes (read-only replica, out of memory ...).
            self._next_probe = time.monotonic() + REDIS_RETURN_BACKOFF
            if not self._return_failed:
                logger.warning(
                    "Consumer %s: Redis answers again but could not be refilled (%s); staying "
                    "on the database, trying again every %g s.",
                    self.worker_id,
                    exc,
                    REDIS_RETURN_BACKOFF,
                )
                self._return_failed = True
            return False
        self._database_mode = False
        self._return_failed = False
        self._redis_failures = 0
        logger.warning(
            "Consumer %s: Redis is back; claiming from Redis again (%s).", self.worker_id, refilled
        )
        return True

    def _refill_redis(self) -> str:
        """Redis may be back without its data: load the window before relying on it."""
        if self.preload:
            return f"pre-loader pass: {preloader.preload(store=self.store)}"
        # --no-preload: leave reaping and plan() to the pre-loader run elsewhere.
        loaded = preloader.load_window(self.store, timezone.now() + settings.PRELOAD_WINDOW)
        return f"loaded {loaded} job(s) due within the window"

    # Error reporting ------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> float:
        """Log a failure of the main loop; return how long to wait before trying again.

        The first failure is retried at once: usually an idle connection that the server,
        a pooler or the network dropped, which a reconnect mends. A second Redis failure
        switches to Redis-down mode; the database is waited for, with a back-off.
        """
        if isinstance(exc, RedisError):
            self._redis_back.clear()
            if self._database_mode:
                return 0.0  # it failed again on the way back: stay, say nothing new
            self._redis_failures += 1
            if self._redis_failures == 1:
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


_FALLBACK_JOB_TYPE = JobType()


def _time_to_run(job: DelayedJob) -> timedelta:
    try:
        return registry.get(job.job_type).time_to_run
    except UnknownJobType:
        return JobType.time_to_run


def _describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, storable even if its ``__str__`` fails."""
    try:
        message = str(exc)
    except Exception:
        message = "<the exception's str() failed>"
    return _storable(f"{type(exc).__name__}: {message}")


def _storable(text: str) -> str:
    # NUL cannot be stored in a PostgreSQL text column.
    return text.replace("\x00", "\\x00")


def _channel_name(message: dict[str, Any]) -> str:
    channel = message.get("channel", b"")
    return channel.decode() if isinstance(channel, bytes) else str(channel)


def _signal_outcome_apart(outcome: Outcome) -> None:
    """``_signal_outcome`` in a thread of its own, which closes what receivers opened."""
    try:
        _signal_outcome(outcome)
    finally:
        connections.close_all()


def _signal_outcome(outcome: Outcome) -> None:
    """job_succeeded, job_retrying or job_failed (final), as the attempt ended."""
    job = outcome.job
    if outcome.succeeded:
        signals.send(signals.job_succeeded, job, duration=outcome.finished_at - outcome.started_at)
    elif outcome.retry_at is not None:
        signals.send(signals.job_retrying, job, error=outcome.error, retry_at=outcome.retry_at)
    else:
        signals.send(signals.job_failed, job, error=outcome.error, traceback=outcome.traceback)
