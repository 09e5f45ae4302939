"""How many more jobs a consumer may start: in all, per queue and per job type.

Limits are per consumer process: ``concurrency`` in all, ``QUEUE_CONCURRENCY`` per
queue and ``JobType.concurrency`` per job type. A job holds its slots from its claim until
its thread returns, so a job stuck past its time-out still counts against its queue and
type: a stuck or slow kind of job can fill its own slots, never everyone's.

Not thread-safe: the consumer calls it under its own lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from delayjobs.transitions import Candidate


class Slots:
    def __init__(
        self,
        total: int,
        *,
        queue_limits: Mapping[str, int] | None = None,
        type_limits: Mapping[str, int] | None = None,
    ) -> None:
        self.total = total
        self.queue_limits = dict(queue_limits or {})
        self.type_limits = dict(type_limits or {})
        self._used = 0
        self._by_queue: Counter[str] = Counter()
        self._by_type: Counter[str] = Counter()

    @property
    def used(self) -> int:
        return self._used

    def free(self) -> int:
        return max(self.total - self._used, 0)

    def queue_room(self, queue: str) -> int:
        """How many more jobs of ``queue`` may start now."""
        room = self.free()
        limit = self.queue_limits.get(queue)
        if limit is not None:
            room = min(room, limit - self._by_queue[queue])
        return max(room, 0)

    def type_room(self, job_type: str) -> int:
        """How many more jobs of ``job_type`` may start now (ignoring its queue)."""
        room = self.free()
        limit = self.type_limits.get(job_type)
        if limit is not None:
            room = min(room, limit - self._by_type[job_type])
        return max(room, 0)

    def open_types(self, job_types: Iterable[str]) -> list[str]:
        """The job types among ``job_types`` that may start at least one more job."""
        return [name for name in job_types if self.type_room(name) > 0]

    def budget(self, most: int | None = None) -> Budget:
        """A snapshot of the room left, to spend while picking several jobs at once; at
        most ``most`` jobs in all, if given."""
        return Budget(self, most)

    def choose(self, candidates: Iterable[Candidate]) -> tuple[list[Candidate], list[Candidate]]:
        """Split due candidates, in due order, into those that fit now and those that do not."""
        budget = self.budget()
        fit: list[Candidate] = []
        over: list[Candidate] = []
        for candidate in candidates:
            if budget.room(candidate.queue, candidate.job_type) > 0:
                budget.spend(candidate.queue, candidate.job_type)
                fit.append(candidate)
            else:
                over.append(candidate)
        return fit, over

    def take(self, queue: str, job_type: str) -> None:
        self._used += 1
        self._by_queue[queue] += 1
        self._by_type[job_type] += 1

    def release(self, queue: str, job_type: str) -> None:
        self._used -= 1
        self._by_queue[queue] -= 1
        self._by_type[job_type] -= 1


class Budget:
    """Room left while picking jobs: each one picked counts against its queue and type.

    Limits are checked against this, not against the slots, until the picked jobs are
    started: otherwise two lanes of one queue, or of one job type, would each be given
    the whole room.
    """

    def __init__(self, slots: Slots, most: int | None = None) -> None:
        self._slots = slots
        self._free = slots.free() if most is None else min(slots.free(), most)
        self._queues: Counter[str] = Counter()
        self._types: Counter[str] = Counter()

    @property
    def free(self) -> int:
        return self._free

    def room(self, queue: str, job_type: str | None = None) -> int:
        """How many more jobs of ``queue`` (and of ``job_type``, if given) may be picked."""
        room = min(self._free, self._slots.queue_room(queue) - self._queues[queue])
        if job_type is not None:
            room = min(room, self._slots.type_room(job_type) - self._types[job_type])
        return max(room, 0)

    def spend(self, queue: str, job_type: str | None = None, count: int = 1) -> None:
        self._free -= count
        self._queues[queue] += count
        if job_type is not None:
            self._types[job_type] += count
