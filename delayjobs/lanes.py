"""Lanes: where a job waits to be due, and the index entries that put it there.

A lane is its queue's own (named as the queue), or ``queue|job_type`` for a job type with
a limit of its own (``JobType.concurrency``, or a fleet-wide one): such a type gets a sorted set of
its own within each queue, popped only while the type has a free slot, so that a flood of
it neither takes every slot nor has to be popped and put back over and over. Every other
job of the queue shares the queue's lane.

Only names live here, no Redis: the transitions say where the jobs they make due again
wait (``index_entry``) without knowing Redis, and the Redis key of a lane is the index's
(``delayjobs.index.keys.due_key``).
"""

from __future__ import annotations

from delayjobs.jobtypes import JobType, limits_of, registry

#: An entry of the index: (job id, lane, due time as epoch seconds).
IndexEntry = tuple[int, str, float]

#: Separates queue and job type in a lane's name; queue names cannot contain it.
LANE_SEPARATOR = "|"


def own_lane(queue: str, job_type: str) -> str:
    """The name of a job type's own lane within ``queue``."""
    return f"{queue}{LANE_SEPARATOR}{job_type}"


def split_lane(name: str) -> tuple[str, str | None]:
    """(queue, job type or None) of a lane."""
    queue, _separator, job_type = name.partition(LANE_SEPARATOR)
    return queue, job_type or None


def has_own_lane(jobtype: JobType) -> bool:
    """A type with a limit of its own: per process (``concurrency``) or fleet-wide
    (``global_concurrency``, ``rate_limit``, claimed by the limited claim)."""
    return jobtype.concurrency is not None or limits_of(jobtype) is not None


def lane(queue: str, job_type: str) -> str:
    """Where a job waits: its queue, or ``queue|job_type`` for a type with its own limit."""
    if job_type in registry and has_own_lane(registry.get(job_type)):
        return own_lane(queue, job_type)
    return queue


def lanes(queue: str) -> list[str]:
    """Every lane of ``queue``: its own and one per job type with a limit of its own."""
    limited = sorted(jt.name for jt in registry if has_own_lane(jt))
    return [queue, *(own_lane(queue, name) for name in limited)]


def limited_types() -> frozenset[str]:
    """The registered types with fleet-wide limits: only their jobs take the limited claim."""
    return frozenset(jt.name for jt in registry if limits_of(jt) is not None)


def index_entry(job_id: int, queue: str, job_type: str, due: float) -> IndexEntry:
    """The index entry of a job due at ``due`` (epoch seconds), in its lane."""
    return (job_id, lane(queue, job_type), due)
