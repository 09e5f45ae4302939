"""The consumer: pop due ids, claim their rows, run them in a bounded pool, record outcomes.

Threads of one consumer process:
- main: the loop below; it sleeps until the earliest due time it knows of, and times out
  executions that run past their job type's ``time_to_run``;
- listener: Redis pub/sub; wakes main when a sooner job is added (no poll interval); in
  Redis-down mode it also notices when Redis answers again;
- workers (up to ``concurrency`` daemon threads, started as needed): run sync
  ``JobType.execute``;
- event loop (one thread, started with the first async job): runs ``async def execute``;
- recorder: writes outcomes in batches;
- heartbeat: renews the leases of running jobs;
- pre-loader: a pass every PRELOAD_INTERVAL (one process at a time, by a Redis lock),
  the first once the main loop has claimed what Redis already held.

Redis-down mode: when Redis fails twice in a row (or times out once), main claims due jobs
straight from the database every DATABASE_POLL_INTERVAL (sooner when it knows a job is
due sooner) and reaps expired leases itself, until the listener sees Redis answer again;
then main drops Redis' entries already due (a promoted replica has those of jobs run from
the database meanwhile), one pre-loader pass refills Redis (it may have come back empty)
and main goes back to Redis. Each change of mode is logged once.

The loop below is only the producer: ``inflight`` (the one lock: claimed executions and
their slots), the fetchers (``fetch_redis``, ``fetch_database``, chosen by ``fallback``),
the executor (``executors``; Celery's in contrib, named by dotted path), ``timeouts`` and
the helper threads (``helpers``) do the rest; what one execution is, in ``execution``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterable
from types import FrameType

from django.db import DatabaseError, connections
from redis import RedisError

from delayjobs.conf import EXECUTORS, settings
from delayjobs.core import metrics, tracing
from delayjobs.core.db import drop_broken_connections
from delayjobs.engine import preloader, presence
from delayjobs.engine.claimer import Claims, PauseView
from delayjobs.engine.contended import Contended, groups
from delayjobs.engine.executors import executor_class
from delayjobs.engine.fallback import RedisFallback
from delayjobs.engine.fetch_database import DatabaseFetcher
from delayjobs.engine.fetch_redis import RedisFetcher
from delayjobs.engine.helpers import ERROR_BACKOFF, ErrorState, Heartbeat, Listener
from delayjobs.engine.inflight import PREFETCH, PREFETCH_BUDGET, InFlight
from delayjobs.engine.limited import release_slots
from delayjobs.engine.recorder import Recorder
from delayjobs.engine.reserved import ReservedRoom
from delayjobs.engine.slots import Slots
from delayjobs.engine.successors import fill_freed_slots
from delayjobs.engine.timeouts import EXIT_STUCK, TimeOuts
from delayjobs.index.client import describe_target
from delayjobs.index.handoff import index_due_soon
from delayjobs.index.store import RedisStore, get_store
from delayjobs.jobtypes import JobType, registry
from delayjobs.lanes import lanes, limited_types
from delayjobs.models import DelayedJob
from delayjobs.transitions import Outcome, drop_reservations

__all__ = ["EXIT_STUCK", "PREFETCH", "PREFETCH_BUDGET", "Consumer", "default_worker_id"]

logger = logging.getLogger("delayjobs.consumer")

#: The GIL is handed between threads at most this often (CPython's default is 5 ms). A
#: worker waking up to start a due job waits for it while another thread runs Python, so
#: the default would make a job up to 5 ms late whenever the recorder or a claim is busy.
SWITCH_INTERVAL = 0.0005


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def _no_wake() -> None:
    pass


def _earliest(first: float | None, second: float | None) -> float | None:
    if first is None:
        return second
    return first if second is None else min(first, second)


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
        executor: str | None = None,
        celery_app: str | None = None,
    ) -> None:
        self.queues = sorted(set(queues or registry.queues() or ["default"]))
        self.concurrency = concurrency or settings.CONCURRENCY
        self.burst = burst
        self.preload = preload
        self.worker_id = worker_id or default_worker_id()
        # "local": jobs run in this process's threads; "celery": each claimed job is
        # published as a Celery task (see delayjobs.contrib.celery.executor).
        self.executor = executor or settings.EXECUTOR
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {self.executor!r}")
        executor_type = executor_class(self.executor)
        # Checked now, before anything is claimed (the Celery executor's broker).
        executor_type.prepare(celery_app)
        self.store = store or get_store()
        self.exit_code = 0
        self._stopping = False
        self._stop_requested_by: str | None = None  # the signal, for the log
        self._stop_event = threading.Event()  # the same, for the helper threads
        self._drained = threading.Event()
        self._threads: list[threading.Thread] = []
        #: What ``run`` leaves until the main loop's first turn has claimed what was due.
        self._after_first_turn: Callable[[], None] | None = None
        self.inflight = InFlight(
            concurrency=self.concurrency,
            slots=Slots(
                self.concurrency * PREFETCH,
                queue_limits=settings.QUEUE_CONCURRENCY,
                type_limits={jt.name: jt.concurrency for jt in registry if jt.concurrency},
            ),
            longest_sleep=max(
                settings.IDLE_TIMEOUT.total_seconds(),
                settings.DATABASE_POLL_INTERVAL.total_seconds(),
                ERROR_BACKOFF,
            ),
            limited_types=limited_types(),
        )
        # Keys whose jobs wait for a slot: the outcomes that free one are written by the
        # main loop, with the claim of the jobs waiting (delayjobs.engine.successors).
        self.contended = Contended()
        limited = bool(limited_types())
        # Only a burst waits for the recorder (it ends once every outcome is written):
        # otherwise a written batch is no reason to wake the main loop.
        self.recorder = Recorder(
            on_retries=index_due_soon,
            on_idle=self.inflight.wake if burst else _no_wake,
            # Only a consumer of types with fleet-wide limits looks at each outcome for them.
            on_freed=self._slots_freed if limited else None,
            route=self._routed_to_successors if limited else None,
            on_routed=self.inflight.wake,
        )
        self.executor_impl = executor_type(
            inflight=self.inflight,
            recorder=self.recorder,
            worker_id=self.worker_id,
            concurrency=self.concurrency,
        )
        self.pauses = PauseView(self.worker_id)
        # A claim's worth of this consumer's slots: what a limit with room is asked for.
        self.reserved = ReservedRoom(want=self.concurrency * PREFETCH)
        claims = Claims(
            worker_id=self.worker_id,
            ahead=settings.CLAIM_AHEAD,
            job_types=registry.names(),
            leases={
                jobtype.name: jobtype.time_to_run
                for jobtype in registry
                if jobtype.time_to_run != JobType.time_to_run
            },
            burst=burst,
            inflight=self.inflight,
            executor=self.executor_impl,
            recorder=self.recorder,
            pauses=self.pauses,
            reserved=self.reserved,
            contended=self.contended,
            limited=limited_types(),
        )
        # Each queue's lanes (see delayjobs.lanes); which one pops first rotates, so that
        # no queue starves the others.
        queue_lanes = [name for queue in self.queues for name in lanes(queue)]
        self.fallback = RedisFallback(
            store=self.store,
            lanes=queue_lanes,
            preload=preload,
            worker_id=self.worker_id,
            wake=self.inflight.wake,
        )
        self.fetch_redis = RedisFetcher(
            store=self.store, lanes=queue_lanes, claims=claims, fallback=self.fallback
        )
        self.fetch_database = DatabaseFetcher(queues=self.queues, claims=claims)
        self.timeouts = TimeOuts(
            inflight=self.inflight,
            recorder=self.recorder,
            worker_id=self.worker_id,
            concurrency=self.concurrency,
        )
        self.errors = ErrorState(self.worker_id)
        self.listener = Listener(
            store=self.store,
            queues=self.queues,
            worker_id=self.worker_id,
            inflight=self.inflight,
            pauses=self.pauses,
            fallback=self.fallback,
            stop=self._stop_event,
        )
        self.heartbeat = Heartbeat(
            worker_id=self.worker_id,
            queues=self.queues,
            concurrency=self.concurrency,
            inflight=self.inflight,
            recorder=self.recorder,
            fallback=self.fallback,
            drained=self._drained,
        )

    def _slots_freed(self, jobs: list[DelayedJob]) -> None:
        """Jobs of limited types ended: their reserved slots are free again, and the jobs
        their limits held are woken, with this consumer's loop at once if there were any
        (it need not wait to hear of it from Redis, as the others do). Not otherwise: in a
        backlog the loop waits for enough free slots to claim a batch (see
        ``RedisFetcher._refill_wait``), and a wake-up per written batch would cut that
        short into claims of a few jobs each."""
        self.reserved.finished(jobs)
        if release_slots(jobs):
            # Jobs were waiting: the next outcomes of these keys go to the main loop.
            self.contended.mark(groups(jobs))
            self.inflight.wake()

    def _routed_to_successors(self, outcome: Outcome) -> bool:
        return self.contended.covers(outcome.job)

    @property
    def processed(self) -> int:
        return self.inflight.processed

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
        # Before the first claim: every claim and lease is timed on the database's clock.
        # What needs no claim to wait for it comes after: the heartbeat thread writes this
        # consumer's row, and the pre-loader's first pass starts once the loop has claimed
        # what Redis already holds (a burst waits for it: it ends when nothing is due).
        self.heartbeat.sync_clock(always=True)
        if self.burst:
            # A drain, whose start nobody waits on: its row written and withdrawn on the
            # caller's connection. Called in a project's test, inside its transaction, the
            # row then goes with the rollback; written from the heartbeat thread's own
            # connection, it would outlive it, a live consumer to every later test.
            self.heartbeat.announce()
        metrics.consumer_running(True)
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(switch_interval, SWITCH_INTERVAL))
        self.recorder.start()
        self._start_thread(self.listener.run, "delayjobs-listener")
        self._start_thread(self.heartbeat.run, "delayjobs-heartbeat")
        if self.preload:
            if self.burst:
                self._preload_once()
            else:
                self._after_first_turn = self._start_preloader
        # OpenTelemetry's import (some 10 ms, when it is installed) runs in a thread of
        # its own while the first turn waits on its claim's round trips, not before it
        # (delayjobs.core.tracing): the first job then finds it done, or nearly. Joined
        # at shutdown, like every thread of the consumer.
        if not tracing.decided():
            self._start_thread(tracing.decide, "delayjobs-tracing-import")
        try:
            self.loop()
        finally:
            self._shutdown()
            sys.setswitchinterval(switch_interval)
        return self.exit_code

    def request_stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        """First call: claim nothing more and let running jobs finish. Second: leave now.

        A signal handler runs in the main thread between two steps of the main loop,
        perhaps halfway through a turn that is about to claim. So this only asks the loop
        to stop; the loop says "claiming no more" once its turn is over, when it is true.
        """
        name = signal.Signals(signum).name if signum else "stop request"
        if self._stopping:
            logger.warning("%s again: exiting now; running jobs return after their lease.", name)
            os._exit(1)
        self._stop_requested_by = name
        self._stopping = True
        self._stop_event.set()
        self.wake()

    def wake(self) -> None:
        self.inflight.wake()

    def _start_thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _shutdown(self) -> None:
        self._stopping = True
        self._stop_event.set()
        # The main loop writes no more outcomes: the recorder writes them all, and wakes
        # the jobs their slots were waited for by, as it does any other's.
        self.contended.close()
        self.recorder.reroute()
        self.timeouts.drain()
        self.executor_impl.stop()
        self._drained.set()
        self.recorder.stop()
        for thread in self._threads:
            thread.join(timeout=10)
        try:
            presence.withdraw(self.worker_id)
        except DatabaseError as exc:
            logger.warning("Could not remove this consumer's heartbeat row (%s).", exc)
        if limited_types():
            try:
                drop_reservations(self.reserved.holder)
            except DatabaseError as exc:
                # They end by themselves within seconds (SLOTS_TTL).
                logger.warning("Could not give back this consumer's reserved slots (%s).", exc)
        connections.close_all()
        metrics.consumer_running(False)
        logger.info("Consumer %s stopped after %d job(s).", self.worker_id, self.processed)

    # Main loop ------------------------------------------------------------------------

    def loop(self) -> None:
        """The main loop alone (``run`` starts the helper threads around it): look for
        time-outs, claim what is due and start it, sleep until the next thing to do."""
        while not self._stopping:
            seen = self.inflight.seq()
            next_timeout: float | None = None
            try:
                next_timeout, filled = self.timeouts.check()
                if filled and not self._stopping:
                    self._stop_stuck(filled)
                next_timeout = _earliest(next_timeout, self.executor_impl.poll())
                self.pauses.refresh()
                if self.recorder.routed:
                    fill_freed_slots(self.fetch_redis, self.recorder)
                wait = self.executor_impl.hold_off() or self.fallback.turn(
                    self.fetch_redis, self.fetch_database
                )
                self.errors.recovered()
            except RedisError as exc:
                drop_broken_connections()
                self.fetch_redis.forget_backlog()
                wait = self.fallback.redis_failed(exc)
            except DatabaseError as exc:
                drop_broken_connections()
                wait = self.errors.database_failed(exc)
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
            if self._after_first_turn is not None:
                start, self._after_first_turn = self._after_first_turn, None
                start()
            if wait is None:  # burst mode and nothing left to do
                break
            wait = _earliest(wait, next_timeout)
            if wait is not None and wait > 0:
                self.inflight.sleep(seen, wait, lambda: self._stopping)
        if self._stop_requested_by is not None:
            logger.warning(
                "%s: finishing %d running job(s), claiming no more (again to exit at once).",
                self._stop_requested_by,
                self.inflight.count(),
            )

    def _stop_stuck(self, filled: str) -> None:
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

    def _start_preloader(self) -> None:
        self._start_thread(self._preload_forever, "delayjobs-preloader")

    def _preload_forever(self) -> None:
        preloader.run_forever(self._stop_event)
        connections.close_all()

    def _preload_once(self) -> None:
        try:
            result = preloader.preload(store=self.store)
            logger.info("Pre-loader pass: %s", result)
        except (DatabaseError, RedisError) as exc:
            logger.error("Pre-loader pass failed: %s", exc)
