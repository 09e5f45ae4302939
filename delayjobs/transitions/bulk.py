"""Inserting many new job rows fast: COPY on PostgreSQL, ``bulk_create`` elsewhere.

``bulk_create`` prepares every field of every row in Python, which costs most of a bulk
schedule. On PostgreSQL with psycopg 3, the ids are drawn from the table's sequence in one
query and the rows are streamed with COPY, which psycopg adapts in C. Both run in the
caller's transaction and enforce every constraint the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from operator import attrgetter

from django.db import connections
from django.db.models import JSONField

from delayjobs.core.db import column, is_psycopg3
from delayjobs.models import DelayedJob, JobAttempt

BULK_CREATE_BATCH = 500
#: The columns of an attempt row, in the order ``insert_attempts`` takes its values.
ATTEMPT_FIELDS = (
    "job_id",
    "number",
    "worker_id",
    "started_at",
    "finished_at",
    "outcome",
    "error",
    "traceback",
    "lateness",
)


def insert_jobs(jobs: Sequence[DelayedJob], using: str) -> None:
    """INSERT ``jobs`` (new, unsaved) and set their primary keys."""
    if not jobs:
        return
    connection = connections[using]
    if connection.vendor == "postgresql" and is_psycopg3():
        _copy_into_postgresql(jobs, using)
    else:
        DelayedJob.objects.using(using).bulk_create(jobs, batch_size=BULK_CREATE_BATCH)


def insert_attempts(rows: Sequence[tuple[object, ...]], using: str) -> None:
    """INSERT attempt rows, each a tuple of values in ``ATTEMPT_FIELDS`` order.

    The recorder writes one per execution: on PostgreSQL with COPY (adapted in C), which
    costs a fraction of building and saving ``JobAttempt`` instances.
    """
    if not rows:
        return
    connection = connections[using]
    if connection.vendor == "postgresql" and is_psycopg3():
        meta = JobAttempt._meta
        quote = connection.ops.quote_name
        columns = ", ".join(quote(column(JobAttempt, name)) for name in ATTEMPT_FIELDS)
        with (
            connection.cursor() as cursor,
            connection.wrap_database_errors,
            cursor.cursor.copy(f"COPY {quote(meta.db_table)} ({columns}) FROM STDIN") as copy,
        ):
            for row in rows:
                copy.write_row(row)
        return
    JobAttempt.objects.using(using).bulk_create(
        [JobAttempt(**dict(zip(ATTEMPT_FIELDS, row, strict=True))) for row in rows],
        batch_size=BULK_CREATE_BATCH,
    )


def _copy_into_postgresql(jobs: Sequence[DelayedJob], using: str) -> None:
    connection = connections[using]
    meta = DelayedJob._meta
    fields = [field for field in meta.concrete_fields if not field.primary_key]
    quote = connection.ops.quote_name
    columns = ", ".join(quote(column) for column in [meta.pk.column, *(f.column for f in fields)])
    values_of = attrgetter(*(field.attname for field in fields))  # one C call per row
    # Positions in a row (after the id) of JSON values, which COPY takes as JSON text.
    json_positions = [i + 1 for i, field in enumerate(fields) if isinstance(field, JSONField)]
    with connection.cursor() as cursor:
        # One array rather than a row per id: psycopg parses it in C.
        cursor.execute(
            "SELECT array_agg(nextval(pg_get_serial_sequence(%s, %s))) FROM generate_series(1, %s)",
            [meta.db_table, meta.pk.column, len(jobs)],
        )
        ids = cursor.fetchone()[0]
        # Django's wrapper has no COPY; errors still become Django's (IntegrityError ...).
        with (
            connection.wrap_database_errors,
            cursor.cursor.copy(f"COPY {quote(meta.db_table)} ({columns}) FROM STDIN") as copy,
        ):
            for pk, job in zip(ids, jobs, strict=True):
                row = [pk, *values_of(job)]
                for position in json_positions:
                    # None is SQL NULL (a job's result before it ran), as the ORM stores it.
                    value = row[position]
                    row[position] = None if value is None else json.dumps(value)
                copy.write_row(row)
    for pk, job in zip(ids, jobs, strict=True):
        job.pk = pk
        job._state.adding = False
        job._state.db = using
