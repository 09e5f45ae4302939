"""Fetching from Redis: pop the due ids of each lane, claim their rows, start them.

The lanes (see ``delayjobs.lanes``) are popped in a rotating order so that no queue
starves the others; a pop that leaves due jobs behind marks a backlog, in which claims
are batched (``REFILL_WAIT``) so that one claim fills many slots.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.db import DatabaseError
from redis import RedisError

from delayjobs import transitions
from delayjobs.conf import settings
from delayjobs.core import clock
from delayjobs.engine.claimer import Claims
from delayjobs.engine.execution import LOCKED_RETRY
from delayjobs.engine.fallback import RedisFallback
from delayjobs.engine.limited import claim_limited
from delayjobs.index.handoff import index_due_soon
from delayjobs.index.store import RedisStore
from delayjobs.jobtypes import JobType, registry
from delayjobs.lanes import index_entry, split_lane
from delayjobs.models import DelayedJob, JobStatus

logger = logging.getLogger("delayjobs.consumer")

#: In a backlog, how long a free slot may wait for others to free up, so that one claim
#: fills many slots instead of one claim (a Redis and a database round trip) per slot.
REFILL_WAIT = 0.002
#: How much later than its window and the claim's lead a rate-held job's entry may come
#: (the clocks' readings and rounding); a burst waits for it (see ``_held_by_a_rate``).
RATE_HOLD_MARGIN = timedelta(milliseconds=100)


class RedisFetcher:
    """Claims due jobs found in Redis; the consumer's way of fetching while Redis works."""

    def __init__(
        self, *, store: RedisStore, lanes: list[str], claims: Claims, fallback: RedisFallback
    ) -> None:
        self.store = store
        self.lanes = lanes
        self.claims = claims
        self.fallback = fallback
        self._rotation = 0
        self.backlog = False  # the last pop left due jobs behind
        self._refill_deadline: float | None = None
        self._unknown_types: set[str] = set()  # warned about once each

    def turn(self) -> float | None:
        """Claim what Redis says is due; return how long to sleep (None: burst done)."""
        free = self.claims.inflight.claimable()
        wait = self._refill_wait(free)
        if wait is not None:
            return wait
        if free > 0 and self._claim():
            return 0.0  # more may be due right now: look again before sleeping
        return self._time_to_next(free)

    def forget_backlog(self) -> None:
        """Redis failed: what the last pop said of a backlog is stale; try again at once."""
        self.backlog = False
        self._refill_deadline = None

    def _refill_wait(self, free: int) -> float | None:
        """In a backlog, seconds to let more slots free up before popping; None: go on now.

        Jobs in a backlog are late already; batching their claims drains it faster. A
        job due while there is no backlog is never held back.
        """
        inflight = self.claims.inflight
        enough = inflight.concurrency * inflight.prefetch() // 2
        if not self.backlog or free <= 0 or free >= enough:
            self._refill_deadline = None
            return None
        now = time.monotonic()
        if self._refill_deadline is None:
            self._refill_deadline = now + REFILL_WAIT
        if now >= self._refill_deadline:
            self._refill_deadline = None
            return None
        # Until then, finished jobs wake the loop only once they free enough slots.
        inflight.release_wakes_at(enough)
        return self._refill_deadline - now

    def _claim(self) -> int:
        """Pop what is due from the lanes, claim it, start it; how many were claimed."""
        popped: dict[int, tuple[str, float]] = {}  # id -> (lane, score)
        claims = self.claims
        now = clock.epoch()
        backlog = False
        first = self._rotation
        self._rotation = (self._rotation + 1) % len(self.lanes)
        budget = self.claims.inflight.budget()
        limited_taken = 0
        try:
            for name in self.lanes[first:] + self.lanes[:first]:
                queue, job_type = split_lane(name)
                wanted = claims.lane_room(budget, queue, job_type, limited_taken)
                if wanted <= 0:
                    continue
                taken, more_due = self.store.pop_due(name, now + claims.ahead_of(job_type), wanted)
                backlog = backlog or more_due
                budget.spend(queue, job_type, len(taken))
                if job_type in claims.limited:
                    limited_taken += len(taken)
                for pk, score in taken:
                    popped[pk] = (name, score)
                if budget.free <= 0:
                    break
        except Exception:
            # A later lane failed: the ids popped from the earlier ones go back now, or
            # they would wait for the next pre-loader pass, up to a window late.
            self.put_back(popped)
            raise
        # Redis answered. Only then: a turn that did not ask it (waiting for slots to free
        # up in a backlog) says nothing of Redis, and must not end a streak of failures.
        self.fallback.redis_answered()
        self.backlog = backlog
        if not popped:
            return 0
        limited = self._limited_ids(popped)
        plain = [pk for pk in popped if pk not in limited] if limited else list(popped)
        jobs: list[DelayedJob] = []
        try:
            # Types without a free slot are not claimed. Their jobs are in their own lanes,
            # not popped; one found in the queue's lane (indexed by a process that did not
            # know the type's limit yet) is put back, into its lane, by reindex_unclaimed.
            if plain:
                jobs = transitions.claim(
                    plain,
                    worker_id=claims.worker_id,
                    now=claims.claim_time(),
                    job_types=claims.plain_types(),
                    leases=claims.leases,
                    default_lease=JobType.time_to_run,
                    ahead=claims.ahead,
                )
        except Exception:
            # The ids left Redis but no row was claimed: put them back, or they would wait
            # for the next pre-loader pass.
            self.put_back(popped)
            raise
        # Claimed rows run before anything else can fail: a claimed job left unstarted
        # would only come back after its lease, with an attempt spent.
        claims.start(jobs)
        won = len(jobs)
        if len(jobs) < len(plain):
            claimed = {job.pk for job in jobs}
            try:
                self.reindex_unclaimed([pk for pk in plain if pk not in claimed])
            except DatabaseError:
                logger.warning("Could not re-index unclaimed jobs; the pre-loader will.")
        if limited:
            won += self._claim_limited(limited, popped)
        return won

    def _claim_limited(self, limited: list[int], popped: dict[int, tuple[str, float]]) -> int:
        """The limited lanes' ids: what the limits hold is parked in Redis (by
        claim_limited); the rest not claimed is re-indexed, as from a plain lane."""
        try:
            jobs, held = claim_limited(self.claims, limited, park=True)
        except Exception:
            self.put_back({pk: popped[pk] for pk in limited})
            raise
        claimed = {job.pk for job in jobs}
        left = [pk for pk in limited if pk not in claimed and pk not in held]
        if left:
            try:
                self.reindex_unclaimed(left)
            except DatabaseError:
                logger.warning("Could not re-index unclaimed jobs; the pre-loader will.")
        return len(jobs)

    def _limited_ids(self, popped: dict[int, tuple[str, float]]) -> list[int]:
        """The ids popped from the lanes of types with fleet-wide limits."""
        limited = self.claims.limited
        if not limited:
            return []
        return [pk for pk, (name, _score) in popped.items() if split_lane(name)[1] in limited]

    def put_back(self, popped: dict[int, tuple[str, float]]) -> None:
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

    def reindex_unclaimed(self, ids: list[int]) -> None:
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
            self.claims.pauses.reload()
        for pk, queue, run_at, job_type in found:
            if job_type not in self.claims.job_types:
                self._warn_unknown_type(job_type)
                continue
            if self.claims.pauses.current.covers(queue, job_type):
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
                self.claims.worker_id,
                job_type,
                ", ".join(self.claims.job_types),
            )

    def _held_by_a_rate(self, until_next: float) -> bool:
        """Whether a burst must wait for the next entry, ``until_next`` seconds away: jobs
        a rate holds are due already, their entries waiting in their lanes for the window
        to free a start. So if a due row of an open limited type is in this consumer's
        queues, and the next entry comes within the time a rate can hold one: its window,
        from a start counted up to the limited claim's lead ahead, or up to half a window
        later (reserved starts, ``delayjobs.transitions.reservations``), and a margin for
        the clocks' rounding."""
        claims = self.claims
        types = claims.limited_types()
        windows = [rate.per for name in types if (rate := registry.get(name).rate_limit)]
        if not windows:
            return False
        longest = max(windows) * 3 / 2 + claims.limited_ahead + RATE_HOLD_MARGIN
        if until_next > longest.total_seconds():
            return False
        queues = {split_lane(name)[0] for name in self.lanes} - claims.pauses.current.queues
        return DelayedJob.objects.filter(
            status=JobStatus.SCHEDULED,
            run_at__lte=clock.now(),
            job_type__in=types,
            queue__in=queues,
        ).exists()

    def _time_to_next(self, free: int) -> float | None:
        """Seconds to sleep; None when a burst run is done."""
        idle = settings.IDLE_TIMEOUT.total_seconds()
        claims = self.claims
        open_lanes = claims.inflight.open_lanes(self.lanes, claims.pauses.current)
        if free <= 0 or not open_lanes:
            return idle  # a finishing job wakes us
        scores = self.store.first_scores(open_lanes)
        self.fallback.redis_answered()
        now = clock.epoch()
        due = min(scores.values(), default=None)
        if (
            claims.burst
            and (due is None or due > now)
            and claims.idle()
            and (due is None or not self._held_by_a_rate(due - now))
        ):
            return None
        if not claims.burst and len(open_lanes) == len(self.lanes):
            # Every lane has room: what comes next is a due time (or a wake-up from the
            # listener), never a finished job, which would cost a turn for nothing.
            claims.inflight.release_wakes_at(None)
        if due is None:
            return idle
        # The next claim: the earliest due time less its lane's lead (one lead for all
        # when no type has a limit).
        claim_at = (
            min(score - claims.ahead_of(split_lane(name)[1]) for name, score in scores.items())
            if claims.limited
            else due - claims.ahead_of(None)
        )
        return min(max(claim_at - now, 0.0), idle)
