"""Database helpers for the consumer's long-lived threads."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar, cast

from django.db import close_old_connections as django_close_old_connections
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.db.models import Field, Model, QuerySet
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from django.db.models.sql import Query, UpdateQuery

if TYPE_CHECKING:
    from django.utils.functional import _StrOrPromise

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


#: Set in a thread once it opened a database connection (``connection_created`` is sent
#: in the thread that connects; the app's ready() imports this module, before any).
_connected = threading.local()


def _note_connection(**kwargs: Any) -> None:
    _connected.once = True


connection_created.connect(_note_connection, dispatch_uid="delayjobs.core.db.connected")


def close_old_connections() -> None:
    """Django's ``close_old_connections()``, skipped in a thread that never connected.

    It only ever closes a connection that was opened, and it is called twice per job (the
    job's queries get request semantics); asking each alias whether this thread has a
    connection goes through asgiref's ``Local`` (two exceptions raised and caught per
    alias), about 4 us a call, a few percent of a job in a thread whose jobs never touch
    the database.
    """
    if getattr(_connected, "once", False):
        django_close_old_connections()


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
    query = cast(UpdateQuery, queryset.query.chain(UpdateQuery))
    query.add_update_values(changes)
    sql, params = query.get_compiler(queryset.db).as_sql()
    if not sql:
        return []
    return fetch_models(queryset.model, queryset.db, f"{sql} RETURNING {{columns}}", params)


def fetch_models(
    model: type[M],
    using: str,
    sql: str,
    params: Sequence[Any],
    *,
    qualified: bool = False,
    bind_on_server: bool = False,
) -> list[M]:
    """Run ``sql`` (a statement returning rows) and build ``model`` instances from them.

    ``{columns}`` in ``sql`` is replaced by ``model_columns(model, using, qualified)``;
    values go through the fields' converters, as in any query. ``bind_on_server``: send
    the parameters apart from the statement, where the driver can (psycopg 3), rather than
    quoting them into its text in Python.
    """
    connection = connections[using]
    fields = model._meta.concrete_fields
    fast = on_psycopg3_postgresql(connection)
    cursor = server_bound_cursor(connection) if fast and bind_on_server else connection.cursor()
    with cursor:
        if fast:
            _load_utc_timestamps_fast(cursor.cursor)
        cursor.execute(sql.replace("{columns}", model_columns(model, using, qualified)), params)
        rows: Any = cursor.fetchall()
    compiler = connection.ops.compiler("SQLCompiler")(Query(model), connection, using)
    converters = compiler.get_converters([field.get_col(model._meta.db_table) for field in fields])
    if converters:
        rows = compiler.apply_converters(rows, converters)
    names = [field.attname for field in fields]
    if not _plain_init(model):
        return [model.from_db(using, names, list(row)) for row in rows]
    instances = []
    for row in rows:
        # What from_db() and Model.__init__ would do with every field given: each value
        # set under its attname (no descriptor of a concrete field does more on a fresh
        # instance), a state saying where it came from, and no signal (none listens).
        instance = model.__new__(model)
        instance.__dict__.update(zip(names, row, strict=True))
        state = ModelState()
        state.adding = False
        state.db = using
        instance._state = state
        instances.append(instance)
    return instances


def model_columns(model: type[Model], using: str, qualified: bool = False) -> str:
    """The model's columns in field order, quoted for ``using`` (prefixed with its table
    if ``qualified``): what a statement returns for ``fetch_models``."""
    return _model_columns(model, using, connections[using].vendor, qualified)


@cache
def _model_columns(model: type[Model], using: str, vendor: str, qualified: bool) -> str:
    quote = connections[using].ops.quote_name
    prefix = f"{quote(model._meta.db_table)}." if qualified else ""
    return ", ".join(prefix + quote(field.column) for field in model._meta.concrete_fields)


def _plain_init(model: type[Model]) -> bool:
    """Whether building ``model`` from a row is only setting its fields: neither it nor
    a receiver of ``pre_init``/``post_init`` adds anything."""
    return (
        model.__init__ is Model.__init__
        and model.from_db.__func__ is Model.from_db.__func__  # type: ignore[attr-defined]
        and not pre_init.has_listeners(model)
        and not post_init.has_listeners(model)
    )


def is_psycopg3() -> bool:
    """Whether Django's PostgreSQL backend runs on psycopg 3 (else psycopg2, which Django
    5.2 still supports and delayjobs too, without psycopg 3's fast paths)."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return is_psycopg3


