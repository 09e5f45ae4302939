"""Outcomes: how executions ended, written to the job rows and their attempt rows.

``running -> succeeded | skipped | expired | failed``, or back to ``scheduled`` for a retry;
each fenced on the claim the execution came from (``leases.running_claim``): the row
changes only while it still runs that very attempt (its number, the worker and the claim
time), so a consumer whose lease was taken over cannot overwrite a newer attempt.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connections, transaction

from delayjobs.core import clock
from delayjobs.core.db import (
    column,
    float_array,
    int_array,
    on_psycopg3_postgresql,
    server_bound_cursor,
    text_array,
    timestamp_array,
)
from delayjobs.lanes import IndexEntry, index_entry
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus, jobs_database
from delayjobs.transitions.leases import running_claim


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
    """Write a batch of finished executions: job rows and attempt rows, all or none.

    Each job row changes only if it still runs the very claim its outcome came from; its
    attempt row is written whether or not it does (the attempt happened). Returns the jobs
    that go back to ``scheduled`` for a retry, for the Redis index.

    On PostgreSQL the batch is one statement compiled once (``_postgresql_statement``):
    one round trip and one commit for any mix of outcomes, with no ORM expression built per
    batch (compiling the ORM's fenced UPDATE and its CASE cost about 1 ms a batch, most of
    the recorder's time when batches are small). Elsewhere, one transaction of
    ``executemany`` statements.
    """
    if not outcomes:
        return []
    using = jobs_database()
    rows = _rows(outcomes, clock.now())
    if connections[using].vendor == "postgresql":
        changed = _write_postgresql(rows, using)
    else:
        changed = _write_portable(rows, using)
    return [
        index_entry(row.id, outcome.job.queue, outcome.job.job_type, row.retry_at.timestamp())
        for row, outcome in zip(rows, outcomes, strict=True)
        if row.retry_at is not None and row.id in changed
    ]


class _Row(NamedTuple):
    """What one outcome writes: the fence, the job row's new values, the attempt row's."""

    # The claim it came from (the fence).
    id: int
    attempt: int
    worker_id: str
    claimed_at: datetime | None
    # The job row: its new status and execution start; finished_at (None: left alone, a
    # retry); retry_at (a retry: the new run_at, and the row is given up by its worker);
    # last_error and result (None: left alone).
    status: str
    started_at: datetime
    finished_at: datetime | None
    retry_at: datetime | None
    last_error: str | None
    result: str | None
    # The attempt row (besides the fence's id, attempt, worker and its start).
    outcome: str
    error: str
    traceback: str
    ended_at: datetime
    run_at: datetime  # the job's run_at as claimed: lateness = started_at - run_at
    limit_wait: float | None  # seconds held by a fleet-wide limit (None: no limit)


def _rows(outcomes: Sequence[Outcome], recorded_at: datetime) -> list[_Row]:
    rows = []
    for outcome in outcomes:
        job = outcome.job
        retry_at = last_error = result = None
        finished_at: datetime | None = recorded_at
        if outcome.succeeded:
            status = outcome.final_status.value
            if outcome.result is not None:
                result = json.dumps(outcome.result)
        else:
            last_error = outcome.error
            if outcome.retry_at is not None:
                status, retry_at, finished_at = JobStatus.SCHEDULED.value, outcome.retry_at, None
            else:
                status, finished_at = JobStatus.FAILED.value, outcome.finished_at
        rows.append(
            _Row(
                job.pk,
                job.attempts,
                outcome.worker_id,
                job.claimed_at,
                status,
                outcome.started_at,
                finished_at,
                retry_at,
                last_error,
                result,
                outcome.attempt_outcome.value,
                outcome.error,
                outcome.traceback,
                outcome.finished_at,
                job.run_at,
                None if job.limit_wait is None else job.limit_wait.total_seconds(),
            )
        )
    return rows


def _write_postgresql(rows: list[_Row], using: str) -> set[int]:
    """The batch in one statement; the ids of the job rows it changed."""
    params = [
        to_array(values)
        for (to_array, _type), values in zip(_ARRAYS, zip(*rows, strict=True), strict=True)
    ]
    connection = connections[using]
    # Bound on the server with psycopg 3: the arrays' text is not quoted again in Python.
    cursor = (
        server_bound_cursor(connection)
        if on_psycopg3_postgresql(connection)
        else connection.cursor()
    )
    with cursor:
        cursor.execute(_postgresql_statement(using), [*params, JobStatus.RUNNING.value])
        return {pk for (pk,) in cursor.fetchall()}


#: How each column of ``_Row`` is sent to PostgreSQL: one array literal per column (see
#: ``core.db.int_array``), and its type.
_ARRAYS: tuple[tuple[Callable[[Any], str], str], ...] = (
    (int_array, "bigint[]"),  # id
    (int_array, "integer[]"),  # attempt
    (text_array, "text[]"),  # worker_id
    (timestamp_array, "timestamptz[]"),  # claimed_at
    (text_array, "text[]"),  # status
    (timestamp_array, "timestamptz[]"),  # started_at
    (timestamp_array, "timestamptz[]"),  # finished_at
    (timestamp_array, "timestamptz[]"),  # retry_at
    (text_array, "text[]"),  # last_error
    (text_array, "text[]"),  # result
    (text_array, "text[]"),  # outcome
    (text_array, "text[]"),  # error
    (text_array, "text[]"),  # traceback
    (timestamp_array, "timestamptz[]"),  # ended_at
    (timestamp_array, "timestamptz[]"),  # run_at
    (float_array, "float8[]"),  # limit_wait
)


def _postgresql_statement(using: str) -> str:
    return _compiled_postgresql_statement(using, connections[using].vendor)


@functools.cache
def _compiled_postgresql_statement(using: str, vendor: str) -> str:
    """The batch's statement, compiled once per database alias (and its vendor: tests may
    point an alias elsewhere): the attempt rows inserted, the job rows still running their
    claim updated (the fence), the ids of those returned. Parameters: one array per column
    of ``_Row``, then the running status.

    One statement, so all or none without a transaction of its own; the INSERT in the
    WITH clause runs to its end whether or not the UPDATE reads from it.
    """
    quote = connections[using].ops.quote_name

    def job(name: str) -> str:
        return quote(column(DelayedJob, name))

    def attempt(name: str) -> str:
        return quote(column(JobAttempt, name))

    arrays = ", ".join(f"%s::{kind}" for _to_array, kind in _ARRAYS)
    names = ", ".join(_Row._fields)
    return f"""
        WITH d AS (SELECT * FROM unnest({arrays}) AS d({names})),
        attempts AS (
            INSERT INTO {quote(JobAttempt._meta.db_table)} (
                {attempt("job")}, {attempt("number")}, {attempt("worker_id")},
                {attempt("started_at")}, {attempt("finished_at")}, {attempt("outcome")},
                {attempt("error")}, {attempt("traceback")}, {attempt("lateness")},
                {attempt("limit_wait")}
            )
            SELECT id, attempt, worker_id, started_at, ended_at, outcome, error, traceback,
                started_at - run_at, make_interval(secs => limit_wait)
            FROM d
        )
        UPDATE {quote(DelayedJob._meta.db_table)} AS j SET
            {job("status")} = d.status,
            {job("started_at")} = d.started_at,
            {job("finished_at")} = CASE WHEN d.retry_at IS NULL
                THEN d.finished_at ELSE j.{job("finished_at")} END,
            {job("lease_expires_at")} = NULL,
            {job("run_at")} = COALESCE(d.retry_at, j.{job("run_at")}),
            {job("worker_id")} = CASE WHEN d.retry_at IS NULL
                THEN j.{job("worker_id")} ELSE '' END,
            {job("last_error")} = COALESCE(d.last_error, j.{job("last_error")}),
            {job("result")} = COALESCE(d.result::jsonb, j.{job("result")})
        FROM d
        WHERE j.{quote(DelayedJob._meta.pk.column)} = d.id
            AND j.{job("status")} = %s
            AND j.{job("attempts")} = d.attempt
            AND j.{job("worker_id")} = d.worker_id
            AND j.{job("claimed_at")} IS NOT DISTINCT FROM d.claimed_at
        RETURNING j.{quote(DelayedJob._meta.pk.column)}
    """


def _write_portable(rows: list[_Row], using: str) -> set[int]:
    """The batch in one transaction, ``executemany`` for the ends and the attempt rows; the
    ids of the retries whose fence held (each written alone, to know that)."""
    connection = connections[using]
    end, retry, insert = _portable_statements(using, connection.vendor)
    prepare = _Values(connection)
    changed: set[int] = set()
    with transaction.atomic(using=using), connection.cursor() as cursor:
        ends = [prepare.end(row) for row in rows if row.retry_at is None]
        if ends:
            cursor.executemany(end, ends)
        for row in rows:
            if row.retry_at is not None:
                cursor.execute(retry, prepare.retry(row))
                if cursor.rowcount:
                    changed.add(row.id)
        cursor.executemany(insert, [prepare.attempt(row) for row in rows])
    return changed


class _Values:
    """A row's values as ``connection`` stores them (as the fields prepare them)."""

    def __init__(self, connection: Any) -> None:
        self._datetime = connection.ops.adapt_datetimefield_value
        self._duration = functools.partial(
            JobAttempt._meta.get_field("lateness").get_db_prep_save, connection=connection
        )

    def fence(self, row: _Row) -> list[Any]:
        claimed_at = self._datetime(row.claimed_at)
        return [row.id, JobStatus.RUNNING.value, row.attempt, row.worker_id, claimed_at, claimed_at]

    def end(self, row: _Row) -> list[Any]:
        return [
            row.status,
            self._datetime(row.started_at),
            self._datetime(row.finished_at),
            row.last_error,
            row.result,  # JSON text, as a JSON column stores it
            *self.fence(row),
        ]

    def retry(self, row: _Row) -> list[Any]:
        return [
            row.status,
            self._datetime(row.started_at),
            self._datetime(row.retry_at),
            row.last_error,
            *self.fence(row),
        ]

    def attempt(self, row: _Row) -> list[Any]:
        return [
            row.id,
            row.attempt,
            row.worker_id,
            self._datetime(row.started_at),
            self._datetime(row.ended_at),
            row.outcome,
            row.error,
            row.traceback,
            self._duration(row.started_at - row.run_at),
            None if row.limit_wait is None else self._duration(timedelta(seconds=row.limit_wait)),
        ]


