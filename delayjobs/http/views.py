"""One view per route: method, authentication, permission, body and query, then the
operation's handler, in that order; every refusal is a JSON error and changes nothing."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.cache import add_never_cache_headers

from delayjobs.api import SPEC_FIELDS
from delayjobs.exceptions import (
    DelayJobsError,
    DuplicateJob,
    InvalidJob,
    InvalidTransition,
    JobNotFound,
    UnknownJobType,
)
from delayjobs.http.auth import authenticate
from delayjobs.http.errors import ApiError
from delayjobs.http.fields import FieldError, parse_query
from delayjobs.http.handlers import Call, Reply
from delayjobs.http.openapi import Operation
from delayjobs.models import jobs_database

JSON_CONTENT_TYPE = "application/json"
#: "specs[3]: ..." in schedule_many()'s messages is "jobs[3]" in the bulk request.
SPEC_INDEX = re.compile(r"^specs\[(\d+)\]: ")
#: The argument an InvalidJob message is about: its first word ("key must be ...").
FIRST_WORD = re.compile(r"^(?:The )?(\w+)")


class Endpoint:
    """The view of one route, dispatching to its operations by HTTP method."""

    #: Django's CSRF middleware leaves these requests alone: authentication checks CSRF
    #: itself, for session requests only (API keys are not sent by browsers on their own).
    csrf_exempt = True

    def __init__(self, operations: Sequence[Operation]) -> None:
        self.operations = {operation.method: operation for operation in operations}

    def __call__(self, request: HttpRequest, **path: Any) -> HttpResponse:
        try:
            response = self._respond(request, path)
        except ApiError as exc:
            response = exc.response()
        # Job state changes by the millisecond and depends on who asks: never cache it.
        add_never_cache_headers(response)
        return response

    def _respond(self, request: HttpRequest, path: dict[str, Any]) -> HttpResponse:
        operation = self.operations.get(request.method or "")
        if operation is None:
            allowed = ", ".join(self.operations)
            raise ApiError(
                "method_not_allowed",
                f"{request.method} is not allowed here; use {allowed}.",
                headers={"Allow": allowed},
            )
        user = None
        if operation.permission is not None:
            user = authenticate(request).user
            if not user.has_perm(operation.permission):
                raise ApiError(
                    "permission_denied",
                    f"This operation needs the permission {operation.permission}.",
                )
        call = Call(
            request,
            user,
            path=path,
            body=read_body(request, operation),
            query=parse_query(request.GET, operation.query),
        )
        reply = run(operation, call)
        response = JsonResponse(reply.data, status=reply.status, safe=False)
        for name, value in reply.headers.items():
            response[name] = value
        return response


def run(operation: Operation, call: Call) -> Reply:
    """The handler's reply; a refusal of the API becomes an ApiError, after a rollback."""
    try:
        if not operation.writes:
            return operation.handler(call)
        # One transaction: an operation refused half-way leaves nothing behind.
        with transaction.atomic(using=jobs_database()):
            return operation.handler(call)
    except DelayJobsError as exc:
        raise api_error(exc) from exc


def api_error(exc: DelayJobsError) -> ApiError:
    """The response to an exception of ``delayjobs.api``."""
    detail = SPEC_INDEX.sub(r"jobs[\1]: ", str(exc))
    if isinstance(exc, UnknownJobType):
        return ApiError("invalid", detail, fields={_field_path(exc, "job_type"): detail})
    if isinstance(exc, InvalidJob):
        word = FIRST_WORD.match(SPEC_INDEX.sub("", str(exc)))
        name = word[1].lower() if word else ""
        fields = {_field_path(exc, name): detail} if name in SPEC_FIELDS else {}
        return ApiError("invalid", detail, fields=fields)
    if isinstance(exc, DuplicateJob):
        return ApiError(
            "duplicate_key",
            detail,
            fields={_field_path(exc, "key"): detail},
            extra={"existing_id": exc.existing_id},
        )
    if isinstance(exc, InvalidTransition):
        return ApiError("invalid_transition", detail)
    if isinstance(exc, JobNotFound):
        return ApiError("not_found", detail)
    raise exc  # a new kind of refusal must be mapped here, not guessed


def _field_path(exc: Exception, name: str) -> str:
    index = SPEC_INDEX.match(str(exc))
    return f"jobs[{index[1]}].{name}" if index else name


# Bodies ---------------------------------------------------------------------------------


def read_body(request: HttpRequest, operation: Operation) -> dict[str, Any]:
    """The operation's body, parsed and converted; {} for an operation without one."""
    if operation.body is None:
        return {}
    raw = _raw_body(request, operation.max_body_bytes)
    if not raw:
        if not operation.body_required:
            return {}
        raise ApiError("malformed", "The body is empty: send a JSON object.")
    _require_json(request)
    try:
        return operation.body.parse(decode_json(raw))
    except FieldError as exc:
        raise ApiError("invalid", _describe(exc), fields=exc.errors) from None


def _raw_body(request: HttpRequest, limit: int) -> bytes:
    too_large = ApiError("too_large", f"The body is over the limit of {limit} bytes.")
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:  # refused before reading a byte of it
        raise too_large
    try:
        raw = request.body
    except RequestDataTooBig:  # over DATA_UPLOAD_MAX_MEMORY_SIZE, Django's own limit
        raise too_large from None
    if len(raw) > limit:
        raise too_large
    return raw


def _require_json(request: HttpRequest) -> None:
    content_type = (request.content_type or "").lower()
    charset = (request.content_params or {}).get("charset", "utf-8").lower()
    if content_type != JSON_CONTENT_TYPE or charset not in ("utf-8", "utf8"):
        given = request.META.get("CONTENT_TYPE") or "none"
        raise ApiError(
            "unsupported_media_type",
            f"Send the body as {JSON_CONTENT_TYPE} (UTF-8); the Content-Type was {given}.",
        )


class _DuplicateName(ValueError):
    pass


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Which of two values a parser keeps differs between JSON libraries: refuse both.
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise _DuplicateName(name)
        result[name] = value
    return result


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_json(raw: bytes) -> Any:
    """The JSON value of ``raw``; ApiError("malformed") for anything that is not JSON."""
    try:
        return json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_refuse_duplicates,
            parse_constant=_refuse_constant,
        )
    except UnicodeDecodeError:
        detail = "The body is not UTF-8 text."
    except json.JSONDecodeError as exc:
        detail = f"The body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
    except _DuplicateName as exc:
        detail = f"The body has the field {exc.args[0]!r} twice."
    except RecursionError:
        detail = "The body is nested too deeply."
    except ValueError as exc:  # NaN, Infinity, numbers of thousands of digits
        detail = f"The body is not valid JSON: {exc}."
    raise ApiError("malformed", detail)


def _describe(exc: FieldError) -> str:
    """The error's sentence, with the first field at fault, for clients that show one line."""
    if not exc.errors:
        return str(exc)
    name, message = next(iter(exc.errors.items()))
    more = len(exc.errors) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''}, see fields)" if more else ""
    return f"{exc} {name}: {message}{suffix}"
