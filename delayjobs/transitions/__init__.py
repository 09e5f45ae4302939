"""Every change of a job's status, and nothing else.

Each transition is a conditional ``UPDATE ... WHERE status = <expected>`` whose row count
says whether it happened, so two processes racing for the same job cannot both win
(invariant 3 of docs/explanation/design.md). Transitions out of ``running`` are also
fenced on the attempt number and worker, so a consumer whose lease expired cannot
overwrite the outcome of the attempt that replaced it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction
from django.db.models import (
    Case,
    DateTimeField,
    DurationField,
    Exists,
    F,
    OuterRef,
    Q,
    QuerySet,
    Value,
    When,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Greatest
from django.utils import timezone

from delayjobs import clock, metrics
from delayjobs.bulk import insert_attempts
from delayjobs.db import column, fetch_models, update_returning
from delayjobs.exceptions import DuplicateJob, InvalidTransition
from delayjobs.logfields import job_fields
from delayjobs.models import (
    RETRYABLE_STATUSES,
    AttemptOutcome,
    DelayedJob,
    JobAttempt,
    JobStatus,
    Pause,
    PauseKind,
    jobs_database,
)
from delayjobs.redis_store import index_entry
from delayjobs.slots import Candidate

if TYPE_CHECKING:
    from delayjobs.redis_store import IndexEntry

logger = logging.getLogger(__name__)

#: A job popped from Redis is claimed only if its row is due by then (plus this much, to
#: absorb float rounding of the Redis score). A row moved later in the meantime is not.
CLAIM_TOLERANCE = timedelta(milliseconds=5)


def claim(
    ids: Sequence[int],
    *,
    worker_id: str,
    now: datetime,
    job_types: Sequence[str],
    leases: Mapping[str, timedelta],
    default_lease: timedelta,
    ahead: timedelta = timedelta(0),
) -> list[DelayedJob]:
    """``scheduled -> running`` for the due rows among ``ids``; return the rows won.

    A row is won if it is scheduled, due by ``now + ahead`` (plus CLAIM_TOLERANCE) and of
    a job type this consumer knows (others are left to a consumer that knows them, instead
    of spending their attempts here). ``now`` doubles as the claim's token: the caller
    gives every claim a distinct value. With ``ahead``, jobs not due yet are claimed: the
    caller must not start one before its ``run_at``.
    """
    if not ids:
        return []
    cutoff = now + ahead + CLAIM_TOLERANCE
    database = jobs_database()
    if connections[database].features.has_select_for_update_skip_locked:
        return _claim_skipping_locked(
            ids, worker_id, now, cutoff, set(job_types), leases, default_lease, database
        )
    return _claim_with_update(ids, worker_id, now, cutoff, job_types, leases, default_lease)


def _claim_skipping_locked(
    ids: Sequence[int],
    worker_id: str,
    now: datetime,
    cutoff: datetime,
    known: set[str],
    leases: Mapping[str, timedelta],
    default_lease: timedelta,
    database: str,
) -> list[DelayedJob]:
    """The claim where rows can be locked with SKIP LOCKED (PostgreSQL): one statement.

    Rows held by a caller's open transaction (replace, reschedule, cancel) are skipped,
    not waited for, so the claim never stalls the consumer. Every condition but the
    primary key is checked on the CTE's locked copy of the row (its latest version,
    locked until the statement ends), so the table is only reached by primary key,
    whatever the planner's statistics say: a condition on status or run_at of the table
    itself could be answered from those indexes instead, reading every due row of a
    backlog to claim ten.
    """
    meta = DelayedJob._meta
    quote = connections[database].ops.quote_name
    table = quote(meta.db_table)
    pauses = quote(Pause._meta.db_table)
    pause_kind = quote(column(Pause, "kind"))
    pause_name = quote(column(Pause, "name"))
    pk = quote(meta.pk.column)
    c = {name: quote(column(DelayedJob, name)) for name in _CLAIM_COLUMNS}
    # The lease runs from the claim or, for a job claimed ahead, from its run_at (see
    # lease_start): the default time to run, or its type's own where it has one.
    time_to_run = "%s::interval"
    if leases:
        cases = " ".join("WHEN %s THEN %s::interval" for _ in leases)
        time_to_run = f"CASE {table}.{c['job_type']} {cases} ELSE %s::interval END"
    lease = f"GREATEST(locked.{c['run_at']}, %s::timestamptz) + {time_to_run}"
    sql = f"""
        WITH locked AS MATERIALIZED (
            SELECT {pk}, {c["status"]}, {c["run_at"]}, {c["job_type"]}, {c["queue"]}
            FROM {table} WHERE {pk} = ANY(%s::bigint[]) FOR UPDATE SKIP LOCKED
        )
        UPDATE {table} SET
            {c["status"]} = %s,
            {c["attempts"]} = {table}.{c["attempts"]} + 1,
            {c["worker_id"]} = %s,
            {c["claimed_at"]} = %s,
            {c["finished_at"]} = NULL,
            {c["lease_expires_at"]} = {lease}
        FROM locked
        WHERE {table}.{pk} = locked.{pk}
            AND locked.{c["status"]} = %s
            AND locked.{c["run_at"]} <= %s
            AND locked.{c["job_type"]} = ANY(%s)
            AND NOT EXISTS (
                SELECT 1 FROM {pauses} p
                WHERE (p.{pause_kind} = %s AND p.{pause_name} = locked.{c["queue"]})
                    OR (p.{pause_kind} = %s AND p.{pause_name} = locked.{c["job_type"]})
            )
        RETURNING {{columns}}
    """
    # The ids as an array literal: psycopg would adapt a list in Python, item by item.
    id_array = "{" + ",".join(str(int(pk)) for pk in ids) + "}"
    params: list[Any] = [id_array, JobStatus.RUNNING, worker_id, now, now]
    for name, ttl in leases.items():
        params += [name, ttl]
    params += [default_lease, JobStatus.SCHEDULED, cutoff, sorted(known)]
    params += [PauseKind.QUEUE, PauseKind.JOB_TYPE]
    return fetch_models(DelayedJob, database, sql, params, qualified=True)


_CLAIM_COLUMNS = (
    "status",
    "attempts",
    "worker_id",
    "claimed_at",
    "finished_at",
    "lease_expires_at",
    "job_type",
    "run_at",
    "queue",
)


def lease_start(claimed_at: datetime) -> Greatest:
    """Where a claimed job's lease starts: at the claim, or at its run_at if it was claimed
    ahead. Its thread waits for run_at before starting it, so a lease counted from the
    claim could expire (and the job run again elsewhere) while the first run still waits.
    """
    return Greatest(F("run_at"), Value(claimed_at, output_field=DateTimeField()))


def _claim_with_update(
    ids: Sequence[int],
    worker_id: str,
    now: datetime,
    cutoff: datetime,
    job_types: Sequence[str],
    leases: Mapping[str, timedelta],
    default_lease: timedelta,
) -> list[DelayedJob]:
    """The portable claim: one conditional UPDATE (with RETURNING where there is one).

    SQLite locks the whole database for a write, so there is no row lock to skip.
    """
    due = DelayedJob.objects.filter(
        pk__in=ids, status=JobStatus.SCHEDULED, run_at__lte=cutoff, job_type__in=job_types
    ).exclude(_paused())
    changes = {
        "status": JobStatus.RUNNING,
        "attempts": F("attempts") + 1,
        "worker_id": worker_id,
        "claimed_at": now,
        "finished_at": None,
        "lease_expires_at": lease_start(now)
        + Case(
            *[When(job_type=name, then=Value(ttl)) for name, ttl in leases.items()],
            default=Value(default_lease),
            output_field=DurationField(),
        ),
    }
    claimed = update_returning(due, **changes)
    if claimed is not None:
        return claimed
    if not due.update(**changes):
        return []
    # No RETURNING: the claim's token (worker and ``now``) finds exactly the rows won.
    return list(
        DelayedJob.objects.filter(
            pk__in=ids, status=JobStatus.RUNNING, worker_id=worker_id, claimed_at=now
        )
    )


def claim_due(
    *,
    queues: Sequence[str],
    job_types: Sequence[str],
    limit: int,
    choose: Callable[[list[Candidate]], list[Candidate]],
    worker_id: str,
    now: datetime,
    leases: Mapping[str, timedelta],
    default_lease: timedelta,
) -> list[DelayedJob]:
    """Claim due jobs straight from the database, without Redis (Redis-down mode).

    Reads up to ``limit`` due rows of ``queues`` and ``job_types`` in due order (by the
    index; the higher priority first among them), lets
    ``choose`` keep those that fit the consumer's slots, and claims them, in one
    transaction. On PostgreSQL the rows read are locked with SKIP LOCKED, so consumers
    polling together each get different rows instead of racing for the same ones; the
    claim itself is the usual conditional one either way.
    """
    if limit <= 0 or not queues or not job_types:
        return []
    database = jobs_database()
    due = DelayedJob.objects.filter(
        status=JobStatus.SCHEDULED,
        # Not CLAIM_TOLERANCE: that absorbs the float rounding of Redis scores, and rows
        # read here have none. A job never starts before its run_at.
        run_at__lte=now,
        queue__in=queues,
        job_type__in=job_types,
    ).order_by("run_at", "id")  # the partial index scheduled_due, never a sort of the backlog
    if not connections[database].features.has_select_for_update_skip_locked:
        # No row locks to take (SQLite locks the database): read, then claim conditionally.
        # Not in one transaction, whose write after a read would fail to upgrade its lock
        # ("database is locked") whenever another consumer writes in between.
        return _claim_chosen(due, limit, choose, worker_id, now, job_types, leases, default_lease)
    with transaction.atomic(using=database):
        return _claim_chosen(
            due.select_for_update(skip_locked=True),
            limit,
            choose,
            worker_id,
            now,
            job_types,
            leases,
            default_lease,
        )


def _claim_chosen(
    due: QuerySet[DelayedJob],
    limit: int,
    choose: Callable[[list[Candidate]], list[Candidate]],
    worker_id: str,
    now: datetime,
    job_types: Sequence[str],
    leases: Mapping[str, timedelta],
    default_lease: timedelta,
) -> list[DelayedJob]:
    rows = due.values_list("pk", "queue", "job_type", "priority")[:limit]
    # All are due: among them, the higher priority first (stable: due order otherwise).
    ordered = sorted(rows, key=lambda row: -row[3])
    chosen = choose([Candidate(pk, queue, job_type) for pk, queue, job_type, _ in ordered])
    return claim(
        [candidate.pk for candidate in chosen],
        worker_id=worker_id,
        now=now,
        job_types=job_types,
        leases=leases,
        default_lease=default_lease,
    )


def _paused() -> Exists:
    """The row's queue or job type is paused: checked by the claim itself, so that no
    consumer claims paused work, whatever its in-memory view of the pauses."""
    return Exists(
        Pause.objects.filter(
            Q(kind=PauseKind.QUEUE, name=OuterRef("queue"))
            | Q(kind=PauseKind.JOB_TYPE, name=OuterRef("job_type"))
        )
    )


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
    changed = _running([job.pk], job.attempts, worker_id, job.claimed_at).update(
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


@dataclass(frozen=True)
class Outcome:
    """How one execution ended, as decided by the consumer from the job type's policy."""

    job: DelayedJob
    worker_id: str
    started_at: datetime
    finished_at: datetime
    error: str = ""
    traceback: str = ""
    #: For a failed execution: when to try again, or None to mark the job failed.
    retry_at: datetime | None = None
    #: The execution ran past its time_to_run; it may still be running, unheeded.
    timed_out: bool = False
    #: What ``execute`` returned (already checked to be storable JSON), for ``job.result``.
    result: Any = None
    #: ``should_run`` said no: the job ends ``skipped``, not executed.
    skipped: bool = False
    #: It could only start past its ``max_lateness``: the job ends ``expired``, not run.
    expired: bool = False

    @property
    def succeeded(self) -> bool:
        return not self.error and not self.traceback

    @property
    def final_status(self) -> JobStatus:
        """The job's status once this outcome is written, for a clean end."""
        if self.expired:
            return JobStatus.EXPIRED
        if self.skipped:
            return JobStatus.SKIPPED
        return JobStatus.SUCCEEDED

    @property
    def attempt_outcome(self) -> AttemptOutcome:
        if self.timed_out:
            return AttemptOutcome.TIMED_OUT
        if self.succeeded:
            return AttemptOutcome(self.final_status.value)
        return AttemptOutcome.RETRYING if self.retry_at else AttemptOutcome.FAILED


