"""The one shape of every error the API returns, and the status code of each kind.

``{"error": "<code>", "detail": "<sentence>", "fields": {"<field>": "<message>"}}``:
``error`` is stable for programs, ``detail`` is for people, ``fields`` names the request
fields at fault (empty when none is).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.http import JsonResponse

#: Every error code, with its HTTP status and what it means (also the OpenAPI text).
ERRORS: dict[str, tuple[int, str]] = {
    "malformed": (400, "The body is not valid JSON."),
    "invalid": (400, "The request is well-formed JSON but describes no valid operation."),
    "not_authenticated": (401, "No valid API key or session came with the request."),
    "permission_denied": (403, "The user lacks the permission this operation needs."),
    "csrf_failed": (403, "A session request with an unsafe method failed the CSRF check."),
    "not_found": (404, "No such job (or no active job holds the key), or no such URL."),
    "method_not_allowed": (405, "This URL does not take this HTTP method."),
    "duplicate_key": (409, "An active job already holds the key."),
    "invalid_transition": (409, "The job's status does not allow this operation."),
    "too_large": (413, "The body is larger than the API accepts."),
    "unsupported_media_type": (415, "The body must be sent as application/json."),
    "server_error": (
        500,
        "An error nobody foresaw; the body's id is in the service's log, with the details.",
    ),
    "try_again": (
        503,
        "The database broke a deadlock with a concurrent request by rolling this one back; "
        "nothing was changed: send it again.",
    ),
}

#: The HTTP statuses errors use, for the OpenAPI document.
ERROR_STATUSES: tuple[int, ...] = tuple(sorted({status for status, _text in ERRORS.values()}))


class ApiError(Exception):
    """An error response to send instead of the operation's result; nothing was changed."""

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        fields: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        if code not in ERRORS:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.fields = dict(fields or {})
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    @property
    def status(self) -> int:
        return ERRORS[self.code][0]

    def response(self) -> JsonResponse:
        body = {"error": self.code, "detail": self.detail, "fields": self.fields, **self.extra}
        response = JsonResponse(body, status=self.status)
        for name, value in self.headers.items():
            response[name] = value
        return response
