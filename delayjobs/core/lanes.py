"""The logical names of lanes and index entries: no Redis, no key prefix.

A lane is where a job waits to be due: its queue's own lane (named as the queue), or
``queue|job_type`` for a job type with a concurrency limit of its own. Which types have
one is the job types' business (``delayjobs.transitions.lanes``); the key of a lane in
Redis is the index's (``delayjobs.index.keys``). Only the naming lives here, so that the
state machine can say where a job waits without knowing Redis.
"""

from __future__ import annotations

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
