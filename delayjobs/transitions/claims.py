"""Claims: ``scheduled -> running``, from ids popped off Redis or straight from the rows.

A claim is one conditional UPDATE whose rows returned are the jobs won, so two consumers
racing for a job cannot both win it (invariant 3 of docs/explanation/design.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
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
from django.db.models.functions import Greatest

from delayjobs.core.db import (
    column,
    fetch_models,
    int_array,
    model_columns,
    text_array,
    update_returning,
)
from delayjobs.models import DelayedJob, JobStatus, Pause, PauseKind, jobs_database

#: A job popped from Redis is claimed only if its row is due by then (plus this much, to
#: absorb float rounding of the Redis score). A row moved later in the meantime is not.
CLAIM_TOLERANCE = timedelta(milliseconds=5)


@dataclass(frozen=True)
class Candidate:
    """A due job as seen before its claim."""

    pk: int
    queue: str
    job_type: str


def claim(
    ids: Sequence[int],
    *,
    worker_id: str,
    now: datetime,
    job_types: Sequence[str],
    leases: Mapping[str, timedelta],
    default_lease: timedelta,
    ahead: timedelta = timedelta(0),
    limit_keys: Sequence[str] | None = None,
) -> list[DelayedJob]:
    """``scheduled -> running`` for the due rows among ``ids``; return the rows won.

    A row is won if it is scheduled, due by ``now + ahead`` (plus CLAIM_TOLERANCE) and of
    a job type this consumer knows (others are left to a consumer that knows them, instead
    of spending their attempts here). ``now`` doubles as the claim's token: the caller
    gives every claim a distinct value. With ``ahead``, jobs not due yet are claimed: the
    caller must not start one before its ``run_at``. With ``limit_keys``, only rows
    counted under one of those fleet-wide limit keys (the caller has reserved room in
    them: ``delayjobs.transitions.reservations``).
    """
    if not ids:
        return []
    cutoff = now + ahead + CLAIM_TOLERANCE
    database = jobs_database()
    if connections[database].features.has_select_for_update_skip_locked:
        return _claim_skipping_locked(
            ids, worker_id, now, cutoff, set(job_types), leases, default_lease, database, limit_keys
        )
    return _claim_with_update(
        ids, worker_id, now, cutoff, job_types, leases, default_lease, limit_keys
    )


def _claim_skipping_locked(
    ids: Sequence[int],
    worker_id: str,
    now: datetime,
    cutoff: datetime,
    known: set[str],
    leases: Mapping[str, timedelta],
    default_lease: timedelta,
    database: str,
    limit_keys: Sequence[str] | None,
) -> list[DelayedJob]:
    """The claim where rows can be locked with SKIP LOCKED (PostgreSQL): one statement.

    Rows held by a caller's open transaction (replace, reschedule, cancel) are skipped,
    not waited for, so the claim never stalls the consumer. Every condition but the
    primary key is checked on the CTE's locked copy of the row (its latest version,
    locked until the statement ends), so the table is only reached by primary key,
    whatever the planner's statistics say: a condition on status or run_at of the table
    itself could be answered from those indexes instead, reading every due row of a
    backlog to claim ten.

    The statement is compiled once per database and set of job types with a lease of
    their own (``_skip_locked_statement``); the ids and job types go as one array literal
    each, bound on the server where the driver can.
    """
    params: list[Any] = [int_array(ids), JobStatus.RUNNING, worker_id, now, now]
    for name, ttl in leases.items():
        params += [name, ttl]
    params += [default_lease, JobStatus.SCHEDULED, cutoff, text_array(sorted(known))]
    params += NOT_PAUSED_PARAMS
    if limit_keys is not None:
        params.append(text_array(limit_keys))
    sql = _skip_locked_statement(
        database, connections[database].vendor, tuple(leases), keyed=limit_keys is not None
    )
    return fetch_models(DelayedJob, database, sql, params, bind_on_server=True)


@functools.cache
def _skip_locked_statement(
    database: str, vendor: str, leased_types: tuple[str, ...], *, keyed: bool
) -> str:
    """The SKIP LOCKED claim's SQL for ``database`` (and its vendor: tests may point an
    alias elsewhere), with a lease CASE over ``leased_types``, in that order; ``keyed``:
    for the rows of some limit keys only."""
    meta = DelayedJob._meta
    quote = connections[database].ops.quote_name
    table = quote(meta.db_table)
    pk = quote(meta.pk.column)
    c = {name: quote(column(DelayedJob, name)) for name in _CLAIM_COLUMNS}
    # The lease runs from the claim or, for a job claimed ahead, from its run_at (see
    # lease_start): the default time to run, or its type's own where it has one.
    time_to_run = "%s::interval"
    if leased_types:
        cases = " ".join("WHEN %s THEN %s::interval" for _ in leased_types)
        time_to_run = f"CASE {table}.{c['job_type']} {cases} ELSE %s::interval END"
    lease = f"GREATEST(locked.{c['run_at']}, %s::timestamptz) + {time_to_run}"
    columns = model_columns(DelayedJob, database, qualified=True)
    of_keys = f"AND locked.{c['limit_key']} = ANY(%s::text[])" if keyed else ""
    return f"""
        WITH locked AS MATERIALIZED (
            SELECT {pk}, {c["status"]}, {c["run_at"]}, {c["job_type"]}, {c["queue"]},
                {c["limit_key"]}
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
            AND locked.{c["job_type"]} = ANY(%s::text[])
            AND {not_paused_sql(database, "locked." + c["queue"], "locked." + c["job_type"])}
            {of_keys}
        RETURNING {columns}
    """


#: The parameters of ``not_paused_sql``'s condition, in its order.
NOT_PAUSED_PARAMS = (PauseKind.QUEUE, PauseKind.JOB_TYPE)


def not_paused_sql(database: str, queue: str, job_type: str) -> str:
    """``paused_rows`` negated, for hand-written SQL: neither the ``queue`` nor the
    ``job_type`` (column expressions) is paused. Its parameters: ``NOT_PAUSED_PARAMS``."""
    quote = connections[database].ops.quote_name
    pauses = quote(Pause._meta.db_table)
    kind = quote(column(Pause, "kind"))
    name = quote(column(Pause, "name"))
    return f"""NOT EXISTS (
                SELECT 1 FROM {pauses} p
                WHERE (p.{kind} = %s AND p.{name} = {queue})
                    OR (p.{kind} = %s AND p.{name} = {job_type})
            )"""


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
    "limit_key",
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
    limit_keys: Sequence[str] | None = None,
) -> list[DelayedJob]:
    """The portable claim: one conditional UPDATE (with RETURNING where there is one).

    SQLite locks the whole database for a write, so there is no row lock to skip.
    """
    due = DelayedJob.objects.filter(
        pk__in=ids, status=JobStatus.SCHEDULED, run_at__lte=cutoff, job_type__in=job_types
    ).exclude(paused_rows())
    if limit_keys is not None:
        due = due.filter(limit_key__in=limit_keys)
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


def paused_rows() -> Exists:
    """The row's queue or job type is paused: checked by the claim itself, so that no
    consumer claims paused work, whatever its in-memory view of the pauses."""
    return Exists(
        Pause.objects.filter(
            Q(kind=PauseKind.QUEUE, name=OuterRef("queue"))
            | Q(kind=PauseKind.JOB_TYPE, name=OuterRef("job_type"))
        )
    )