@functools.cache
def _portable_statements(using: str, vendor: str) -> tuple[str, str, str]:
    """The end of a job, its retry and an attempt row, for ``executemany``: the values of
    ``_Values.end``, ``_Values.retry`` and ``_Values.attempt``."""
    quote = connections[using].ops.quote_name

    def job(name: str) -> str:
        return quote(column(DelayedJob, name))

    def attempt(name: str) -> str:
        return quote(column(JobAttempt, name))

    fence = (
        f"{quote(DelayedJob._meta.pk.column)} = %s AND {job('status')} = %s"
        f" AND {job('attempts')} = %s AND {job('worker_id')} = %s"
        f" AND ({job('claimed_at')} = %s OR ({job('claimed_at')} IS NULL AND %s IS NULL))"
    )
    table = quote(DelayedJob._meta.db_table)
    end = (
        f"UPDATE {table} SET {job('status')} = %s, {job('started_at')} = %s,"
        f" {job('finished_at')} = %s, {job('lease_expires_at')} = NULL,"
        f" {job('last_error')} = COALESCE(%s, {job('last_error')}),"
        f" {job('result')} = COALESCE(%s, {job('result')}) WHERE {fence}"
    )
    retry = (
        f"UPDATE {table} SET {job('status')} = %s, {job('started_at')} = %s,"
        f" {job('lease_expires_at')} = NULL, {job('run_at')} = %s, {job('worker_id')} = '',"
        f" {job('last_error')} = %s WHERE {fence}"
    )
    columns = ", ".join(
        attempt(name)
        for name in (
            "job",
            "number",
            "worker_id",
            "started_at",
            "finished_at",
            "outcome",
            "error",
            "traceback",
            "lateness",
            "limit_wait",
        )
    )
    insert = (
        f"INSERT INTO {quote(JobAttempt._meta.db_table)} ({columns})"
        f" VALUES ({', '.join(['%s'] * 10)})"
    )
    return end, retry, insert
