"""One view per route: method, authentication, permission, body and query, then the
operation's handler, in that order; every refusal is a JSON error and changes nothing."""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import BadRequest, RequestDataTooBig, SuspiciousOperation
from django.db import OperationalError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.urls import reverse
from django.utils.cache import add_never_cache_headers

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
from delayjobs.http.bodies import BULK_SCHEDULE, SCHEDULE
from delayjobs.http.call import Call, Reply
from delayjobs.http.errors import ApiError
from delayjobs.http.fields import parse_query
from delayjobs.http.handlers import key_taken
from delayjobs.http.openapi import OPERATIONS
from delayjobs.http.operation import Operation, describe_permissions
from delayjobs.http.reading import read_body
from delayjobs.models import jobs_database
from delayjobs.validation import SPEC_FIELDS

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


#: Each operation on django-ninja, by operationId.
NINJA = app.build(OPERATIONS)


def api_docs(request: HttpRequest) -> HttpResponse:
    """Swagger UI, django-ninja's, on the API's own document (``delayjobs_api:openapi``).
    Mount it where the project likes, outside the API's own URLs (any other path under the
    mount point is a JSON 404): ``path("delayjobs/api-docs/", api_docs)``. The page is as
    public as the document; trying an operation out needs a key or a staff session."""
    return app.docs_page(request, reverse("delayjobs_api:openapi"), NINJA)
