"""One view per route: method, authentication, permission, body and query, then the
operation's handler, in that order; every refusal is a JSON error and changes nothing."""

from __future__ import annotations

import json
import logging
import math
import re
import secrets
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import BadRequest, RequestDataTooBig, SuspiciousOperation
from django.db import OperationalError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, RawPostDataException
from django.http.multipartparser import MultiPartParserError
from django.urls import reverse
from django.utils.cache import add_never_cache_headers

from delayjobs.api import SPEC_FIELDS, nesting_depth
from delayjobs.conf import settings as conf
from delayjobs.exceptions import (
    DelayJobsError,
    DuplicateJob,
    InvalidJob,
    InvalidTransition,
    JobNotFound,
    UnknownJobType,
)
from delayjobs.http import app
from delayjobs.http.auth import authenticate
from delayjobs.http.errors import ApiError
from delayjobs.http.fields import parse_query
from delayjobs.http.handlers import BULK_SCHEDULE, SCHEDULE, Call, Reply, key_taken
from delayjobs.http.openapi import OPERATIONS, Operation, describe_permissions
from delayjobs.models import jobs_database

JSON_CONTENT_TYPE = "application/json"
#: "specs[3]: ..." in schedule_many()'s messages is "jobs[3]" in the bulk request.
SPEC_INDEX = re.compile(r"^specs\[(\d+)\]: ")
#: deadlock_detected and serialization_failure: the transaction was rolled back whole.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})
#: The argument an InvalidJob message is about: its first word ("key must be ...").
FIRST_WORD = re.compile(r"^(?:The )?(\w+)")


class Endpoint:
    """The view of one route, dispatching to its operations by HTTP method.

    HEAD is answered as GET (the server drops the body), as Django's own views do; OPTIONS
    answers 204 with the Allow header, without authentication (the OpenAPI document,
    public too, says the same).
    """

    #: Django's CSRF middleware leaves these requests alone: authentication checks CSRF
    #: itself, for session requests only (API keys are not sent by browsers on their own).
    csrf_exempt = True
    #: Django's LoginRequiredMiddleware leaves them alone too: a key request has no
    #: session, and authentication answers 401 in JSON, not a redirect to a login page.
    login_required = False

    def __init__(self, operations: Sequence[Operation]) -> None:
        self.operations = {operation.method: operation for operation in operations}
        methods = list(self.operations)
        if "GET" in methods:
            methods.append("HEAD")
        self.allowed = ", ".join([*methods, "OPTIONS"])

    def __call__(self, request: HttpRequest, **path: Any) -> HttpResponse:
        try:
            response = self._respond(request, path)
        except ApiError as exc:
            response = exc.response()
        except RequestDataTooBig:  # while the CSRF check parsed a form body
            response = ApiError("too_large", "The body is over Django's size limits.").response()
        except (SuspiciousOperation, BadRequest, MultiPartParserError) as exc:
            # Django refusing to parse the query or a form body (too many fields, a broken
            # multipart body): a JSON 400 too, never Django's HTML page.
            response = ApiError("invalid", f"The request could not be read: {exc}").response()
        except Exception:
            response = server_error(request)
        # Job state changes by the millisecond and depends on who asks: never cache it.
        add_never_cache_headers(response)
        return response

    def _respond(self, request: HttpRequest, path: dict[str, Any]) -> HttpResponse:
        method = request.method or ""
        if method == "OPTIONS":
            return HttpResponse(status=204, headers={"Allow": self.allowed})
        operation = self.operations.get("GET" if method == "HEAD" else method)
        if operation is None:
            raise ApiError(
                "method_not_allowed",
                f"{method} is not allowed here; use {self.allowed}.",
                headers={"Allow": self.allowed},
            )
        user = api_key = None
        needed = operation.permissions()
        if needed:
            identity = authenticate(request)
            user, api_key = identity.user, identity.api_key
            if not user.has_perms(needed):
                raise ApiError(
                    "permission_denied",
                    f"This operation needs {describe_permissions(needed)}.",
                )
        # The body is read here, before ninja: its limits and its JSON are the API's own.
        json_value = read_body(request, operation)

        def respond(body: dict[str, Any]) -> HttpResponse:
            # Called by the ninja operation, with the body its pydantic model validated.
            query = parse_query(request.GET, operation.query)
            call = Call(request, user, path=path, body=body, query=query, api_key=api_key)
            reply = run(operation, call)
            response = JsonResponse(reply.data, status=reply.status, safe=False)
            for name, value in reply.headers.items():
                response[name] = value
            return response

        return app.run(NINJA, request, path, app.Handover(operation, json_value, respond))


logger = logging.getLogger(__name__)

#: Levels a request body adds around a payload: {"jobs": [{"payload": ...}]}.
BODY_ENVELOPE_DEPTH = 3


def server_error(request: HttpRequest) -> HttpResponse:
    """A JSON 500 for an error nobody foresaw, never Django's HTML page: the client gets an
    id to quote, the log has the same id with the traceback."""
    error_id = secrets.token_hex(6)
    logger.exception("HTTP API error %s on %s %s", error_id, request.method, request.path)
    return ApiError(
        "server_error",
        f"An unexpected error ({error_id}); nothing more is known here. Quote the id to the "
        f"service's operators: their log has it.",
        extra={"id": error_id},
    ).response()


class NotFound:
    """Every other URL under the mount point: a JSON 404, not Django's HTML page (and no
    APPEND_SLASH redirect, which would turn a POST into a GET without its body)."""

    csrf_exempt = True
    login_required = False

    def __call__(self, request: HttpRequest, **path: Any) -> HttpResponse:
        response = ApiError(
            "not_found",
            f"No such URL: {request.path}. The API's paths are in its openapi.json.",
        ).response()
        add_never_cache_headers(response)
        return response


