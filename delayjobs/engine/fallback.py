"""Redis-down mode of a consumer: a mixin of ``Consumer``.

When Redis cannot be reached twice in a row, or does not answer within its socket timeout
once (frozen, or cut off by a partition that drops packets), the consumer claims due jobs
straight from the database every DATABASE_POLL_INTERVAL (sooner when it knows a job is
due sooner) and reaps expired leases itself, until its listener sees Redis answer again;
then it drops Redis' entries already due and refills it from the rows (it may have come
back empty, or with entries of jobs run from the database meanwhile) and goes back to it.
Each change is logged once.
"""

from __future__ import annotations

import logging
import time

from redis import RedisError

from delayjobs import clock, transitions
from delayjobs.conf import settings
from delayjobs.engine import preloader
from delayjobs.engine.execution import LOCKED_RETRY
from delayjobs.engine.slots import Candidate
from delayjobs.engine.state import ConsumerState
from delayjobs.jobtypes import JobType
from delayjobs.models import DelayedJob

logger = logging.getLogger("delayjobs.consumer")

#: Redis-down mode: after Redis answered but refilling it failed, wait this long before
#: trying to go back to it again.
REDIS_RETURN_BACKOFF = 5.0


class DatabaseMode(ConsumerState):
    """Mixed into ``Consumer``, whose state (slots, pauses, store, queues) it uses."""

    def _database_turn(self) -> float | None:
        """Claim due jobs straight from the database; return how long to sleep."""
        if self._redis_back.is_set() and self._leave_database_mode():
            return 0.0
        interval = settings.DATABASE_POLL_INTERVAL.total_seconds()
        self._reap_expired_leases(interval)
        open_types = self._open_types()
        with self._cond:
            free = self._claimable()
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
        if due is None or due > clock.now():
            if self.burst and self._idle():
                return None
            if due is None:
                return interval
            return min((due - clock.now()).total_seconds(), interval)
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
        reaped = transitions.reap_expired_leases(clock.now())
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
        """Make Redis right again before relying on it: drop its entries already due, then
        load the window from the rows (due jobs included).

        Redis may be back without its data (a restart), or with entries of jobs that ran
        from the database meanwhile (a Sentinel failover promotes a replica that has
        them). Those would be popped, found finished and dropped a few at a time, ahead
        of every job really due: after a failover with 700 of them, jobs ran up to a
        second late. The rows say which due jobs are still to run.
        """
        now = clock.now()
        dropped = self.store.drop_due(self._lanes, now.timestamp())
        done = f"dropped {dropped} due entr{'y' if dropped == 1 else 'ies'}"
        if self.preload:
            result = preloader.preload(store=self.store, now=now)
            if result.ran:
                return f"{done}, pre-loader pass: {result}"
        # --no-preload leaves reaping and plan() to the pre-loader run elsewhere. A pass
        # skipped for the lock (a pass elsewhere, or a lock a failed master replicated)
        # must not leave the due jobs just dropped out until the next one: load them here.
        loaded = preloader.load_window(self.store, now + settings.PRELOAD_WINDOW)
        return f"{done}, loaded {loaded} job(s) due within the window"

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
