"""Leases of running jobs: renewing them, handing them over, giving a claim back, and
reaping those whose consumer vanished.

Every transition out of ``running`` is fenced on the very claim (``running_claim``), so a
consumer whose lease expired cannot overwrite what happened to the attempt after it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from django.db import connections, transaction
from django.db.models import F, QuerySet

from delayjobs.core import clock, metrics
from delayjobs.core.logfields import job_fields
from delayjobs.lanes import IndexEntry, index_entry
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus, jobs_database

# The old module's name: users' LOGGING names it.
logger = logging.getLogger("delayjobs.transitions")


def renew_leases(jobs_by_lease: Mapping[timedelta, Iterable[int]], *, worker_id: str) -> int:
    """Push the leases of jobs this worker is still running further out (heartbeat).

    Where rows can be locked (PostgreSQL), a row another transaction holds is skipped, not
    waited for. The holder is this consumer's recorder ending the job (which clears its
    lease anyway) or a reaper ending a lease that has expired: renewing after it would
    gain nothing. Waiting could deadlock with the recorder, whose transaction locks its
    rows group by group, in no one order (PostgreSQL then cancels one of the two after a
    second); the next heartbeat renews whatever still runs.
    """
    now = clock.now()
    database = jobs_database()
    skip_locked = connections[database].features.has_select_for_update_skip_locked
    renewed = 0
    for lease, ids in jobs_by_lease.items():
        mine = DelayedJob.objects.filter(
            pk__in=list(ids), status=JobStatus.RUNNING, worker_id=worker_id
        ).order_by()
        if not skip_locked:
            renewed += mine.update(lease_expires_at=now + lease)
            continue
        with transaction.atomic(using=database):
            free = list(mine.select_for_update(skip_locked=True).values_list("pk", flat=True))
            renewed += DelayedJob.objects.filter(pk__in=free).update(lease_expires_at=now + lease)
    return renewed


def still_claimed(jobs: Sequence[DelayedJob], *, worker_id: str) -> set[int]:
    """Which of these jobs, claimed by ``worker_id``, still run that very claim."""
    if not jobs:
        return set()
    claimed = DelayedJob.objects.filter(
        pk__in=[job.pk for job in jobs], status=JobStatus.RUNNING, worker_id=worker_id
    ).values_list("pk", "attempts", "claimed_at")
    claims = {(job.pk, job.attempts, job.claimed_at) for job in jobs}
    return {pk for pk, attempts, claimed_at in claimed if (pk, attempts, claimed_at) in claims}


def take_over(
    job_id: int,
    *,
    attempt: int,
    claimed_by: str,
    claimed_at: datetime,
    worker_id: str,
    lease: timedelta,
) -> DelayedJob | None:
    """Hand a running job from the consumer that claimed it to ``worker_id`` (a Celery
    worker), with a fresh lease; the row as taken over, or None if that claim is gone.

    Fenced on the very claim (attempt, claimant, claim time): a task that reaches a worker
    after its lease expired and the job was reaped, retried or claimed again finds
    nothing to take, so an attempt runs at most once per claim.
    """
    now = clock.now()
    changed = DelayedJob.objects.filter(
        pk=job_id,
        status=JobStatus.RUNNING,
        attempts=attempt,
        worker_id=claimed_by,
        claimed_at=claimed_at,
    ).update(worker_id=worker_id, lease_expires_at=now + lease)
    if not changed:
        return None
    return DelayedJob.objects.filter(pk=job_id).first()


def give_back(job: DelayedJob, *, worker_id: str, due: datetime) -> IndexEntry | None:
    """``running -> scheduled`` for a claim that never started the job, without spending
    its attempt; the entry to put back into Redis, or None if the claim is gone.

    For an infrastructure fault between the claim and the start (the Celery broker did
    not take the task): the job's attempts and history are as if it was never claimed;
    ``run_at`` stays, so its lateness still counts from its due time. ``due`` is when it
    should be popped again. Fenced on the very claim, like every transition out of
    ``running``.
    """
    changed = running_claim([job.pk], job.attempts, worker_id, job.claimed_at).update(
        status=JobStatus.SCHEDULED,
        attempts=F("attempts") - 1,
        worker_id="",
        lease_expires_at=None,
    )
    if not changed:
        return None
    job.status = JobStatus.SCHEDULED
    job.attempts -= 1
    job.worker_id = ""
    job.lease_expires_at = None
    return index_entry(job.pk, job.queue, job.job_type, max(due, job.run_at).timestamp())


def running_claim(
    ids: Sequence[int], attempt: int, worker_id: str, claimed_at: datetime | None
) -> QuerySet[DelayedJob]:
    """Rows still running the very claim an outcome came from: the fence.

    The claim time is unique per consumer (see ``Consumer._claim_time``), so an outcome
    can only land on the execution it belongs to, even after a lease was taken over and
    the job was retried and claimed again by the same consumer.
    """
    return DelayedJob.objects.filter(
        pk__in=ids,
        status=JobStatus.RUNNING,
        attempts=attempt,
        worker_id=worker_id,
        claimed_at=claimed_at,
    )


def reap_expired_leases(now: datetime, limit: int = 1000) -> list[IndexEntry]:
    """Return running jobs whose lease expired to ``scheduled``, or ``failed`` if exhausted.

    Their consumer died (or lost the database for longer than the lease). The attempt it
    started counts, and gets a ``lease_expired`` attempt row. Returns the rescheduled jobs.
    """
    rescheduled: list[IndexEntry] = []
    expired = DelayedJob.objects.lease_expired(now).order_by("lease_expires_at")[:limit]
    for job in expired:
        exhausted = job.max_attempts is not None and job.attempts >= job.max_attempts
        assert job.lease_expires_at is not None  # lease_expired() selects only such rows
        error = (
            f"Lease expired at {job.lease_expires_at.isoformat()} while worker "
            f"{job.worker_id!r} ran attempt {job.attempts}; the worker probably died."
        )
        started_at = _earliest_possible_start(job, now)
        with transaction.atomic(using=jobs_database()):
            changed = DelayedJob.objects.filter(
                pk=job.pk, status=JobStatus.RUNNING, attempts=job.attempts, lease_expires_at__lt=now
            ).update(
                status=JobStatus.FAILED if exhausted else JobStatus.SCHEDULED,
                started_at=started_at,
                finished_at=now if exhausted else None,
                lease_expires_at=None,
                worker_id="",
                last_error=error,
            )
            if not changed:
                continue  # it finished or was renewed meanwhile
            JobAttempt.objects.create(
                job_id=job.pk,
                number=job.attempts,
                worker_id=job.worker_id,
                started_at=started_at,
                outcome=AttemptOutcome.LEASE_EXPIRED,
                error=error,
                lateness=started_at - job.run_at,
            )
        metrics.job_ended_unwatched(job.job_type, AttemptOutcome.LEASE_EXPIRED.value)
        logger.warning(
            "Job %s (%s) attempt %s: lease expired on worker %s; %s.",
            job.pk,
            job.job_type,
            job.attempts,
            job.worker_id,
            "marked failed, no attempts left" if exhausted else "scheduled again",
            extra=job_fields(job, "lease_expired", started=started_at),
        )
        if not exhausted:
            rescheduled.append(index_entry(job.pk, job.queue, job.job_type, job.run_at.timestamp()))
    return rescheduled


def _earliest_possible_start(job: DelayedJob, now: datetime) -> datetime:
    """When a run whose consumer vanished may have started: not before its claim, nor
    before its run_at (a job claimed ahead starts at its run_at), so its lateness is
    never negative; whether it started at all is unknown."""
    claimed_at = job.claimed_at or now
    return min(max(claimed_at, job.run_at), now)