def record_outcome_if_held(outcome: Outcome) -> list[IndexEntry] | None:
    """Write one execution only if its claim still holds; None (nothing written) if not.

    For an execution nobody watched over (a Celery worker's): if its lease expired and
    the reaper recorded the attempt as ``lease_expired`` and moved the job on, its late
    return must not add a contradicting attempt row, nor count at all.
    """
    job = outcome.job
    with transaction.atomic(using=jobs_database()):
        held = (
            _running([job.pk], job.attempts, outcome.worker_id, job.claimed_at)
            .select_for_update()
            .exists()
        )
        return record_outcomes([outcome]) if held else None


def record_outcomes(outcomes: Sequence[Outcome]) -> list[IndexEntry]:
    """Write a batch of finished executions: job rows and attempt rows, in one transaction.

    Returns the jobs that go back to ``scheduled`` for a retry, for the Redis index.
    """
    retries: list[IndexEntry] = []
    if not outcomes:
        return retries
    recorded_at = clock.now()
    with transaction.atomic(using=jobs_database()):
        # Clean ends without a result are the common case: one UPDATE per claim they came
        # from and status they end in.
        ends: dict[tuple[str, int, datetime | None, JobStatus], list[Outcome]] = {}
        for outcome in outcomes:
            job = outcome.job
            if outcome.succeeded and outcome.result is None:
                end = (outcome.worker_id, job.attempts, job.claimed_at, outcome.final_status)
                ends.setdefault(end, []).append(outcome)
            elif outcome.succeeded:
                _running([job.pk], job.attempts, outcome.worker_id, job.claimed_at).update(
                    status=JobStatus.SUCCEEDED,
                    started_at=outcome.started_at,
                    finished_at=recorded_at,
                    lease_expires_at=None,
                    result=outcome.result,
                )
            elif _record_failure(outcome) and outcome.retry_at is not None:
                retries.append(
                    index_entry(job.pk, job.queue, job.job_type, outcome.retry_at.timestamp())
                )
        for (worker_id, attempt, claimed_at, status), ended in ends.items():
            _running([o.job.pk for o in ended], attempt, worker_id, claimed_at).update(
                status=status,
                started_at=_execution_starts(ended),
                finished_at=recorded_at,
                lease_expires_at=None,
            )
        # The attempt happened whether or not the fence held, so it is always recorded.
        insert_attempts([_attempt_row(outcome) for outcome in outcomes], jobs_database())
    return retries


