"""The consumer's helper threads (the wake listener, the heartbeat) and how its main loop
counts database failures."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connections
from redis import RedisError

from delayjobs import transitions
from delayjobs.core import clock, metrics
from delayjobs.core.db import drop_broken_connections
from delayjobs.engine import presence
from delayjobs.engine.claimer import PauseView
from delayjobs.engine.execution import time_to_run_of
from delayjobs.engine.fallback import RedisFallback
from delayjobs.engine.inflight import InFlight
from delayjobs.engine.recorder import Recorder
from delayjobs.index.keys import control_channel
from delayjobs.index.store import RedisStore
from delayjobs.jobtypes import JobType, registry

logger = logging.getLogger("delayjobs.consumer")

#: Back-off after the database or Redis failed in the main loop.
ERROR_BACKOFF = 1.0


class Listener:
    """Redis pub/sub: wakes the main loop when a sooner job is added (no poll interval), marks
    the pauses stale when they change, and in Redis-down mode notices Redis answer again."""

    def __init__(
        self,
        *,
        store: RedisStore,
        queues: list[str],
        worker_id: str,
        inflight: InFlight,
        pauses: PauseView,
        fallback: RedisFallback,
        stop: threading.Event,
    ) -> None:
        self.store = store
        self.queues = queues
        self.worker_id = worker_id
        self.inflight = inflight
        self.pauses = pauses
        self.fallback = fallback
        self.stop = stop

    def run(self) -> None:
        """Wake the main loop whenever a queue's earliest due time moves earlier."""
        while not self.stop.is_set():
            try:
                pubsub = self.store.subscribe_wake(self.queues)
            except RedisError:
                self.stop.wait(ERROR_BACKOFF)
                continue
            try:
                self.inflight.wake()  # anything published while we were not subscribed is missed
                while not self.stop.is_set():
                    self.fallback.probe()
                    message = pubsub.get_message(timeout=0.5)
                    if message is not None:
                        if _channel_name(message) == control_channel():
                            self.pauses.mark_stale()
                        self.inflight.wake()
            except RedisError:
                self.stop.wait(ERROR_BACKOFF)
            except Exception:
                # This thread alone ends Redis-down mode: it must outlive any surprise.
                logger.exception("Consumer %s: wake listener error; resubscribing", self.worker_id)
                self.stop.wait(ERROR_BACKOFF)
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()


class Heartbeat:
    """Renews the leases of running jobs well before they expire, keeps this consumer's
    row and the clock reading fresh."""

    def __init__(
        self,
        *,
        worker_id: str,
        queues: list[str],
        concurrency: int,
        inflight: InFlight,
        recorder: Recorder,
        fallback: RedisFallback,
        drained: threading.Event,
    ) -> None:
        self.worker_id = worker_id
        self.queues = queues
        self.concurrency = concurrency
        self.inflight = inflight
        self.recorder = recorder
        self.fallback = fallback
        # Set once no job runs any more: leases are renewed until then, so that a job
        # finishing during a graceful shutdown is not taken over by another consumer.
        self.drained = drained
        #: Whether this consumer's row is written (by ``announce``).
        self.announced = False

    def run(self) -> None:
        """Write this consumer's row unless it is, then renew the leases of running jobs
        well before they expire."""
        # Here, not before the first claim: the row tells people and dashboards which
        # consumers live; no claim or lease depends on it.
        if not self.announced:
            self.announce()
        while not self.drained.wait(self._interval()):
            metrics.consumer_beat(self.inflight.held())
            drop_broken_connections()
            self.sync_clock(always=False)
            try:
                if not presence.beat(
                    self.worker_id,
                    processed=self.inflight.processed,
                    database_mode=self.fallback.database_mode,
                    clock_offset=clock.shared.offset(),
                ):
                    self.announce()
            except DatabaseError as exc:
                logger.warning("Could not record the heartbeat (%s); retrying.", exc)
            try:
                self.renew_leases()
            except DatabaseError as exc:
                logger.warning("Could not renew leases (%s); retrying.", exc)
        connections.close_all()

    def renew_leases(self) -> None:
        """Push out the leases of the jobs this consumer runs, and of those it ran whose
        outcomes still wait in the recorder: a lease ends only once the outcome is durable."""
        held = self.inflight.held_jobs()
        held += self.recorder.waiting_jobs()
        if not held:
            return
        by_lease: dict[timedelta, set[int]] = defaultdict(set)
        for job in held:
            by_lease[time_to_run_of(job)].add(job.pk)
        transitions.renew_leases(by_lease, worker_id=self.worker_id)

    def announce(self) -> None:
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
        else:
            self.announced = True

    def sync_clock(self, *, always: bool) -> None:
        """Read the database server's clock, every due and lease decision's time (see
        ``delayjobs.core.clock``): at start, then on the heartbeat once the reading is old."""
        shared = clock.shared
        if always or shared.due():
            offset = shared.sync()
            clock.report_offset(offset, self.worker_id)
            metrics.clock_offset(offset)

    def _interval(self) -> float:
        shortest = min((jt.time_to_run for jt in registry), default=JobType.time_to_run)
        return min(max(shortest.total_seconds() / 3, 0.5), 30.0)


class ErrorState:
    """Database failures of the main loop: each change is logged once."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self._database_failures = 0
        self._database_down = False

    def database_failed(self, exc: DatabaseError) -> float:
        """Note a failure; seconds to wait before trying again. The first is retried at
        once (usually a dropped idle connection, which a reconnect mends)."""
        self._database_failures += 1
        if self._database_failures == 1:
            logger.info("Consumer %s: database error (%s); retrying at once.", self.worker_id, exc)
            return 0.0
        if not self._database_down:
            logger.error("Consumer %s: database unavailable (%s); retrying.", self.worker_id, exc)
            self._database_down = True
        return ERROR_BACKOFF

    def recovered(self) -> None:
        self._database_failures = 0
        if self._database_down:
            logger.warning("Consumer %s: database is back.", self.worker_id)
            self._database_down = False


def _channel_name(message: dict[str, Any]) -> str:
    channel = message.get("channel", b"")
    return channel.decode() if isinstance(channel, bytes) else str(channel)
