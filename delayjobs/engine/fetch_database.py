"""Fetching from the database: claim due rows straight from the table (Redis-down mode).

The pre-loader reaps expired leases and makes recurring schedules' ticks into jobs under a
Redis lock; without Redis, the consumers do both themselves: reaping every
DATABASE_POLL_INTERVAL, ticks every PRELOAD_INTERVAL (the schedule's cursor, not a lock,
keeps each tick to one job, however many consumers do it at once).
"""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError

from delayjobs import transitions
from delayjobs.conf import settings
from delayjobs.core import clock, tracing
from delayjobs.engine.claimer import Claims
from delayjobs.engine.execution import LOCKED_RETRY
from delayjobs.engine.limited import claim_limited
from delayjobs.jobtypes import JobType
from delayjobs.models import DelayedJob
from delayjobs.recurring.ticks import materialise_schedules

logger = logging.getLogger("delayjobs.consumer")


class DatabaseFetcher:
    """Claims due jobs from the rows, within the same slots and pauses as from Redis."""

    def __init__(self, *, queues: list[str], claims: Claims) -> None:
        self.queues = queues
        self.claims = claims
        self._next_reap = 0.0
        self._next_ticks = 0.0

    def turn(self) -> float | None:
        """Claim due jobs straight from the database; return how long to sleep."""
        interval = settings.DATABASE_POLL_INTERVAL.total_seconds()
        self._reap_expired_leases(interval)
        self._make_ticks()
        claims = self.claims
        open_types = claims.plain_types()
        limited_types = claims.limited_types()
        free, open_queues = claims.inflight.open_queues(self.queues, claims.pauses.current)
        if free > 0 and open_queues and (open_types or limited_types):
            jobs = transitions.claim_due(
                queues=open_queues,
                job_types=open_types,
                limit=free,
                choose=claims.inflight.choose,
                worker_id=claims.worker_id,
                now=claims.claim_time(),
                leases=claims.leases,
                default_lease=JobType.time_to_run,
            )
            claims.start(jobs)
            room = max(map(claims.inflight.limited_room, limited_types), default=0)
            if room > 0:
                # Without Redis nothing parks a held job: it is simply asked about again
                # at the next poll, or when a job of this consumer ends.
                ids = transitions.due_limited_ids(
                    queues=open_queues,
                    job_types=limited_types,
                    limit=room,
                    now=clock.now(),
                )
                jobs += claim_limited(claims, ids, park=False)[0]
            if jobs:
                return 0.0
        if free <= 0 or not open_queues or not (open_types or limited_types):
            return interval  # a finishing job wakes us
        # Only what could be claimed: a backlog of a type or queue without a free slot must
        # not turn this into a poll every LOCKED_RETRY (a finishing job wakes us). Jobs held
        # by a fleet-wide limit are due: they are asked about again every LOCKED_RETRY.
        claimable = DelayedJob.objects.filter(
            queue__in=open_queues, job_type__in=open_types + limited_types
        )
        due = claimable.next_run_at()
        if due is None or due > clock.now():
            if claims.burst and claims.idle():
                return None
            if due is None:
                return interval
            return min((due - clock.now()).total_seconds(), interval)
        # Due but not claimed: locked by a caller's transaction, or taken by a consumer
        # polling at the same moment. Look again shortly.
        return LOCKED_RETRY.total_seconds()

    def _make_ticks(self) -> None:
        """Recurring schedules keep ticking while Redis is down: their jobs are rows."""
        now = time.monotonic()
        if now < self._next_ticks:
            return
        self._next_ticks = now + settings.PRELOAD_INTERVAL.total_seconds()
        errors: list[str] = []
        moment = clock.now()
        try:
            made = materialise_schedules(moment, moment + settings.PRELOAD_WINDOW, errors)
        except DatabaseError:
            raise  # the consumer's own handling of a database away
        except Exception:  # broken schedules must not stop the claiming of due jobs
            logger.exception("Consumer %s: recurring schedules failed", self.claims.worker_id)
            return
        if made or errors:
            logger.info(
                "Consumer %s: made %d recurring tick(s) into jobs without Redis%s",
                self.claims.worker_id,
                made,
                f" ({'; '.join(errors)})" if errors else "",
            )

    def _reap_expired_leases(self, interval: float) -> None:
        """The pre-loader reaps under a Redis lock, so without Redis the consumers do it."""
        now = time.monotonic()
        if now < self._next_reap:
            return
        self._next_reap = now + interval
        with tracing.internal("delayjobs reap") as span:
            reaped = transitions.reap_expired_leases(clock.now())
            span.count(reaped=len(reaped))
        if reaped:
            logger.warning(
                "Consumer %s: returned %d job(s) whose lease expired to the schedule.",
                self.claims.worker_id,
                len(reaped),
            )
