"""The one shape of every error the API answers, and the exception handlers that make it.

``{"error": "<code>", "detail": "<sentence>", "fields": {"<field path>": "<message>"}}``:
``error`` is for programs and stays; ``detail`` and the messages are for people and may be
reworded; ``fields`` maps each request field at fault to its message, by its path in the
request (``run_at``, ``jobs.3.run_at``, ``limit``), and is empty when no field is.
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import BadRequest, RequestDataTooBig, SuspiciousOperation
from django.db import OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse, RawPostDataException
from django.http.multipartparser import MultiPartParserError
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from delayjobs.exceptions import InvalidJob, InvalidTransition, JobNotFound, UnknownJobType

#: Every error code, and its status; what each means is in docs/reference/http-api.md.
ERRORS: dict[str, int] = {
    "malformed": 400,
    "not_authenticated": 401,
    "permission_denied": 403,
    "csrf_failed": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "duplicate_key": 409,
    "invalid_transition": 409,
    "too_large": 413,
    "unsupported_media_type": 415,
    "invalid": 422,
    "server_error": 500,
    "try_again": 503,
}
#: The challenge of every 401, as RFC 6750 asks.
CHALLENGE = 'Bearer realm="delayjobs"'
#: deadlock_detected and serialization_failure: the transaction was rolled back whole.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})

logger = logging.getLogger(__name__)


class ApiError(Exception):
    """The error ``response`` to send instead of the operation's result; nothing was changed."""

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        fields: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        body = {"error": code, "detail": detail, "fields": dict(fields or {}), **extra}
        self.response = JsonResponse(body, status=ERRORS[code], headers=headers)


def unauthenticated(detail: str) -> ApiError:
    return ApiError("not_authenticated", detail, headers={"WWW-Authenticate": CHALLENGE})


def field_path(loc: tuple[Any, ...]) -> str:
    """A field's path in the request, as ``fields`` names it: jobs.3.run_at."""
    return ".".join(str(part) for part in loc)


def _validation_error(request: HttpRequest, exc: ValidationError) -> ApiError:
    fields: dict[str, str] = {}
    for error in exc.errors:
        fields.setdefault(field_path(error["loc"]), error["msg"])
    whole = fields.pop("", None)  # the body itself (not an object, or missing)
    detail = whole or "; ".join(f"{path}: {message}" for path, message in fields.items())
    return ApiError("invalid", detail, fields=fields)


def _invalid_job(request: HttpRequest, exc: InvalidJob) -> ApiError:
    # The job type's own message lists the registered ones: never to a client.
    detail = f"Unknown job type {exc.name!r}." if isinstance(exc, UnknownJobType) else str(exc)
    loc = ("jobs", exc.index) if exc.index is not None else ()
    path = field_path((*loc, exc.field) if exc.field else loc)
    return ApiError("invalid", detail, fields={path: detail} if path else {})


def _http_error(request: HttpRequest, exc: HttpError) -> ApiError:
    if isinstance(exc.__cause__, ApiError):  # the parser's refusal, which ninja wraps
        return exc.__cause__
    if isinstance(exc, AuthenticationError):  # no credentials at all
        return unauthenticated("Send 'Authorization: Bearer <key>', or use a staff session.")
    return ApiError("malformed", str(exc))


def _database_error(request: HttpRequest, exc: OperationalError) -> ApiError:
    # Two requests locking the same keys in opposite orders (bulk, replace): PostgreSQL
    # rolls one back. Nothing of it was written, and sent again it will pass.
    if getattr(exc.__cause__, "sqlstate", None) not in RETRYABLE_SQLSTATES:
        return server_error(request, exc)
    return ApiError(
        "try_again",
        "The database rolled this request back to break a deadlock with a concurrent "
        "one; nothing was changed. Send it again.",
        headers={"Retry-After": "1"},
    )


def server_error(request: HttpRequest, exc: Exception) -> ApiError:
    """A JSON 500 for an error nobody foresaw, never Django's HTML page: the client gets an
    id to quote, the log has the same id with the traceback."""
    error_id = secrets.token_hex(6)
    logger.error("HTTP API error %s on %s %s", error_id, request.method, request.path, exc_info=exc)
    detail = f"An unexpected error ({error_id}): quote the id to the operators."
    return ApiError("server_error", detail, id=error_id)


#: What each exception answers: an ApiError, made from the request and the exception.
HANDLERS: dict[type[Exception], Any] = {
    ApiError: lambda request, exc: exc,
    ValidationError: _validation_error,
    InvalidJob: _invalid_job,
    InvalidTransition: lambda request, exc: ApiError("invalid_transition", str(exc)),
    JobNotFound: lambda request, exc: ApiError("not_found", str(exc)),
    HttpError: _http_error,
    RequestDataTooBig: lambda request, exc: ApiError("too_large", f"{exc}."),
    # The session's CSRF check read a multipart form body, and with it the stream.
    RawPostDataException: lambda request, exc: ApiError(
        "unsupported_media_type", "Send the body as application/json."
    ),
    # Django refusing to parse the query or a form (too many fields, a broken multipart).
    **dict.fromkeys(
        (SuspiciousOperation, BadRequest, MultiPartParserError),
        lambda request, exc: ApiError("malformed", f"Unreadable: {exc}"),
    ),
    OperationalError: _database_error,
    Exception: server_error,
}


def install(api: NinjaAPI) -> None:
    """Every exception an operation raises answers in the one shape."""
    for exc_class, make in HANDLERS.items():
        api.add_exception_handler(exc_class, functools.partial(_respond, make))


def _respond(make: Any, request: HttpRequest, exc: Exception) -> HttpResponse:
    return make(request, exc).response
