"""Redis-down mode of a consumer: when to fetch from the database instead of Redis.

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
import threading
import time
from collections.abc import Callable
from typing import Protocol

from redis import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayjobs.conf import settings
from delayjobs.core import clock
from delayjobs.engine import preloader
from delayjobs.index.store import RedisStore
from delayjobs.index.window import load_window
from delayjobs.pauses import paused

logger = logging.getLogger("delayjobs.consumer")

#: Redis-down mode: after Redis answered but refilling it failed, wait this long before
#: trying to go back to it again.
REDIS_RETURN_BACKOFF = 5.0


class Fetcher(Protocol):
    def turn(self) -> float | None:
        """Claim what is due and start it; seconds to sleep (0: look again now; None: a
        burst run is done)."""


class RedisFallback:
    """Which fetcher the main loop uses: Redis, or the database while Redis is down. The
    listener thread probes Redis meanwhile (``probe``) and the loop goes back to it."""

    def __init__(
        self,
        *,
        store: RedisStore,
        lanes: list[str],
        preload: bool,
        worker_id: str,
        wake: Callable[[], None],
    ) -> None:
        self.store = store
        self.lanes = lanes
        self.preload = preload
        self.worker_id = worker_id
        self._wake = wake
        self._redis_failures = 0
        # Redis-down mode: claiming from the database until the listener sets _redis_back.
        self.database_mode = False
        self._redis_back = threading.Event()
        self._next_probe = 0.0  # monotonic time before which the listener does not probe
        self._return_failed = False  # logged once per streak

    def turn(self, redis: Fetcher, database: Fetcher) -> float | None:
        """One fetching turn, from Redis or, in Redis-down mode, from the database."""
        if not self.database_mode:
            return redis.turn()
        if self._redis_back.is_set() and self._leave():
            return 0.0
        return database.turn()

    def redis_answered(self) -> None:
        """Redis answered a pop: a streak of failures is over."""
        self._redis_failures = 0

    def redis_failed(self, exc: RedisError) -> float:
        """Note a failed Redis call of the main loop; seconds to wait before trying again.

        The first failure is retried at once: usually an idle connection that the server,
        a pooler or the network dropped, which a reconnect mends. A second failure, or a
        first that is a time-out, switches to Redis-down mode.
        """
        self._redis_back.clear()
        if self.database_mode:
            return 0.0  # it failed again on the way back: stay, say nothing new
        self._redis_failures += 1
        # A time-out is conclusive at once: it already waited the whole socket timeout
        # (Redis frozen, or the network dropping packets), and a retry would only wait
        # it out again before the fallback, doubling every job's lateness.
        if self._redis_failures == 1 and not isinstance(exc, RedisTimeoutError):
            logger.info("Consumer %s: Redis error (%s); retrying at once.", self.worker_id, exc)
        else:
            self._enter(exc)
        return 0.0

    def _enter(self, exc: BaseException) -> None:
        self.database_mode = True
        self._redis_back.clear()
        logger.warning(
            "Consumer %s: Redis unreachable (%s); claiming due jobs from the database every "
            "%g s until it is back.",
            self.worker_id,
            exc,
            settings.DATABASE_POLL_INTERVAL.total_seconds(),
        )

    def _leave(self) -> bool:
        """Go back to Redis once it is refilled; False (and stay) if that fails."""
        self._redis_back.clear()
        try:
            refilled = self._refill()
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
        self.database_mode = False
        self._return_failed = False
        self._redis_failures = 0
        logger.warning(
            "Consumer %s: Redis is back; claiming from Redis again (%s).", self.worker_id, refilled
        )
        return True

    def _refill(self) -> str:
        """Make Redis right again before relying on it: drop its entries already due, then
        load the window from the rows (due jobs included).

        Redis may be back without its data (a restart), or with entries of jobs that ran
        from the database meanwhile (a Sentinel failover promotes a replica that has
        them). Those would be popped, found finished and dropped a few at a time, ahead
        of every job really due: after a failover with 700 of them, jobs ran up to a
        second late. The rows say which due jobs are still to run.
        """
        now = clock.now()
        dropped = self.store.drop_due(self.lanes, now.timestamp())
        done = f"dropped {dropped} due entr{'y' if dropped == 1 else 'ies'}"
        if self.preload:
            result = preloader.preload(store=self.store, now=now)
            if result.ran:
                return f"{done}, pre-loader pass: {result}"
        # --no-preload leaves reaping and plan() to the pre-loader run elsewhere. A pass
        # skipped for the lock (a pass elsewhere, or a lock a failed master replicated)
        # must not leave the due jobs just dropped out until the next one: load them here.
        horizon = now + settings.PRELOAD_WINDOW
        loaded = load_window(self.store, horizon, leave_out=paused().matching())
        return f"{done}, loaded {loaded} job(s) due within the window"

    def probe(self) -> None:
        """In Redis-down mode, tell the main loop as soon as Redis answers again."""
        if (
            self.database_mode
            and not self._redis_back.is_set()
            and time.monotonic() >= self._next_probe
        ):
            self.store.ping()
            self._redis_back.set()
            self._wake()
