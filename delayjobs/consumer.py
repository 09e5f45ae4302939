"""The consumer: pop due ids, claim their rows, run them in a bounded pool, record outcomes.

Threads of one consumer process:
- main: the loop below; it sleeps until the earliest due time it knows of;
- listener: Redis pub/sub; wakes main when a sooner job is added (no poll interval);
- workers (``concurrency`` of them): run ``JobType.execute``;
- recorder: writes outcomes in batches;
- heartbeat: renews the leases of running jobs;
- pre-loader: a pass every PRELOAD_INTERVAL (one process at a time, by a Redis lock).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import traceback
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from types import FrameType

from django.db import DatabaseError, close_old_connections, connections
from django.utils import timezone
from redis import RedisError

from delayjobs import preloader, transitions
from delayjobs.conf import settings
from delayjobs.db import drop_broken_connections
from delayjobs.exceptions import UnknownJobType
from delayjobs.handoff import index_due_soon
from delayjobs.jobtypes import JobType, registry
from delayjobs.models import DelayedJob, JobStatus
from delayjobs.recorder import Recorder
from delayjobs.redis_store import RedisStore, describe_target, get_store
from delayjobs.transitions import Outcome

logger = logging.getLogger("delayjobs.consumer")

#: Back-off after the database or Redis failed in the main loop.
ERROR_BACKOFF = 1.0
#: In a backlog, how long a free slot may wait for others to free up, so that one claim
#: fills many slots instead of one claim (a Redis and a database round trip) per slot.
REFILL_WAIT = 0.002
#: A due job whose row was locked by a caller's open transaction is tried again after this.
LOCKED_RETRY = timedelta(milliseconds=50)


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

        self._cond = threading.Condition()
        self._wake_seq = 0  # bumped by anything that should end the main loop's sleep
        self._stopping = False
        self._stop_event = threading.Event()  # the same, for the helper threads
        # Set once no job runs any more: the heartbeat renews leases until then, so that
        # a job finishing during a graceful shutdown is not taken over by another consumer.
        self._drained = threading.Event()
        self._in_flight: dict[int, DelayedJob] = {}
        self._last_claim: datetime | None = None
        self._job_types = registry.names()
        self._leases = {
            jobtype.name: jobtype.time_to_run
            for jobtype in registry
            if jobtype.time_to_run != JobType.time_to_run
        }
        self._unknown_types: set[str] = set()  # warned about once each
        self._rotation = 0  # which queue pops first: no queue starves the others
        self._consecutive_failures = 0
        self._backlog = False  # the last pop left due jobs behind
        self._refill_deadline: float | None = None
        self._failing: str | None = None  # what is down, logged once per change
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="delayjobs-worker")
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
        return 0

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
        self._pool.shutdown(wait=True)
        self._drained.set()
        self._recorder.stop()
        for thread in self._threads:
            thread.join(timeout=10)
        connections.close_all()
        logger.info("Consumer %s stopped after %d job(s).", self.worker_id, self.processed)

    # Main loop ------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping:
            with self._cond:
                seen = self._wake_seq
            try:
                free = self.concurrency - len(self._in_flight)
                timeout = self._refill_wait(free)
                if timeout is None:
                    if free > 0 and self._claim_and_start(free):
                        self._recovered()
                        continue  # more may be due right now: look again before sleeping
                    timeout = self._time_to_next(free)
                self._recovered()
            except (DatabaseError, RedisError) as exc:
                drop_broken_connections()
                timeout = self._failed(exc)
            if timeout is None:  # burst mode and nothing left to do
                return
            with self._cond:
                if not self._stopping and self._wake_seq == seen:
                    self._cond.wait(timeout)

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

    def _claim_and_start(self, free: int) -> int:
        popped: dict[int, tuple[str, float]] = {}
        now = time.time()
        backlog = False
        first = self._rotation
        self._rotation = (self._rotation + 1) % len(self.queues)
        for queue in self.queues[first:] + self.queues[:first]:
            taken, more_due = self.store.pop_due(queue, now, free - len(popped))
            backlog = backlog or more_due
            for pk, score in taken:
                popped[pk] = (queue, score)
            if len(popped) >= free:
                break
        self._backlog = backlog
        if not popped:
            return 0
        try:
            jobs = transitions.claim(
                list(popped),
                worker_id=self.worker_id,
                now=self._claim_time(),
                job_types=self._job_types,
                leases=self._leases,
                default_lease=JobType.time_to_run,
            )
        except DatabaseError:
            # The ids left Redis but no row was claimed: put them back, or they would wait
            # for the next pre-loader pass.
            self.store.add((pk, queue, score) for pk, (queue, score) in popped.items())
            raise
        # Claimed rows run before anything else can fail: a claimed job left unstarted
        # would only come back after its lease, with an attempt spent.
        with self._cond:
            for job in jobs:
                self._in_flight[job.pk] = job
        for job in jobs:
            self._pool.submit(self._execute, job)
        if len(jobs) < len(popped):
            claimed = {job.pk for job in jobs}
            try:
                self._reindex_unclaimed([pk for pk in popped if pk not in claimed])
            except DatabaseError:
                logger.warning("Could not re-index unclaimed jobs; the pre-loader will.")
        return len(jobs)

    def _reindex_unclaimed(self, ids: list[int]) -> None:
        """Ids popped but not claimed: put back those that should run later.

        Cancelled, finished or taken by another consumer: dropped. Still scheduled: moved
        later (back at its time), locked by a caller's open transaction (back in a
        moment), or of a job type this consumer does not know (left to the pre-loader,
        and so to a consumer that knows it).
        """
        now = timezone.now()
        entries = []
        rows = DelayedJob.objects.filter(pk__in=ids, status=JobStatus.SCHEDULED).order_by()
        for pk, queue, run_at, job_type in rows.values_list("pk", "queue", "run_at", "job_type"):
            if job_type not in self._job_types:
                self._warn_unknown_type(job_type)
                continue
            due = run_at if run_at > now else now + LOCKED_RETRY
            entries.append((pk, queue, due.timestamp()))
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
        if free <= 0:
            return idle  # a finishing job wakes us
        due = self.store.next_due(self.queues)
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

    def _execute(self, job: DelayedJob) -> None:
        """Run one claimed job in a worker thread and hand its outcome to the recorder."""
        try:
            self._recorder.put(self._run_job(job))
        finally:
            with self._cond:
                self._in_flight.pop(job.pk, None)
                self.processed += 1
                self._wake_seq += 1
                self._cond.notify_all()

    def _run_job(self, job: DelayedJob) -> Outcome:
        error = tb = ""
        retry_at = None
        # The job's own queries get request semantics: CONN_MAX_AGE applies around each job.
        close_old_connections()
        started = timezone.now()
        try:
            jobtype = registry.get(job.job_type)
            jobtype.execute(job)
        except BaseException as exc:  # a job's SystemExit must not end the consumer
            # NUL cannot be stored in a PostgreSQL text column.
            error = f"{type(exc).__name__}: {exc}".replace("\x00", "\\x00")
            tb = traceback.format_exc().replace("\x00", "\\x00")
            retry_at = self._retry_at(job, exc)
        finished = timezone.now()
        close_old_connections()
        self._log_outcome(job, started, finished, error, retry_at)
        return Outcome(
            job=job,
            worker_id=self.worker_id,
            started_at=started,
            finished_at=finished,
            error=error,
            traceback=tb,
            retry_at=retry_at,
        )

    def _retry_at(self, job: DelayedJob, exc: BaseException) -> datetime | None:
        if job.max_attempts is not None and job.attempts >= job.max_attempts:
            return None
        try:
            jobtype = registry.get(job.job_type)
        except UnknownJobType:
            jobtype = _FALLBACK_JOB_TYPE
        try:
            delay = jobtype.retry_delay(job, exc)
        except Exception:
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
                "Job %s %s attempt %d failed (%s); retrying at %s [trace %s]",
                job.pk,
                job.job_type,
                job.attempts,
                error,
                retry_at.isoformat(),
                job.trace_id,
            )
        else:
            logger.error(
                "Job %s %s attempt %d failed (%s); no retries left, marked failed [trace %s]",
                job.pk,
                job.job_type,
                job.attempts,
                error,
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
                    if pubsub.get_message(timeout=0.5) is not None:
                        self.wake()
            except RedisError:
                self._stop_event.wait(ERROR_BACKOFF)
            finally:
                pubsub.close()

    def _heartbeat(self) -> None:
        """Renew the leases of running jobs well before they expire."""
        while not self._drained.wait(self._heartbeat_interval()):
            with self._cond:
                running = list(self._in_flight.values())
            if not running:
                continue
            by_lease: dict[timedelta, list[int]] = defaultdict(list)
            for job in running:
                by_lease[_time_to_run(job)].append(job.pk)
            drop_broken_connections()
            try:
                transitions.renew_leases(by_lease, worker_id=self.worker_id)
            except DatabaseError as exc:
                logger.warning("Could not renew leases (%s); retrying.", exc)
        connections.close_all()

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
        a pooler or the network dropped, which a reconnect mends. Then back off.
        """
        what = "database" if isinstance(exc, DatabaseError) else "Redis"
        self._consecutive_failures += 1
        if self._consecutive_failures == 1:
            logger.info("Consumer %s: %s error (%s); retrying at once.", self.worker_id, what, exc)
            return 0.0
        if self._failing != what:
            logger.error("Consumer %s: %s unavailable (%s); retrying.", self.worker_id, what, exc)
            self._failing = what
        return ERROR_BACKOFF

    def _recovered(self) -> None:
        self._consecutive_failures = 0
        if self._failing is not None:
            logger.warning("Consumer %s: %s is back.", self.worker_id, self._failing)
            self._failing = None


_FALLBACK_JOB_TYPE = JobType()


def _time_to_run(job: DelayedJob) -> timedelta:
    try:
        return registry.get(job.job_type).time_to_run
    except UnknownJobType:
        return JobType.time_to_run