def run(operation: Operation, call: Call) -> Reply:
    """The handler's reply; a refusal of the API becomes an ApiError, after a rollback."""
    try:
        if not operation.writes:
            return operation.handler(call)
        # One transaction: an operation refused half-way leaves nothing behind.
        with transaction.atomic(using=jobs_database()):
            return operation.handler(call)
    except OperationalError as exc:
        # Two requests locking the same keys in opposite orders (bulk, replace): PostgreSQL
        # rolls one back. Nothing of it was written, and sent again it will pass.
        if getattr(exc.__cause__, "sqlstate", None) not in RETRYABLE_SQLSTATES:
            raise
        raise ApiError(
            "try_again",
            "A concurrent request held the same jobs and the database rolled this one "
            "back to break the deadlock; nothing was changed. Send it again.",
            headers={"Retry-After": "1"},
        ) from exc
    except DelayJobsError as exc:
        scheduling = operation.body in (SCHEDULE, BULK_SCHEDULE)
        raise api_error(exc, can_view=call.can_view, scheduling=scheduling) from exc


def api_error(exc: DelayJobsError, *, can_view: bool = False, scheduling: bool = False) -> ApiError:
    """The response to an exception of ``delayjobs.api``. The job holding a key is named
    only to callers who may view jobs."""
    detail = SPEC_INDEX.sub(r"jobs[\1]: ", str(exc))
    if isinstance(exc, UnknownJobType):
        # The API's own message: never the list of registered job types.
        index = SPEC_INDEX.match(str(exc))
        detail = f"{f'jobs[{index[1]}]: ' if index else ''}Unknown job type {exc.name!r}."
        return ApiError("invalid", detail, fields={_field_path(exc, "job_type"): detail})
    if isinstance(exc, InvalidJob):
        word = FIRST_WORD.match(SPEC_INDEX.sub("", str(exc)))
        name = word[1].lower() if word else ""
        fields = {_field_path(exc, name): detail} if name in SPEC_FIELDS else {}
        return ApiError("invalid", detail, fields=fields)
    if isinstance(exc, DuplicateJob):
        # Scheduling: the caller's new job wants the key. Otherwise a retry: the job
        # being retried needs its key back, which another job took since.
        reason = (
            "cancel it first, or send replace: true to move it."
            if scheduling
            else "this job can run again once that one has ended (or is cancelled)."
        )
        return key_taken(
            exc.key,
            exc.existing_id,
            field=_field_path(exc, "key"),
            reason=reason,
            can_view=can_view,
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


def read_body(request: HttpRequest, operation: Operation) -> Any:
    """The operation's body as a JSON value, for its pydantic model to validate; None for
    an operation without one, or an empty body where the body is optional."""
    if operation.body is None:
        return None
    raw = _raw_body(request, operation)
    if not raw:
        if not operation.body_required:
            return None
        raise ApiError("malformed", "The body is empty: send a JSON object.")
    _require_json(request)
    value = decode_json(raw)
    if value is None:  # ninja takes a null body for none at all: cancel would pass
        raise app.not_an_object(operation.body, value)
    return value


def _raw_body(request: HttpRequest, operation: Operation) -> bytes:
    limit, setting = operation.body_limit()
    source = f" (Django's {setting})" if setting else ""
    too_large = ApiError("too_large", f"The body is over the limit of {limit} bytes{source}.")
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
    except RawPostDataException:
        # The session's CSRF check parsed a multipart form body, and with it the stream.
        _require_json(request)
        raise
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


class _NumberOutOfRange(ValueError):
    pass


def _finite_float(text: str) -> float:
    # 1e400 is valid JSON, but no double holds it: Python would read it as infinity.
    value = float(text)
    if not math.isfinite(value):
        raise _NumberOutOfRange(text)
    return value


def decode_json(raw: bytes) -> Any:
    """The JSON value of ``raw``; ApiError("malformed") for anything that is not JSON."""
    try:
        value = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_refuse_duplicates,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
        )
        limit = conf.MAX_PAYLOAD_DEPTH + BODY_ENVELOPE_DEPTH
        if nesting_depth(value, limit) <= limit:
            return value
        detail = (
            f"The body nests lists and objects more than {limit} levels deep (a payload "
            f"may nest {conf.MAX_PAYLOAD_DEPTH}: DELAYJOBS['MAX_PAYLOAD_DEPTH'])."
        )
    except UnicodeDecodeError:
        detail = "The body is not UTF-8 text."
    except json.JSONDecodeError as exc:
        detail = f"The body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
    except _DuplicateName as exc:
        detail = f"The body has the field {exc.args[0]!r} twice."
    except _NumberOutOfRange as exc:
        detail = (
            f"The body holds the number {exc.args[0][:40]}, too large for this API: numbers "
            f"must be within about ±1.8e308 (a 64-bit float)."
        )
    except RecursionError:
        detail = "The body is nested too deeply."
    except ValueError as exc:  # NaN, Infinity, numbers of thousands of digits
        detail = f"The body is not valid JSON: {exc}."
    raise ApiError("malformed", detail)


#: Each operation on django-ninja, by operationId.
NINJA = app.build(OPERATIONS)


def api_docs(request: HttpRequest) -> HttpResponse:
    """Swagger UI, django-ninja's, on the API's own document (``delayjobs_api:openapi``).
    Mount it where the project likes, outside the API's own URLs (any other path under the
    mount point is a JSON 404): ``path("delayjobs/api-docs/", api_docs)``. The page is as
    public as the document; trying an operation out needs a key or a staff session."""
    return app.docs_page(request, reverse("delayjobs_api:openapi"), NINJA)