def _execution_starts(outcomes: Sequence[Outcome]) -> Value | RawSQL:
    """Each job's execution start, for one UPDATE of several rows: a CASE on the pk.

    Written as SQL text, not as When() expressions: compiling those costs about 0.1 ms
    each, a tenth of a consumer's CPU per job in a backlog.
    """
    if len(outcomes) == 1:
        return Value(outcomes[0].started_at)
    connection = connections[jobs_database()]
    pk = connection.ops.quote_name(DelayedJob._meta.pk.column)
    params: list[Any] = []
    for outcome in outcomes:
        started = connection.ops.adapt_datetimefield_value(outcome.started_at)
        params += [int(outcome.job.pk), started]
    cases = " ".join(["WHEN %s THEN %s"] * len(outcomes))
    return RawSQL(f"CASE {pk} {cases} END", params, output_field=DateTimeField())


def _record_failure(outcome: Outcome) -> bool:
    job = outcome.job
    if outcome.retry_at is not None:
        changes: dict[str, Any] = {
            "status": JobStatus.SCHEDULED,
            "run_at": outcome.retry_at,
            "worker_id": "",
        }
    else:
        changes = {"status": JobStatus.FAILED, "finished_at": outcome.finished_at}
    changed = _running([job.pk], job.attempts, outcome.worker_id, job.claimed_at).update(
        last_error=outcome.error, started_at=outcome.started_at, lease_expires_at=None, **changes
    )
    return bool(changed)


def _running(
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


def _attempt_row(outcome: Outcome) -> tuple[object, ...]:
    """The attempt row of an outcome, in ``bulk.ATTEMPT_FIELDS`` order."""
    job = outcome.job
    return (
        job.pk,
        job.attempts,
        outcome.worker_id,
        outcome.started_at,
        outcome.finished_at,
        outcome.attempt_outcome.value,
        outcome.error,
        outcome.traceback,
        outcome.started_at - job.run_at,
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


def retry(job: DelayedJob) -> DelayedJob:
    """``failed | cancelled | succeeded -> scheduled``, due now, with a fresh attempt budget.

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
