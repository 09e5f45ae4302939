"""Admin lists that refuse a NUL character in their query, as a bad lookup.

PostgreSQL cannot compare text holding NUL (``\\x00``): a search or a filter with one is a
DataError, and the admin would answer a server error. No value stored by delayjobs holds
one (the API refuses them), so such a query can match nothing: it is treated as Django's
admin treats any lookup it cannot apply, a redirect to the list with ``?e=1``.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
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