def on_psycopg3_postgresql(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` is PostgreSQL through psycopg 3, where the fast paths apply."""
    return connection.vendor == "postgresql" and is_psycopg3()


def server_bound_cursor(connection: Any) -> Any:
    """Django's cursor wrapper (query logging, execute wrappers, error translation) around
    Django's own psycopg cursor that binds parameters on the server.

    Django's own cursors bind on the client unless ``OPTIONS["server_side_binding"]``: psycopg
    then quotes every value into the statement's text in Python, a fifth of what is left of a
    ``schedule()`` call. Everything else is ``connection.cursor()``'s own steps (health
    check, connecting, thread check, wrapping), and Django's connection settings still
    apply (no automatic prepared statements: ``prepare_threshold`` is None, safe behind
    PgBouncer).
    """
    # Django 4.2+ (psycopg 3); django-stubs does not list it.
    from django.db.backends.postgresql.base import ServerBindingCursor  # type: ignore[attr-defined]

    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        return connection._prepare_cursor(ServerBindingCursor(connection.connection))


def _load_utc_timestamps_fast(cursor: Any) -> None:
    """Have ``cursor`` (psycopg's own) read UTC ``timestamptz`` values in C.

    Django's loader parses each one in Python (psycopg's pure-Python parser, then
    ``replace(tzinfo=...)``): a fifth of a consumer's CPU time in a backlog, as a claimed
    row holds several. With the session in UTC and Django's timezone UTC (its default),
    ``datetime.fromisoformat`` gives the very same value; anything else (another offset or
    timezone, BC, infinity) is left to Django's loader.
    """
    from psycopg.postgres import types
    from psycopg.pq import Format

    oid = types["timestamptz"].oid
    base = cursor.adapters.get_loader(oid, Format.TEXT)
    if base is not None and getattr(base, "timezone", None) is UTC:
        cursor.adapters.register_loader(oid, _fast_utc_loader(base))


@cache
def _fast_utc_loader(base: type) -> type:
    class FastUtcLoader(base):
        def load(self, data: Any) -> datetime:
            text = bytes(data)
            if text.endswith(b"+00"):
                try:
                    return datetime.fromisoformat(text.decode())
                except ValueError:
                    pass
            return super().load(data)

    return FastUtcLoader


def int_array(values: Iterable[int]) -> str:
    """A PostgreSQL array literal of integers, for one ``%s::bigint[]`` parameter.

    Sent as one text value that the server parses: psycopg would adapt a Python list in
    Python, element by element, several times slower (about 2 us an element).
    """
    return "{" + ",".join(map(str, map(int, values))) + "}"


def timestamp_array(values: Iterable[datetime | None]) -> str:
    """A PostgreSQL array literal of timestamps (None is NULL), for ``%s::timestamptz[]``.

    ISO text needs no quoting in an array: digits, ``-``, ``:``, ``.``, ``+`` and ``T``.
    """
    return "{" + ",".join("NULL" if v is None else v.isoformat() for v in values) + "}"


def float_array(values: Iterable[float | None]) -> str:
    """A PostgreSQL array literal of double precision numbers (None is NULL), for
    ``%s::float8[]``."""
    return "{" + ",".join("NULL" if v is None else repr(float(v)) for v in values) + "}"


def text_array(values: Iterable[str | None]) -> str:
    """A PostgreSQL array literal of text (None is NULL), for ``%s::text[]``: every
    element quoted, its backslashes and double quotes escaped, anything else kept."""
    return "{" + ",".join("NULL" if v is None else _quoted(v) for v in values) + "}"


def _quoted(text: str) -> str:
    if "\\" in text or '"' in text:
        text = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def concrete_field(model: type[Model], name: str) -> Field[Any, Any]:
    """A model's concrete field by name (not a relation's reverse side, nor a generic key)."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field), f"{model.__name__}.{name} is not a concrete field"
    return field


def column(model: type[Model], name: str) -> str:
    """The database column of a field, for hand-written SQL."""
    return concrete_field(model, name).column


def attname(model: type[Model], name: str) -> str:
    """The attribute a field's value is stored under ("room_id" for "room")."""
    return concrete_field(model, name).attname


def verbose_name(model: type[Model], name: str) -> _StrOrPromise:
    """A field's verbose name, for headings: lazy, translated when shown."""
    return concrete_field(model, name).verbose_name


def max_length(model: type[Model], name: str) -> int:
    """A text field's max_length, to refuse longer input before it reaches the database."""
    length = concrete_field(model, name).max_length
    assert length is not None, f"{model.__name__}.{name} has no max_length"
    return length
