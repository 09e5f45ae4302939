"""Which lane a job waits in: its queue's own, or its job type's where the type has a
concurrency limit of its own (``JobType.concurrency``).

The transitions return index entries for the jobs they make due again; this is where
their lane is decided, from the job types alone. The names are ``delayjobs.core.lanes``'s,
the Redis keys ``delayjobs.index.keys``'s.
"""

from __future__ import annotations

from delayjobs.core.lanes import IndexEntry, own_lane
from delayjobs.jobtypes import registry


def lane(queue: str, job_type: str) -> str:
    """Where a job waits: its queue, or ``queue|job_type`` for a type with its own limit."""
    if job_type in registry and registry.get(job_type).concurrency is not None:
        return own_lane(queue, job_type)
    return queue


def index_entry(job_id: int, queue: str, job_type: str, due: float) -> IndexEntry:
    """The index entry of a job due at ``due`` (epoch seconds), in its lane."""
    return (job_id, lane(queue, job_type), due)
