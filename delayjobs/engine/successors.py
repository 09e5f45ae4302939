"""A freed slot goes to the next job waiting for it, claimed by the consumer that freed it.

When a job of a contended key (``delayjobs.engine.contended``) ends, its outcome comes here
instead of to the recorder: the main loop takes as many of the key's held jobs off their
held set as slots freed, and writes the outcome and claims those jobs in one transaction.
Otherwise the slot stays empty for the outcome's commit, the held jobs' move back into
their lane, a wake-up, a pop of every lane and the claim's own commit.

The limit is decided as for any claim (``delayjobs.transitions.limiter``, in the same
transaction, after the outcome freed the slot), and whatever goes wrong gives the
outcomes back to the recorder and the jobs back to their lanes.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, transaction
from redis import RedisError

from delayjobs import transitions
from delayjobs.core import clock
from delayjobs.engine.contended import groups
from delayjobs.engine.fetch_redis import RedisFetcher
from delayjobs.engine.limited import claim_limited_rows, release_slots, start_limited
from delayjobs.engine.outcome_log import log_outcome_of
from delayjobs.engine.recorder import Recorder
from delayjobs.index import held as held_index
from delayjobs.index.handoff import index_due_soon
from delayjobs.index.held import HeldGroup
from delayjobs.lanes import split_lane
from delayjobs.models import DelayedJob, jobs_database

logger = logging.getLogger("delayjobs.consumer")


def fill_freed_slots(fetcher: RedisFetcher, recorder: Recorder) -> int:
    """Write the outcomes the recorder routed to the main loop, with the claim of the jobs
    waiting for the slots they freed, then start those jobs. How many were started."""
    routed = recorder.take_routed()
    if not routed:
        return 0
    claims = fetcher.claims
    outcomes = [outcome for outcome, _log in routed]
    taken, unfilled = _take_held(fetcher, [outcome.job for outcome in outcomes])
    ids = [pk for pks in taken.values() for pk in pks]
    now = clock.epoch()
    try:
        with transaction.atomic(using=jobs_database()):
            retries = transitions.record_outcomes(outcomes)
            jobs, result = claim_limited_rows(claims, ids, reserve=False)
    except Exception:
        # The recorder writes them, waiting out a database that is away as it does (and
        # wakes their keys' held jobs once they are written); until this path works again
        # (a slot freed then marks its key anew), the keys' outcomes go to it too.
        recorder.reroute(routed)
        claims.contended.unmark(groups(outcome.job for outcome in outcomes))
        fetcher.put_back({pk: (group[0], now) for group, pks in taken.items() for pk in pks})
        raise
    for outcome, log in routed:
        if log:
            log_outcome_of(outcome)
    recorder.routed_written(routed)
    claims.reserved.finished([outcome.job for outcome in outcomes])
    start_limited(claims, jobs, result, park=True)
    # Slots this consumer had no room or no held job for, free now that the outcomes are
    # committed: released as the recorder releases any (moved back, stamped, woken), so
    # that a job another consumer parked meanwhile is not left waiting.
    if unfilled and release_slots(unfilled):
        claims.contended.mark(groups(unfilled))
    settled = {job.pk for job in jobs} | {job.pk for job in result.held}
    left = [pk for pk in ids if pk not in settled]
    if left:
        try:
            fetcher.reindex_unclaimed(left)
        except DatabaseError:
            logger.warning("Could not re-index unclaimed jobs; the pre-loader will.")
    index_due_soon(retries)
    return len(jobs)


def _take_held(
    fetcher: RedisFetcher, ended: list[DelayedJob]
) -> tuple[dict[HeldGroup, list[int]], list[DelayedJob]]:
    """Take off their held sets as many jobs as ``ended`` free slots, within this consumer's
    room. Returns the ids taken, by group, and the ended jobs whose slots none was taken for
    (no room here, or nobody left waiting: such a key is no longer contended)."""
    claims = fetcher.claims
    by_group: dict[HeldGroup, list[DelayedJob]] = {}
    for job in ended:
        for group in groups([job]):
            by_group.setdefault(group, []).append(job)
    budget = claims.inflight.budget()
    room: dict[HeldGroup, int] = {}
    for group, jobs in by_group.items():
        queue, job_type = split_lane(group[0])
        room[group] = min(claims.lane_room(budget, queue, job_type), len(jobs))
        budget.spend(queue, job_type, room[group])
    taken: dict[HeldGroup, list[int]] = {}
    try:
        taken = held_index.take(group for group, n in room.items() for _ in range(n))
    except RedisError as exc:
        claims.contended.unmark(room)  # until Redis answers, outcomes go to the recorder
        logger.warning(
            "Could not take the jobs held for %d freed slot(s) (%s); the pre-loader will "
            "put them back.",
            sum(room.values()),
            exc,
        )
    filled = {group: len(taken.get(group, [])) for group in by_group}
    claims.contended.unmark(group for group, n in room.items() if filled[group] < n)
    unfilled = [job for group, jobs in by_group.items() for job in jobs[filled[group] :]]
    return taken, unfilled
