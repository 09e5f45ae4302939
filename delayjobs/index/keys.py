"""Key and channel names in Redis, with the project's ``KEY_PREFIX``: the one place
that says where the index keeps what.

Per queue, one sorted set (member: job id, score: ``run_at`` as epoch seconds) and one
pub/sub channel that announces "the earliest due time of this queue just moved earlier".
Both keys carry the queue as a Redis Cluster hash tag, so each script touches one slot.

On a Redis Cluster (``REDIS_CLUSTER``), every key of a queue (its lanes' sets, its wake
channel) hashes to the slot of ``{queue}``, so a queue lives on one master. The other
names are single keys or channels: the pre-loader lock (one key, one slot of its own) and
the control channel.

Lanes: a job type with a concurrency limit of its own (``JobType.concurrency``) gets a
sorted set of its own within each queue. A consumer pops it only while the type has a
free slot, so a flood of that type neither takes every slot nor has to be popped and put
back over and over. Every other job of the queue shares the queue's set. The lanes' names
are ``delayjobs.core.lanes``'s; which lane a job waits in is ``transitions.lanes``'s.
"""

from __future__ import annotations

from delayjobs.conf import settings
from delayjobs.core.lanes import LANE_SEPARATOR, IndexEntry, own_lane, split_lane
from delayjobs.jobtypes import registry
from delayjobs.transitions.lanes import index_entry, lane

__all__ = [
    "LANE_SEPARATOR",
    "IndexEntry",
    "control_channel",
    "due_key",
    "index_entry",
    "lane",
    "lanes",
    "preload_lock_key",
    "split_lane",
    "wake_channel",
]


def _prefix() -> str:
    return settings.KEY_PREFIX


def lanes(queue: str) -> list[str]:
    """Every lane of ``queue``: its own and one per job type with a limit of its own."""
    limited = sorted(jt.name for jt in registry if jt.concurrency is not None)
    return [queue, *(own_lane(queue, name) for name in limited)]


def due_key(lane_name: str) -> str:
    """The sorted set of a lane (a plain queue name is its queue's own lane)."""
    queue, job_type = split_lane(lane_name)
    key = f"{_prefix()}:{{{queue}}}:due"
    return key if job_type is None else f"{key}:{job_type}"


def wake_channel(lane_name: str) -> str:
    """The wake channel of a lane's queue: one per queue, whatever the lane."""
    queue, _job_type = split_lane(lane_name)
    return f"{_prefix()}:{{{queue}}}:wake"


def control_channel() -> str:
    """Where pauses and resumes are announced to every consumer of the project."""
    return f"{_prefix()}:control"


def preload_lock_key() -> str:
    return f"{_prefix()}:preload-lock"
