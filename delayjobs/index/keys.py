"""Key and channel names in Redis, with the project's ``KEY_PREFIX``: the one place
that says where the index keeps what.

Per lane, one sorted set (member: job id, score: ``run_at`` as epoch seconds); per queue,
one pub/sub channel that announces "the earliest due time of this queue just moved
earlier". Both carry the queue as a Redis Cluster hash tag, so each script touches one slot.

On a Redis Cluster (``REDIS_CLUSTER``), every key of a queue (its lanes' sets, its wake
channel) hashes to the slot of ``{queue}``, so a queue lives on one master. The other
names are single keys or channels: the pre-loader lock (one key, one slot of its own) and
the control channel. Which lanes a queue has, and which lane a job waits in, is
``delayjobs.lanes``'s.
"""

from __future__ import annotations

from delayjobs.conf import settings
from delayjobs.lanes import split_lane

__all__ = [
    "control_channel",
    "due_key",
    "held_key",
    "preload_lock_key",
    "released_key",
    "wake_channel",
]


def _prefix() -> str:
    return settings.KEY_PREFIX


def due_key(lane_name: str) -> str:
    """The sorted set of a lane (a plain queue name is its queue's own lane)."""
    queue, job_type = split_lane(lane_name)
    key = f"{_prefix()}:{{{queue}}}:due"
    return key if job_type is None else f"{key}:{job_type}"


def held_key(lane_name: str, limit_key: str) -> str:
    """The sorted set of a lane's jobs held by their fleet-wide limit under ``limit_key``,
    until a slot of that key frees (in the lane's slot: one script moves them back)."""
    queue, _job_type = split_lane(lane_name)
    return f"{_prefix()}:{{{queue}}}:held:{limit_key}"


def released_key(lane_name: str, limit_key: str) -> str:
    """When a slot of ``limit_key`` last freed (epoch seconds, database clock), for the
    jobs held a moment before it that would otherwise miss their wake-up."""
    queue, _job_type = split_lane(lane_name)
    return f"{_prefix()}:{{{queue}}}:released:{limit_key}"


def wake_channel(lane_name: str) -> str:
    """The wake channel of a lane's queue: one per queue, whatever the lane."""
    queue, _job_type = split_lane(lane_name)
    return f"{_prefix()}:{{{queue}}}:wake"


def control_channel() -> str:
    """Where pauses and resumes are announced to every consumer of the project."""
    return f"{_prefix()}:control"


def preload_lock_key() -> str:
    return f"{_prefix()}:preload-lock"
