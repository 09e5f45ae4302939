"""Mount with ``path("delayjobs/api/", include("delayjobs.http.urls"))``.

Each route answers with and without its trailing slash (``jobs/17/`` and ``jobs/17``): a
client that leaves the slash out is served, not redirected by APPEND_SLASH (a redirected
POST would lose its body). Any other URL under the mount point is a JSON 404.
"""

from __future__ import annotations

from django.urls import URLPattern, path, re_path

from delayjobs.http.openapi import routes
from delayjobs.http.views import Endpoint, NotFound

app_name = "delayjobs_api"

ROUTES = routes()
ENDPOINTS = {route: Endpoint(operations) for route, operations in ROUTES.items()}

urlpatterns: list[URLPattern] = [
    path(route, ENDPOINTS[route], name=operations[0].name) for route, operations in ROUTES.items()
]
urlpatterns += [
    path(route.removesuffix("/"), endpoint)
    for route, endpoint in ENDPOINTS.items()
    if route.endswith("/")
]
# Last: whatever no route above matched, in the API's own error shape.
urlpatterns.append(re_path(r"^", NotFound(), name="not-found"))
