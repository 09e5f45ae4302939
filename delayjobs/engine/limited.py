"""The consumer's side of fleet-wide limits: claim a limited lane's jobs through the
database's limiter, park what it held in Redis, and re-arm a key's held jobs when one of
its jobs ends (``delayjobs.index.held``).

The limit is the database's decision alone (``delayjobs.transitions.limiter``): what this
module does with Redis only decides how soon a held job is asked about again, so a Redis
that loses or mangles it costs time, never the limit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from redis import RedisError

from delayjobs import transitions
from delayjobs.core import clock, metrics
from delayjobs.engine.claimer import Claims
from delayjobs.index import held as held_index
from delayjobs.index.handoff import index_due_soon
from delayjobs.jobtypes import JobType
from delayjobs.lanes import IndexEntry, index_entry, lane
from delayjobs.models import PRIORITY_MAX, DelayedJob
from delayjobs.transitions.limiter import Held

logger = logging.getLogger("delayjobs.consumer")

#: Ranks a key's held jobs in Redis: higher priority first, then earlier due time. A
#: due time (epoch seconds) is far below it, so priority always decides first.
PRIORITY_STEP = 1e10


def claim_limited(
    claims: Claims, ids: Sequence[int], *, park: bool
) -> tuple[list[DelayedJob], set[int]]:
    """Claim what the limits admit among ``ids`` and start it; with ``park``, hand what
    they held to Redis, to be woken when a slot or a start frees. Returns the jobs
    started and the ids held."""
    job_types = claims.limited_types()
    if not ids or not job_types:
        return [], set()
    result = transitions.claim_limited(
        ids,
        worker_id=claims.worker_id,
        now=claims.claim_time(),
        job_types=job_types,
        leases=claims.leases,
        default_lease=JobType.time_to_run,
        ahead=claims.limited_ahead,
    )
    claims.start(result.jobs)
    for job in result.jobs:
        metrics.limit_wait(job.job_type, job.limit_wait)
    if park and result.held:
        park_held(result.held, decided_at=result.at)
    return result.jobs, {job.pk for job in result.held}


def park_held(held: Iterable[Held], *, decided_at: float) -> None:
    """Held for a slot: into the key's held set. Held by a rate: back into the lane, due
    when the window frees a start. Best effort: the pre-loader re-indexes due jobs."""
    waiting: list[tuple[str, str, int, float]] = []
    timed: list[IndexEntry] = []
    for job in held:
        if job.free_at is not None:
            timed.append(index_entry(job.pk, job.queue, job.job_type, job.free_at))
        else:
            order = (PRIORITY_MAX - job.priority) * PRIORITY_STEP + job.run_at.timestamp()
            waiting.append((lane(job.queue, job.job_type), job.limit_key, job.pk, order))
    try:
        if waiting:
            held_index.hold(
                held_index.group_by_lane(waiting), decided_at=decided_at, now=clock.epoch()
            )
    except RedisError as exc:
        logger.warning(
            "Could not park %d job(s) held by their limit (%s); the pre-loader re-indexes them.",
            len(waiting),
            exc,
        )
    index_due_soon(timed)


def release_slots(jobs: Iterable[DelayedJob]) -> None:
    """Jobs of limited types ended (their outcomes are written): re-arm as many held jobs
    of their keys as slots freed. Best effort, as ``park_held``."""
    freed = [
        (lane(job.queue, job.job_type), job.limit_key) for job in jobs if job.limit_key is not None
    ]
    if not freed:
        return
    try:
        held_index.release(freed, now=clock.epoch())
    except RedisError as exc:
        logger.warning(
            "Could not wake the jobs held by %d freed slot(s) (%s); the pre-loader will.",
            len(freed),
            exc,
        )
