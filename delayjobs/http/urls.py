"""The API's URLs (mounted as ``delayjobs.http`` says): ninja's, with what ninja leaves to
the project: a 405 in the API's JSON shape (OPTIONS: 204 with Allow, unauthenticated), no
caching (a job's state changes by the millisecond and depends on who asks), and a JSON 404
for any other path under the mount point, never APPEND_SLASH's redirect (which would turn
a POST into a bodiless GET).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.urls import URLPattern, path, re_path
from django.utils.cache import add_never_cache_headers

from delayjobs.http.app import api
from delayjobs.http.errors import ApiError
from delayjobs.http.views import NS

app_name = NS


def served(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @functools.wraps(view)
    def serve(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        if isinstance(response, HttpResponseNotAllowed):  # ninja's, in text
            allow = ", ".join(sorted({*response["Allow"].split(", "), "OPTIONS"}))
            if request.method == "OPTIONS":
                response = HttpResponse(status=204, headers={"Allow": allow})
            else:
                detail = f"{request.method} is not allowed here; use {allow}."
                response = ApiError("method_not_allowed", detail, headers={"Allow": allow}).response
        add_never_cache_headers(response)
        return response

    # Authentication is the API's own: no CSRF page, no redirect to a login page.
    serve.csrf_exempt = True  # type: ignore[attr-defined]
    serve.login_required = False  # type: ignore[attr-defined]
    return serve


@served
def not_found(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    return ApiError("not_found", f"No such URL: {request.path}.").response


# Before ninja's root view, which answers Django's HTML 404.
urlpatterns: list[URLPattern] = [path("", not_found)]
for url in api.urls[0]:
    assert isinstance(url, URLPattern) and url.callback is not None
    urlpatterns.append(URLPattern(url.pattern, served(url.callback), url.default_args, url.name))
urlpatterns.append(re_path(r"", not_found, name="not-found"))
