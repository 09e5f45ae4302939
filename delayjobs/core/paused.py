"""What is paused now: the read side of pauses (the ``Pause`` rows), for every layer.

Consumers, the pre-loader, the stats and the admin read it; writing a pause (and telling
the consumers) is ``delayjobs.api.pauses``. Foundation layer: reads the models only.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q, QuerySet

from delayjobs.models import DelayedJob, Pause, PauseKind


@dataclass(frozen=True)
class Paused:
    """The paused queues and job types at one moment."""

    queues: frozenset[str] = frozenset()
    job_types: frozenset[str] = frozenset()

    def covers(self, queue: str, job_type: str | None = None) -> bool:
        """Whether a job of ``queue`` (and ``job_type``) is paused."""
        return queue in self.queues or (job_type is not None and job_type in self.job_types)

    def exclude_from(self, jobs: QuerySet[DelayedJob]) -> QuerySet[DelayedJob]:
        """``jobs`` without the paused ones."""
        if not self:
            return jobs
        return jobs.exclude(Q(queue__in=self.queues) | Q(job_type__in=self.job_types))

    def __bool__(self) -> bool:
        return bool(self.queues or self.job_types)


def paused() -> Paused:
    """What is paused now (one query)."""
    queues: set[str] = set()
    job_types: set[str] = set()
    for kind, name in Pause.objects.values_list("kind", "name"):
        (queues if kind == PauseKind.QUEUE else job_types).add(name)
    return Paused(frozenset(queues), frozenset(job_types))
