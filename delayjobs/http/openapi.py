"""The API's one source of truth: every operation (route, method, permission, body, query,
responses, handler), and the OpenAPI 3.1 document built from them.

``urls`` routes and ``views`` dispatch from ``OPERATIONS``; this module describes the
same list, so the document cannot promise what the views do not do.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from django.conf import settings

import delayjobs
from delayjobs.http import handlers
from delayjobs.http.app import body_schema
from delayjobs.http.errors import ERROR_STATUSES, ERRORS
from delayjobs.http.fields import Body, Param, payload_schemas
from delayjobs.http.handlers import Call, Reply
from delayjobs.http.permissions import ADD, CANCEL, RESCHEDULE, RETRY, VIEW
from delayjobs.http.serialize import ATTEMPT_SCHEMA, JOB_DETAIL_SCHEMA, JOB_SCHEMA, OBJECT_SCHEMA

Schema = dict[str, Any]

#: The largest body of one request; a job's payload is at most 64 KiB by default
#: (DELAYJOBS["MAX_PAYLOAD_BYTES"]), so this leaves room for the rest and more.
MAX_BODY_BYTES = 1024 * 1024
#: A bulk request carries up to MAX_BULK_JOBS jobs.
MAX_BULK_BODY_BYTES = 8 * 1024 * 1024


#: A body that must be empty, or an empty JSON object, for actions that take no input.
NO_FIELDS = Body("request", ())


@dataclass(frozen=True)
class Operation:
    method: str
    #: A Django route under the mount point ("jobs/<int:job_id>/").
    route: str
    #: The URL name of the route (shared by the operations on one route).
    name: str
    operation_id: str
    summary: str
    handler: Callable[[Call], Reply]
    #: The permission needed (app_label.codename); None: public, no authentication.
    permission: str | None
    #: Status, description and schema of the successful response.
    success: tuple[int, str, Schema]
    body: Body | None = None
    #: False: the body may be left out (actions that take no input).
    body_required: bool = True
    query: tuple[Param, ...] = ()
    #: Runs in one transaction: all of it applies, or nothing does.
    writes: bool = False
    max_body_bytes: int = MAX_BODY_BYTES
    #: May answer 409 (the job's state forbids it; key conflicts).
    conflicts: bool = False
    #: May answer 404 (no such job); always so for a route with a job id.
    finds_job: bool = False
    #: The success response has a Location header: the new job's URL.
    location: bool = False
    #: More to say in the document than the permission needed.
    notes: str = ""
    #: Also needs the view permission: an action on existing jobs, which the admin offers
    #: only on its job list. Without it a caller could act on jobs it may not see, and
    #: learn from 404 against 409 which ids exist and in what state.
    needs_view: bool = False
    #: Operations on the job in the success response (OpenAPI links, by operationId).
    links: tuple[str, ...] = ()

    def permissions(self) -> tuple[str, ...]:
        """Every permission this operation needs; () for a public one."""
        if self.permission is None:
            return ()
        return (self.permission, VIEW) if self.needs_view else (self.permission,)

    def body_limit(self) -> tuple[int, str]:
        """The largest body this operation takes, and the setting that makes it so: "" for
        the API's own limit, or DATA_UPLOAD_MAX_MEMORY_SIZE when Django's is smaller
        (Django refuses such a body before the API could read it)."""
        django_limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if django_limit is not None and django_limit < self.max_body_bytes:
            return django_limit, "DATA_UPLOAD_MAX_MEMORY_SIZE"
        return self.max_body_bytes, ""

    def error_codes(self) -> list[str]:
        """Every error code this operation can answer with."""
        # "invalid" everywhere: unknown query parameters are refused on every operation.
        codes = ["method_not_allowed", "invalid", "server_error"]
        if self.permission is not None:
            codes += ["not_authenticated", "permission_denied"]
            if self.method != "GET":
                codes.append("csrf_failed")
        if self.body is not None:
            codes += ["malformed", "invalid", "too_large", "unsupported_media_type"]
        if "<int:job_id>" in self.route or self.finds_job:
            codes.append("not_found")
        if self.conflicts:
            codes += ["duplicate_key", "invalid_transition"]
        if self.writes:
            codes.append("try_again")
        return sorted(set(codes), key=list(ERRORS).index)


def describe_permissions(permissions: Sequence[str]) -> str:
    """'the permission a' or 'the permissions a and b', for messages and the document."""
    if len(permissions) == 1:
        return f"the permission {permissions[0]}"
    return f"the permissions {', '.join(permissions[:-1])} and {permissions[-1]}"


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def openapi_document(call: Call) -> Reply:
    # The servers URL is where this very document is served from: the mount point.
    here = call.url("openapi")
    return Reply(200, build_document(here.removesuffix("openapi.json").rstrip("/")))


#: A job in a reply to a change: all of it, or only its id to a caller without VIEW.
JOB_OR_ID: Schema = {"oneOf": [_ref("Job"), _ref("JobId")]}
#: Actions on existing jobs need VIEW too (needs_view): their reply is always the whole job.
JOB_ACTION = (200, "The job, after the change.", _ref("Job"))
ONLY_ID = f"The reply shows the job's fields only with {VIEW}; without it, only its id."

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "POST",
        "jobs/",
        "jobs",
        "scheduleJob",
        "Schedule a job (delayjobs.schedule).",
        handlers.schedule_job,
        ADD,
        (
            201,
            f"The job scheduled (or, with replace, the job moved); only its id without {VIEW}.",
            JOB_OR_ID,
        ),
        body=handlers.SCHEDULE,
        writes=True,
        conflicts=True,
        location=True,
        links=("getJob", "cancelJob", "rescheduleJob", "retryJob"),
        notes=(
            f"With replace: true, also {RESCHEDULE}; replace never changes the job type or "
            f"the queue of the job holding the key (409). {ONLY_ID} A job type that is not "
            f"open to the API is refused as unknown (400)."
        ),
    ),
    Operation(
        "GET",
        "jobs/",
        "jobs",
        "listJobs",
        "List jobs, newest first, a page at a time.",
        handlers.list_jobs,
        VIEW,
        (200, "A page of jobs.", _ref("JobList")),
        query=handlers.LIST_PARAMS,
    ),
    Operation(
        "POST",
        "jobs/bulk/",
        "jobs-bulk",
        "scheduleJobs",
        "Schedule many jobs in one transaction, all or none (delayjobs.schedule_many).",
        handlers.schedule_jobs,
        ADD,
        (201, "The jobs, in the order given.", _ref("BulkScheduleResult")),
        body=handlers.BULK_SCHEDULE,
        writes=True,
        max_body_bytes=MAX_BULK_BODY_BYTES,
        conflicts=True,
        notes=(f"With replace: true in any job, also {RESCHEDULE}, as for scheduleJob. {ONLY_ID}"),
    ),
    Operation(
        "POST",
        "jobs/cancel/",
        "jobs-cancel",
        "cancelJobByKey",
        "Cancel the scheduled job holding a business key.",
        handlers.cancel_job_by_key,
        CANCEL,
        JOB_ACTION,
        needs_view=True,
        body=handlers.CANCEL_BY_KEY,
        writes=True,
        conflicts=True,
        finds_job=True,
    ),
    Operation(
        "GET",
        "jobs/<int:job_id>/",
        "job",
        "getJob",
        "One job with its history of attempts.",
        handlers.get_job,
        VIEW,
        (200, "The job and its attempts.", _ref("JobDetail")),
    ),
    Operation(
        "POST",
        "jobs/<int:job_id>/cancel/",
        "job-cancel",
        "cancelJob",
        "Cancel a scheduled job (a running one is not interrupted: 409).",
        handlers.cancel_job,
        CANCEL,
        JOB_ACTION,
        needs_view=True,
        body=NO_FIELDS,
        body_required=False,
        writes=True,
        conflicts=True,
    ),
    Operation(
        "POST",
        "jobs/<int:job_id>/reschedule/",
        "job-reschedule",
        "rescheduleJob",
        "Move a scheduled job to another time.",
        handlers.reschedule_job,
        RESCHEDULE,
        JOB_ACTION,
        needs_view=True,
        body=handlers.RESCHEDULE,
        writes=True,
        conflicts=True,
    ),
    Operation(
        "POST",
        "jobs/<int:job_id>/retry/",
        "job-retry",
        "retryJob",
        "Run a finished job (failed, cancelled, succeeded, skipped, expired) again now.",
        handlers.retry_job,
        RETRY,
        JOB_ACTION,
        needs_view=True,
        body=NO_FIELDS,
        body_required=False,
        writes=True,
        conflicts=True,
    ),
    Operation(
        "GET",
        "openapi.json",
        "openapi",
        "getOpenApiDocument",
        "This document (public: it describes the API, not any job).",
        openapi_document,
        None,
        (200, "The OpenAPI 3.1 document.", {"type": "object"}),
    ),
)


def routes() -> dict[str, list[Operation]]:
    """The operations of each route, in the order of OPERATIONS."""
    grouped: dict[str, list[Operation]] = {}
    for operation in OPERATIONS:
        grouped.setdefault(operation.route, []).append(operation)
    return grouped


# The document ---------------------------------------------------------------------------

ROUTE_PARAMETER = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>")
CONVERTER_SCHEMAS: dict[str, Schema] = {
    # A larger id cannot exist: 404, as for any id of no job.
    "int": {"type": "integer", "minimum": 0, "maximum": handlers.MAX_ID},
    "str": {"type": "string"},
}


def openapi_path(route: str) -> str:
    """A Django route as an OpenAPI path: ``jobs/<int:job_id>/`` → ``/jobs/{job_id}/``."""
    return "/" + ROUTE_PARAMETER.sub(lambda match: "{" + match["name"] + "}", route)


def build_document(server_url: str) -> Schema:
    paths: Schema = {}
    for operation in OPERATIONS:
        path = paths.setdefault(openapi_path(operation.route), {})
        path[operation.method.lower()] = _operation_object(operation)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "delayjobs",
            "version": delayjobs.__version__,
            "description": (
                "Schedule, read, cancel, reschedule and retry delayed jobs. Every request "
                "but this document's needs an API key (Authorization: Bearer dj_...) or the "
                "Django session of a staff user (with a CSRF token for POST), and the "
                "permission each operation names. Every change is recorded in the admin's "
                "log (the user, and the key's name or 'session'). Errors share one shape "
                "(Error); unknown fields are refused. Every path is also served without its "
                "trailing slash (never redirected); any other path under this server is a "
                "404 not_found. HEAD is answered as GET, without the body; OPTIONS answers "
                "204 with the Allow header, without authentication."
            ),
        },
        "servers": [{"url": server_url}],
        "paths": paths,
        "components": {
            "schemas": _schemas(),
            "responses": {
                _response_name(status): _error_response(status) for status in ERROR_STATUSES
            },
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "dj_<prefix>_<secret> (manage.py create_delay_api_key)",
                },
                "sessionAuth": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": settings.SESSION_COOKIE_NAME,
                    "description": "A logged-in Django session; POST also needs X-CSRFToken.",
                },
            },
        },
        "security": [{"bearerAuth": []}, {"sessionAuth": []}],
    }


def _operation_object(operation: Operation) -> Schema:
    status, description, schema = operation.success
    success: Schema = {"description": description, "content": _json(schema)}
    if operation.location:
        success["headers"] = {
            "Location": {"description": "The job's URL.", "schema": {"type": "string"}}
        }
    if operation.links:
        success["links"] = {
            target: {
                "operationId": target,
                "parameters": {"job_id": "$response.body#/id"},
                "description": "The job just scheduled.",
            }
            for target in operation.links
        }
    responses: Schema = {str(status): success}
    for error_status in sorted({ERRORS[code][0] for code in operation.error_codes()}):
        responses[str(error_status)] = {
            "$ref": f"#/components/responses/{_response_name(error_status)}"
        }
    result: Schema = {
        "operationId": operation.operation_id,
        "summary": operation.summary,
        "parameters": [*_path_parameters(operation.route), *_query_parameters(operation.query)],
        "responses": responses,
    }
    if operation.permission is None:
        result["security"] = []
    else:
        needs = f"Needs {describe_permissions(operation.permissions())}."
        result["description"] = f"{needs} {operation.notes}".strip()
        result["x-permission"] = operation.permission
        result["x-permissions"] = list(operation.permissions())
    if operation.body is not None:
        limit, setting = operation.body_limit()
        source = f" (Django's {setting})" if setting else ""
        result["requestBody"] = {
            "required": operation.body_required,
            "content": _json(body_schema(operation.body)[0]),
            "description": f"At most {limit} bytes of JSON{source}.",
        }
    return result


def _path_parameters(route: str) -> Iterable[Schema]:
    for match in ROUTE_PARAMETER.finditer(route):
        yield {
            "name": match["name"],
            "in": "path",
            "required": True,
            "schema": CONVERTER_SCHEMAS[match["converter"] or "str"],
        }


def _query_parameters(params: tuple[Param, ...]) -> Iterable[Schema]:
    for param in params:
        schema = param.json_schema()
        if param.repeated:
            schema = {"type": "array", "items": schema}
        parameter: Schema = {
            "name": param.name,
            "in": "query",
            "required": False,
            "description": param.description,
            "schema": schema,
        }
        if param.repeated:
            parameter |= {"style": "form", "explode": True}
        yield parameter


def _json(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


def _response_name(status: int) -> str:
    return HTTPStatus(status).phrase.replace(" ", "").replace("-", "")


def _error_response(status: int) -> Schema:
    meanings = [
        f"{code}: {text}" for code, (code_status, text) in ERRORS.items() if code_status == status
    ]
    response: Schema = {"description": " ".join(meanings), "content": _json(_ref("Error"))}
    if status == 401:
        response["headers"] = {
            "WWW-Authenticate": {"description": "Bearer.", "schema": {"type": "string"}}
        }
    if status == 405:
        response["headers"] = {
            "Allow": {"description": "The methods this URL takes.", "schema": {"type": "string"}}
        }
    return response


def _schemas() -> Schema:
    # The models a request body refers to (a bulk request's items), as pydantic names them.
    requests = {
        name: schema
        for operation in OPERATIONS
        if operation.body is not None
        for name, schema in body_schema(operation.body)[1].items()
    }
    return {
        **payload_schemas(),
        **requests,
        "Job": JOB_SCHEMA,
        "JobDetail": JOB_DETAIL_SCHEMA,
        "Attempt": ATTEMPT_SCHEMA,
        "JobObject": OBJECT_SCHEMA,
        "JobList": {
            "type": "object",
            "properties": {
                "jobs": {"type": "array", "items": _ref("Job")},
                "next_cursor": {
                    "type": ["string", "null"],
                    "description": "The cursor of the next page; null on the last page.",
                },
                "next": {
                    "type": ["string", "null"],
                    "format": "uri",
                    "description": "The next page's URL; null on the last page.",
                },
            },
            "required": ["jobs", "next_cursor", "next"],
        },
        "BulkScheduleResult": {
            "type": "object",
            "properties": {"jobs": {"type": "array", "items": JOB_OR_ID}},
            "required": ["jobs"],
        },
        "JobId": {
            "type": "object",
            "description": f"A job shown to a caller without {VIEW}: its id only.",
            "properties": {"id": {"type": "integer"}},
            "required": ["id"],
            "additionalProperties": False,
        },
        "Error": {
            "type": "object",
            "properties": {
                "error": {"type": "string", "enum": list(ERRORS)},
                "detail": {"type": "string", "description": "What went wrong, for people."},
                "fields": {
                    "type": "object",
                    "description": "Request fields at fault (a.b, jobs[2].run_at) and why.",
                    "additionalProperties": {"type": "string"},
                },
                "id": {
                    "type": "string",
                    "description": "server_error: the id of the error in the service's log.",
                },
                "existing_id": {
                    "type": ["integer", "null"],
                    "description": (
                        f"duplicate_key: the active job holding the key; only to callers "
                        f"with {VIEW}."
                    ),
                },
            },
            "required": ["error", "detail", "fields"],
        },
    }
