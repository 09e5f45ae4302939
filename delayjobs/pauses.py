"""Pausing and resuming a queue or a job type, without restarting consumers, and what is
paused now.

A pause is a ``Pause`` row. Consumers keep the paused queues and job types in memory
(``paused()``, a ``Paused``) and claim none of their jobs; they re-read them when
``pause``/``resume`` announce a change over Redis (on commit), and at least every
IDLE_TIMEOUT in case an announcement was missed. Paused jobs stay ``scheduled``; the
pre-loader leaves them out of Redis, and ``resume`` puts those due within the window back,
so they run where they were. The consumers, the pre-loader, the stats and the admin read
what is paused here. (A recurring schedule's pause is its row's ``enabled``:
``delayjobs.recurring.definitions``.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from redis import RedisError

from delayjobs.conf import settings
from delayjobs.exceptions import InvalidJob
from delayjobs.index.store import get_store
from delayjobs.index.window import load_window
from delayjobs.jobtypes import registry
from delayjobs.models import DelayedJob, Pause, PauseKind, jobs_database
from delayjobs.validation import check_queue

logger = logging.getLogger("delayjobs.pauses")  # the old path: users' LOGGING names it

__all__ = ["Paused", "check_target", "pause", "paused", "resume"]


@dataclass(frozen=True)
class Paused:
    """The paused queues and job types at one moment."""

    queues: frozenset[str] = frozenset()
    job_types: frozenset[str] = frozenset()

    def covers(self, queue: str, job_type: str | None = None) -> bool:
        """Whether a job of ``queue`` (and ``job_type``) is paused."""
        return queue in self.queues or (job_type is not None and job_type in self.job_types)

    def matching(self) -> Q:
        """The paused jobs as a filter; an empty ``Q()`` (no filter) when nothing is paused."""
        if not self:
            return Q()
        return Q(queue__in=self.queues) | Q(job_type__in=self.job_types)

    def exclude_from(self, jobs: QuerySet[DelayedJob]) -> QuerySet[DelayedJob]:
        """``jobs`` without the paused ones."""
        return jobs.exclude(self.matching()) if self else jobs

    def __bool__(self) -> bool:
        return bool(self.queues or self.job_types)


def paused() -> Paused:
    """What is paused now (one query)."""
    queues: set[str] = set()
    job_types: set[str] = set()
    for kind, name in Pause.objects.values_list("kind", "name"):
        (queues if kind == PauseKind.QUEUE else job_types).add(name)
    return Paused(frozenset(queues), frozenset(job_types))


def pause(*, queue: str | None = None, job_type: str | None = None, by: str = "") -> bool:
    """Pause a queue or a job type; False if it was paused already."""
    kind, name = check_target(queue, job_type)
    using = jobs_database()
    try:
        with transaction.atomic(using=using):
            Pause.objects.create(kind=kind, name=name, paused_by=by[:150])
    except IntegrityError:
        return False
    transaction.on_commit(_announce, using=using, robust=True)
    return True


def resume(*, queue: str | None = None, job_type: str | None = None) -> bool:
    """Resume a paused queue or job type; False if it was not paused.

    A job type no longer registered (removed by a deploy) can still be resumed by name.
    """
    kind, name = check_target(queue, job_type, registered=False)
    using = jobs_database()
    deleted, _per_model = Pause.objects.filter(kind=kind, name=name).delete()
    if not deleted:
        return False
    field = "queue" if kind == PauseKind.QUEUE else "job_type"
    transaction.on_commit(lambda: _reindex(**{field: name}), using=using, robust=True)
    return True


def check_target(
    queue: str | None, job_type: str | None, *, registered: bool = True
) -> tuple[str, str]:
    """(kind, name) of what to pause or resume; InvalidJob (UnknownJobType) if it is not
    a well-formed queue or, with ``registered``, a registered job type."""
    if (queue is None) == (job_type is None):
        raise InvalidJob("Give a queue or a job type to pause or resume, not both or neither.")
    if queue is not None:
        return PauseKind.QUEUE, check_queue(queue)
    if not registered and isinstance(job_type, str) and job_type:
        return PauseKind.JOB_TYPE, job_type
    return PauseKind.JOB_TYPE, registry.resolve(job_type).name  # type: ignore[arg-type]


def _reindex(**target: str) -> None:
    """Announce the resume, then put the resumed work due within the window back into Redis.

    In that order: a consumer that popped a resumed job while still believing it paused
    would drop it from Redis (it re-reads the pauses first, but the sooner it hears, the
    better).
    """
    _announce()
    try:
        horizon = timezone.now() + settings.PRELOAD_WINDOW
        load_window(get_store(), horizon, leave_out=paused().matching(), only=Q(**target))
    except RedisError as exc:
        logger.warning("Resumed %s; Redis is unreachable (%s): the pre-loader will.", target, exc)


def _announce() -> None:
    try:
        get_store().announce_control()
    except RedisError as exc:
        # Consumers re-read pauses every IDLE_TIMEOUT anyway.
        logger.warning("Could not announce a pause change over Redis (%s).", exc)
