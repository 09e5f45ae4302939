"""Mount with ``path("delayjobs/api/", include("delayjobs.http.urls"))``."""

from __future__ import annotations

from django.urls import URLPattern, path

from delayjobs.http.openapi import routes
from delayjobs.http.views import Endpoint

app_name = "delayjobs_api"

urlpatterns: list[URLPattern] = [
    path(route, Endpoint(operations), name=operations[0].name)
    for route, operations in routes().items()
]
