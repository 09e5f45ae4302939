"""Counts that do not read the whole job table: the planner's estimate on PostgreSQL when a
list is large, an exact ``COUNT(*)`` when it is small or the database is another one.

A ``COUNT(*)`` reads every row it counts: on a table of ten million finished jobs that is
seconds, on every page load of the admin. Past ``ADMIN_ESTIMATE_ABOVE`` rows (the planner's own
estimate, from ``EXPLAIN``: a millisecond; a ``DELAYJOBS`` setting, 10,000 by default) the
admin shows that estimate instead; below it the exact count is cheap and shown (0: always
exact).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cached_property
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.core.paginator import Page, Paginator
from django.db import connections
from django.db.models import Count, Model, QuerySet

from delayjobs.conf import settings

#: Rows a dashboard sample reads, about (TABLESAMPLE SYSTEM picks whole pages).
SAMPLE_ROWS = 10_000
#: The sample's seed: the same pages each time, so they stay cached and the figures do
#: not jitter between two refreshes of an idle table.
SAMPLE_SEED = 18


def estimate_above() -> int:
    """The threshold: ``DELAYJOBS["ADMIN_ESTIMATE_ABOVE"]`` (checked: delayjobs.E018)."""
    return int(settings.ADMIN_ESTIMATE_ABOVE)


def can_estimate(queryset: QuerySet[Any]) -> bool:
    return connections[queryset.db].vendor == "postgresql"


def planned_rows(queryset: QuerySet[Any]) -> int:
    """The rows the planner expects ``queryset`` (unordered, unsliced) to return."""
    query = queryset.order_by().values("pk").query
    try:
        sql, params = query.sql_with_params()
    except EmptyResultSet:  # a condition that matches nothing (pk__in=[])
        return 0
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):  # psycopg 2 hands json as text
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def count(queryset: QuerySet[Any], threshold: int | None = None) -> tuple[int, bool]:
    """``(rows, estimated)``: the planner's estimate if above ``threshold`` on PostgreSQL,
    else the exact count."""
    limit = estimate_above() if threshold is None else threshold
    if limit > 0 and can_estimate(queryset):
        planned = planned_rows(queryset)
        if planned > limit:
            return planned, True
    return queryset.count(), False


class EstimatedCountPaginator(Paginator):
    """A paginator whose ``count`` is the planner's estimate for a large list (see the
    module). An estimate may be a little off: the last page can hold fewer rows than the
    page size says, or none (the admin then shows the list's first page)."""

    #: Set by the ModelAdmin (``get_paginator``); None: ``estimate_above()``.
    threshold: int | None = None
    #: Whether ``count`` is an estimate (known once it has been read).
    estimated = False

    def _get_page(self, object_list: Any, number: int, paginator: Paginator) -> Page:
        """The page's rows in two queries: their ids first, then those rows.

        The ids alone come from an index-only scan of the index that matches the list's
        filter and order; the rows in one query, with the admin's joins. Read in one
        query, the planner may walk another index and filter the rows one by one (the
        newest succeeded jobs below a million scheduled ones).
        """
        if isinstance(object_list, QuerySet) and isinstance(self.object_list, QuerySet):
            ids = list(object_list.values_list("pk", flat=True))
            object_list = self.object_list.filter(pk__in=ids)
        return super()._get_page(object_list, number, paginator)  # type: ignore[misc]

    @cached_property
    def count(self) -> int:
        if not isinstance(self.object_list, QuerySet):
            return len(self.object_list)
        rows, self.estimated = count(self.object_list, self.threshold)
        return rows


def table_rows(model: type[Model], using: str) -> int:
    """The planner's row count of the whole table (``pg_class.reltuples``); -1 if never
    analysed."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
            [model._meta.db_table],
        )
        row = cursor.fetchone()
    return -1 if row is None else int(row[0])


def sampled_counts(
    jobs: QuerySet[Any], fields: tuple[str, str], total: int
) -> dict[tuple[str, str], int]:
    """Counts by ``fields`` scaled from a TABLESAMPLE of about SAMPLE_ROWS rows of a table
    of ``total`` rows: a page-level sample, cheap whatever the table's size."""
    table = connections[jobs.db].ops.quote_name(jobs.model._meta.db_table)
    percent = min(100.0, SAMPLE_ROWS * 100.0 / max(total, 1))
    first, second = (connections[jobs.db].ops.quote_name(name) for name in fields)
    with connections[jobs.db].cursor() as cursor:
        cursor.execute(
            f"SELECT {first}, {second}, COUNT(*) FROM {table} "
            f"TABLESAMPLE SYSTEM (%s) REPEATABLE (%s) GROUP BY 1, 2",
            [percent, SAMPLE_SEED],
        )
        rows = cursor.fetchall()
    seen = sum(n for _a, _b, n in rows)
    scale = total / seen if seen else 0.0
    return {(a, b): round(n * scale) for a, b, n in rows}


def exact_counts(
    jobs: QuerySet[Any], fields: tuple[str, str], where: dict[str, Iterable[str]]
) -> dict[tuple[str, str], int]:
    rows = jobs.filter(**where).order_by().values(*fields).annotate(n=Count("pk"))
    return {(row[fields[0]], row[fields[1]]): row["n"] for row in rows}
