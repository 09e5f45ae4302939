"""The consumer's side of fleet-wide limits: claim a limited lane's jobs through the
database's limiter (or, in keys where it reserved room, with the plain claim), park what
it held in Redis, and re-arm a key's held jobs when one of its jobs ends
(``delayjobs.index.held``).

The limit is the database's decision alone (``delayjobs.transitions.limiter``): what this
module does with Redis only decides how soon a held job is asked about again, so a Redis
that loses or mangles it costs time, never the limit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from redis import RedisError

from delayjobs import transitions
from delayjobs.core import clock, metrics
from delayjobs.engine.claimer import Claims
from delayjobs.engine.contended import groups
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
    jobs, result = claim_limited_rows(claims, ids)
    start_limited(claims, jobs, result, park=park)
    return jobs, {job.pk for job in result.held}


def claim_limited_rows(
    claims: Claims, ids: Sequence[int], *, reserve: bool = True
) -> tuple[list[DelayedJob], transitions.LimitedClaim]:
    """``claim_limited``'s claim alone, for a caller that starts the jobs once its own
    transaction around it commits (``start_limited``): the jobs claimed, and the claim
    (what it held, when it decided). Such a caller reserves nothing (``reserve``): the
    consumer's ledger would count a reservation its transaction may yet roll back.

    Rows of keys where this consumer reserved room enough for them all are claimed first,
    with the plain claim; the rest (other keys, or none reserved) take the limited claim,
    which reserves room where its limits have plenty to spare."""
    job_types = claims.limited_types()
    if not ids or not job_types:
        return [], transitions.LimitedClaim()
    jobs = _claim_reserved(claims, ids, job_types)
    if len(jobs) < len(ids):
        if jobs:
            won = {job.pk for job in jobs}
            ids = [pk for pk in ids if pk not in won]
        since = claims.reserved.now()
        result = transitions.claim_limited(
            ids,
            **_claim_terms(claims, job_types),
            reserve=claims.reserved.want if reserve else 0,
            holder=claims.reserved.holder,
        )
        claims.reserved.add(result.reserved, since=since)
        jobs += result.jobs
    else:
        result = transitions.LimitedClaim()
    return jobs, result


def start_limited(
    claims: Claims, jobs: list[DelayedJob], result: transitions.LimitedClaim, *, park: bool
) -> None:
    """Start what ``claim_limited_rows`` claimed; with ``park``, hand what it held to Redis.
    The keys whose jobs wait for a slot are contended from now on (see
    ``delayjobs.engine.contended``)."""
    claims.start(jobs)
    for job in jobs:
        metrics.limit_wait(job.job_type, job.limit_wait)
    if park and result.held:
        park_held(result.held, decided_at=result.at)
        claims.contended.mark(groups(job for job in result.held if job.free_at is None))


def _claim_reserved(claims: Claims, ids: Sequence[int], job_types: list[str]) -> list[DelayedJob]:
    """The plain claim of ``ids``, for the rows of keys whose reservations cover them all
    (none held: their wait for the limit is nil)."""
    keys = claims.reserved.keys_for(len(ids))
    if not keys:
        return []
    jobs = transitions.claim(ids, **_claim_terms(claims, job_types), limit_keys=keys)
    for job in jobs:
        job.limit_wait = timedelta(0)
    claims.reserved.spend(jobs)
    return jobs


def _claim_terms(claims: Claims, job_types: list[str]) -> dict[str, Any]:
    """What the limited claim and the claim under a reservation share: who claims, the
    claim's token, the types, their leases and how early."""
    return {
        "worker_id": claims.worker_id,
        "now": claims.claim_time(),
        "job_types": job_types,
        "leases": claims.leases,
        "default_lease": JobType.time_to_run,
        "ahead": claims.limited_ahead,
    }


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


def release_slots(jobs: Iterable[DelayedJob]) -> int:
    """Jobs of limited types ended (their outcomes are written): re-arm as many held jobs
    of their keys as slots freed. Best effort, as ``park_held``. How many were re-armed
    (their lanes' consumers are woken by Redis)."""
    freed = groups(jobs)
    if not freed:
        return 0
    try:
        return held_index.release(freed, now=clock.epoch())
    except RedisError as exc:
        logger.warning(
            "Could not wake the jobs held by %d freed slot(s) (%s); the pre-loader will.",
            len(freed),
            exc,
        )
        return 0
