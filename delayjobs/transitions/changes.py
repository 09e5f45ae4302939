"""Changes a caller asks for: cancel, move (reschedule, replace) and retry.

Each is a conditional UPDATE on the status it expects, so a job that moved on meanwhile
is refused (``InvalidTransition``) instead of being changed behind the caller's back.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from delayjobs.exceptions import DuplicateJob, InvalidTransition
from delayjobs.lanes import IndexEntry, index_entry
from delayjobs.models import RETRYABLE_STATUSES, DelayedJob, JobStatus, jobs_database


def cancel(jobs: QuerySet[DelayedJob]) -> list[IndexEntry]:
    """``scheduled -> cancelled`` for the given jobs; returns those cancelled."""
    candidates = list(
        jobs.filter(status=JobStatus.SCHEDULED).values_list("pk", "queue", "job_type", "run_at")
    )
    if not candidates:
        return []
    ids = [pk for pk, *_rest in candidates]
    now = timezone.now()
    with transaction.atomic(using=jobs_database()):
        # Lock first so the returned list is exactly what changed, even under races.
        locked = set(
            DelayedJob.objects.select_for_update()
            .filter(pk__in=ids, status=JobStatus.SCHEDULED)
            .values_list("pk", flat=True)
        )
        DelayedJob.objects.filter(pk__in=locked, status=JobStatus.SCHEDULED).update(
            status=JobStatus.CANCELLED, finished_at=now, lease_expires_at=None
        )
    return [
        index_entry(pk, queue, job_type, run_at.timestamp())
        for pk, queue, job_type, run_at in candidates
        if pk in locked
    ]


def move(job: DelayedJob, **changes: Any) -> DelayedJob:
    """Change a scheduled job's time (and payload, queue ...) in place.

    Raises ``InvalidTransition`` if the job is no longer scheduled.
    """
    changed = DelayedJob.objects.filter(pk=job.pk, status=JobStatus.SCHEDULED).update(**changes)
    if not changed:
        job.refresh_from_db(fields=["status"])
        raise InvalidTransition(f"Job {job.pk} is {job.status}; only a scheduled job can be moved.")
    for name, value in changes.items():
        setattr(job, name, value)
    return job


def retry(job: DelayedJob, **more: Any) -> DelayedJob:
    """``failed | cancelled | succeeded -> scheduled``, due now, with a fresh attempt budget.

    ``more``: other fields to write with it (the trace context of the span that retries it).
    Its history (attempt rows) stays. Raises ``DuplicateJob`` if another active job took
    its key meanwhile, ``InvalidTransition`` if it is scheduled or running.
    """
    now = timezone.now()
    changes = {
        "status": JobStatus.SCHEDULED,
        "run_at": now,
        "attempts": 0,
        "claimed_at": None,
        "started_at": None,
        "finished_at": None,
        "lease_expires_at": None,
        "worker_id": "",
        "result": None,
        **more,
    }
    try:
        with transaction.atomic(using=jobs_database()):
            changed = DelayedJob.objects.filter(pk=job.pk, status__in=RETRYABLE_STATUSES).update(
                **changes
            )
    except IntegrityError:
        raise DuplicateJob(job.key or "", _active_holder(job.key)) from None
    if not changed:
        job.refresh_from_db(fields=["status"])
        raise InvalidTransition(
            f"Job {job.pk} is {job.status}; only a finished job (failed, cancelled, succeeded, "
            f"skipped or expired) can be retried."
        )
    for name, value in changes.items():
        setattr(job, name, value)
    return job


def _active_holder(key: str | None) -> int | None:
    if not key:
        return None
    return DelayedJob.objects.active().filter(key=key).values_list("pk", flat=True).first()
