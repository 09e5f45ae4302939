"""Admin lists that refuse a NUL character in their query, as a bad lookup; a list filter
of a column's values that does not read the whole table (``DistinctValuesFilter``).

PostgreSQL cannot compare text holding NUL (``\\x00``): a search or a filter with one is a
DataError, and the admin would answer a server error. No value stored by delayjobs holds
one (the API refuses them), so such a query can match nothing: it is treated as Django's
admin treats any lookup it cannot apply, a redirect to the list with ``?e=1``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.db import connections, router
from django.db.models import QuerySet
from django.http import HttpRequest


class NulRefusingChangeList(ChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        if any("\x00" in name or "\x00" in value for name, value in _query_items(request)):
            raise IncorrectLookupParameters("A NUL character in the query.")
        return super().get_queryset(request, exclude_parameters)


def _query_items(request: HttpRequest) -> list[tuple[str, str]]:
    return [(name, value) for name, values in request.GET.lists() for value in values]


class RefusesNulInLists:
    """For a ModelAdmin: its list refuses NUL characters in the query (see the module)."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return NulRefusingChangeList


class DistinctValuesFilter(admin.AllValuesFieldListFilter):
    """Django's "all values" filter, its values read by a loose index scan: one index probe
    per distinct value (``MIN(x) WHERE x > previous``) instead of a ``SELECT DISTINCT``
    that reads the whole table. For an indexed column with few values (job type, queue).
    The values are the table's, whatever the admin's queryset filters."""

    def __init__(
        self,
        field: Any,
        request: HttpRequest,
        params: Any,
        model: Any,
        model_admin: Any,
        field_path: str,
    ) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        self.lookup_choices = distinct_values(model, field.column)  # type: ignore[assignment]


def distinct_values(model: Any, column: str) -> list[Any]:
    """The distinct non-NULL values of an indexed ``column``, in order (a recursive CTE:
    PostgreSQL and SQLite plan each step as one index lookup)."""
    connection = connections[router.db_for_write(model)]  # as the jobs manager reads
    table = connection.ops.quote_name(model._meta.db_table)
    name = connection.ops.quote_name(column)
    sql = (
        f"WITH RECURSIVE found(v) AS (SELECT MIN({name}) FROM {table} "
        f"UNION ALL SELECT (SELECT MIN({name}) FROM {table} WHERE {name} > found.v) "
        f"FROM found WHERE found.v IS NOT NULL) "
        f"SELECT v FROM found WHERE v IS NOT NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return [row[0] for row in cursor.fetchall()]
