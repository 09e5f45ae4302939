"""The (lane, limit key)s where this consumer knows jobs wait for a slot, so that the outcome
of a job that frees one goes to the main loop, which writes it together with the claim of
the next job waiting (``delayjobs.engine.successors``), instead of to the recorder.

Learnt from what a claim held, or a release moved (``delayjobs.engine.limited``); forgotten
once a key's held set ran out. A guess, either way: a key wrongly counted in costs one
write by the main loop; one wrongly counted out, the path every other outcome takes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from delayjobs.index.held import HeldGroup
from delayjobs.lanes import lane
from delayjobs.models import DelayedJob


class Keyed(Protocol):
    """A job, or a job held by its limit (``delayjobs.transitions.limiter.Held``)."""

    @property
    def queue(self) -> str: ...
    @property
    def job_type(self) -> str: ...
    @property
    def limit_key(self) -> str | None: ...


def groups(jobs: Iterable[Keyed]) -> list[HeldGroup]:
    """Where the slots of ``jobs``, those of limited keys, are waited for: one item per job."""
    return [(lane(job.queue, job.job_type), job.limit_key) for job in jobs if job.limit_key]


class Contended:
    def __init__(self) -> None:
        # Read by worker threads, changed by the main loop and the recorder: a set's add,
        # discard and membership test are each atomic, and a stale answer is only a guess.
        self._groups: set[HeldGroup] = set()
        self._open = True

    def mark(self, groups: Iterable[HeldGroup]) -> None:
        self._groups.update(groups)

    def unmark(self, groups: Iterable[HeldGroup]) -> None:
        self._groups.difference_update(groups)

    def close(self) -> None:
        """The main loop is over: every outcome goes to the recorder from now on."""
        self._open = False

    def covers(self, job: DelayedJob) -> bool:
        if not self._open or not self._groups:  # the common case: a limit with room
            return False
        return any(group in self._groups for group in groups([job]))
