"""Database helpers for the consumer's long-lived threads."""

from __future__ import annotations

from typing import Any, TypeVar

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model, QuerySet
from django.db.models.sql import UpdateQuery

M = TypeVar("M", bound=Model)


def drop_broken_connections() -> None:
    """Close this thread's connections that broke; keep healthy ones open.

    ``close_old_connections()`` also applies CONN_MAX_AGE, which is about requests: with
    its default of 0 it would reconnect before every claim and every outcome batch, the
    consumer's main cost. Its own threads keep their connection and drop it only after a
    database error left it unusable (the next query then reconnects).
    """
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        if connection.get_autocommit() != connection.settings_dict["AUTOCOMMIT"]:
            connection.close()
        elif connection.errors_occurred:
            if connection.is_usable():
                connection.errors_occurred = False
            else:
                connection.close()


def supports_update_returning(connection: BaseDatabaseWrapper) -> bool:
    # PostgreSQL, and SQLite from 3.35 (which added RETURNING to INSERT and UPDATE alike).
    return connection.vendor == "postgresql" or (
        connection.vendor == "sqlite" and connection.features.can_return_columns_from_insert
    )


def update_returning(queryset: QuerySet[M], **changes: Any) -> list[M] | None:
    """``queryset.update(**changes)`` that returns the updated rows, in one round trip.

    Returns None where the database has no ``UPDATE ... RETURNING``; the caller then
    updates and selects. Values go through Django's own compiler and converters.
    """
    connection = connections[queryset.db]
    if not supports_update_returning(connection):
        return None
    model = queryset.model
    query = queryset.query.chain(UpdateQuery)
    query.add_update_values(changes)
    compiler = query.get_compiler(queryset.db)
    sql, params = compiler.as_sql()
    if not sql:
        return []
    fields = model._meta.concrete_fields
    columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} RETURNING {columns}", params)
        rows: Any = cursor.fetchall()
    converters = compiler.get_converters([field.get_col(model._meta.db_table) for field in fields])
    if converters:
        rows = compiler.apply_converters(rows, converters)
    names = [field.attname for field in fields]
    return [model.from_db(queryset.db, names, list(row)) for row in rows]
