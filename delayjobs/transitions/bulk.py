"""Inserting new job rows fast: COPY on PostgreSQL, ``bulk_create`` elsewhere; one row
with a statement compiled once.

``bulk_create`` prepares every field of every row in Python, which costs most of a bulk
schedule. On PostgreSQL with psycopg 3, the ids are drawn from the table's sequence in one
query and the rows are streamed with COPY, which psycopg adapts in C. Both run in the
caller's transaction and enforce every constraint the same way.

A single row (``schedule()``): ``Model.save()`` compiles its INSERT again on every call and
prepares each field in Python, about 0.2 ms, a quarter of a durable ``schedule()``. On
PostgreSQL with psycopg 3, the same statement is compiled by Django once per database and
sent through Django's cursor wrapper (so query logging and execute wrappers see it) with the
row's values as they are, bound on the server. Unless a ``pre_save``/``post_save`` receiver
listens to ``DelayedJob``: then ``save()`` runs, signals and all.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from django.db import connections
from django.db.models import JSONField
from django.db.models.signals import post_save, pre_save
from django.db.models.sql import InsertQuery

from delayjobs.core.db import on_psycopg3_postgresql, server_bound_cursor
from delayjobs.models import DelayedJob

BULK_CREATE_BATCH = 500


def insert_jobs(jobs: Sequence[DelayedJob], using: str) -> None:
    """INSERT ``jobs`` (new, unsaved) and set their primary keys."""
    if not jobs:
        return
    connection = connections[using]
    if on_psycopg3_postgresql(connection):
        _copy_into_postgresql(jobs, using)
    else:
        DelayedJob.objects.using(using).bulk_create(jobs, batch_size=BULK_CREATE_BATCH)


def insert_job(job: DelayedJob, using: str) -> None:
    """INSERT ``job`` (new, unsaved) and set its primary key: ``job.save(force_insert=True)``."""
    connection = connections[using]
    if not _one_row_insert_applies(connection):
        job.save(force_insert=True, using=using)
        return
    sql = _insert_statement(using, connection.vendor)
    with server_bound_cursor(connection) as cursor:
        cursor.execute(sql, _row_values(job))
        (pk,) = cursor.fetchone()
    _mark_saved([job], [pk], using)


def _one_row_insert_applies(connection: Any) -> bool:
    """Whether ``insert_job`` may bypass ``save()``: PostgreSQL through psycopg 3, and no
    receiver of ``DelayedJob``'s save signals to miss them."""
    return (
        on_psycopg3_postgresql(connection)
        and not pre_save.has_listeners(DelayedJob)
        and not post_save.has_listeners(DelayedJob)
    )


def _copy_into_postgresql(jobs: Sequence[DelayedJob], using: str) -> None:
    connection = connections[using]
    meta = DelayedJob._meta
    quote = connection.ops.quote_name
    columns = ", ".join(
        quote(column) for column in [meta.pk.column, *(f.column for f in _inserted_fields())]
    )
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
                copy.write_row([pk, *_row_values(job)])
    _mark_saved(jobs, ids, using)


def _inserted_fields() -> list[Any]:
    """The fields an INSERT of a new job writes: every concrete one but the id."""
    return [field for field in DelayedJob._meta.concrete_fields if not field.primary_key]


@functools.cache
def _row_layout() -> tuple[attrgetter[Any], list[int]]:
    """A getter of a job's inserted values (one C call per row), and the positions among
    them of JSON values, which PostgreSQL takes as JSON text (COPY and INSERT alike)."""
    fields = _inserted_fields()
    json_positions = [i for i, field in enumerate(fields) if isinstance(field, JSONField)]
    return attrgetter(*(field.attname for field in fields)), json_positions


def _row_values(job: DelayedJob) -> list[Any]:
    """The values of ``job``'s row on PostgreSQL with psycopg 3, in ``_inserted_fields()`` order.

    No field of a new job needs preparing beyond its JSON: its defaults are set at
    construction and none is ``auto_now``; psycopg adapts datetimes, intervals and text.
    """
    values_of, json_positions = _row_layout()
    row = list(values_of(job))
    for position in json_positions:
        # None is SQL NULL (a job's result before it ran), as the ORM stores it.
        value = row[position]
        row[position] = None if value is None else json.dumps(value)
    return row


@functools.cache
def _insert_statement(using: str, vendor: str) -> str:
    """The INSERT of one new job, RETURNING its id, as Django compiles it for ``using``.

    Cached per database alias, and its vendor: tests may point an alias elsewhere.
    """
    connection = connections[using]
    query = InsertQuery(DelayedJob)
    query.insert_values(_inserted_fields(), [DelayedJob()])
    compiler = query.get_compiler(using=using, connection=connection)
    compiler.returning_fields = [DelayedJob._meta.pk]
    ((sql, _params),) = compiler.as_sql()
    return sql


def _mark_saved(jobs: Sequence[DelayedJob], ids: Sequence[int], using: str) -> None:
    """What ``save()`` leaves on a job it inserted: its id and a state saying where it is."""
    for pk, job in zip(ids, jobs, strict=True):
        job.pk = pk
        job._state.adding = False
        job._state.db = using
