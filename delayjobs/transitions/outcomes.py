"""Outcomes: how executions ended, written to the job rows and their attempt rows.

``running -> succeeded | skipped | expired | failed``, or back to ``scheduled`` for a retry;
each fenced on the claim the execution came from (``leases.running_claim``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import DateTimeField, Value
from django.db.models.expressions import RawSQL

from delayjobs.core import clock
from delayjobs.lanes import IndexEntry, index_entry
from delayjobs.models import AttemptOutcome, DelayedJob, JobStatus, jobs_database
from delayjobs.transitions.bulk import insert_attempts
from delayjobs.transitions.leases import running_claim, running_claims


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
            running_claim([job.pk], job.attempts, outcome.worker_id, job.claimed_at)
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
        # Plain ends by worker and final status, then by claim: one UPDATE each, fenced
        # on every claim its rows came from.
        ends: dict[tuple[str, JobStatus], dict[tuple[int, datetime | None], list[Outcome]]] = {}
        for outcome in outcomes:
            job = outcome.job
            if outcome.succeeded and outcome.result is None:
                claims = ends.setdefault((outcome.worker_id, outcome.final_status), {})
                claims.setdefault((job.attempts, job.claimed_at), []).append(outcome)
            elif outcome.succeeded:
                running_claim([job.pk], job.attempts, outcome.worker_id, job.claimed_at).update(
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
        for (worker_id, status), claims in ends.items():
            ended = [outcome for claim in claims.values() for outcome in claim]
            fence = {claim: [o.job.pk for o in claimed] for claim, claimed in claims.items()}
            running_claims(fence, worker_id).update(
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
    changed = running_claim([job.pk], job.attempts, outcome.worker_id, job.claimed_at).update(
        last_error=outcome.error, started_at=outcome.started_at, lease_expires_at=None, **changes
    )
    return bool(changed)


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
