"""The API's one source of truth: every operation (route, method, permission, body, query,
responses, handler), and the OpenAPI 3.1 document built from them.

``urls`` routes and ``views`` dispatch from ``OPERATIONS``; this module describes the
same list, so the document cannot promise what the views do not do.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from django.conf import settings

from delayjobs.core.version import __version__
from delayjobs.http import bodies, handlers, listing
from delayjobs.http.app import body_schema
from delayjobs.http.call import MAX_ID, Call, Reply
from delayjobs.http.errors import ERROR_STATUSES, ERRORS
from delayjobs.http.fields import Param
from delayjobs.http.operation import (
    MAX_BULK_BODY_BYTES,
    NO_FIELDS,
    Operation,
    Schema,
    describe_permissions,
)
from delayjobs.http.permissions import ADD, CANCEL, RESCHEDULE, RETRY, VIEW
from delayjobs.http.schemas import (
    JOB_OR_ID,
    component_schemas,
    error_response,
    json_content,
    ref,
    response_name,
)


def openapi_document(call: Call) -> Reply:
    # The servers URL is where this very document is served from: the mount point.
    here = call.url("openapi")
    return Reply(200, build_document(here.removesuffix("openapi.json").rstrip("/")))


#: Actions on existing jobs need VIEW too (needs_view): their reply is always the whole job.
JOB_ACTION = (200, "The job, after the change.", ref("Job"))
ONLY_ID = f"The reply shows the job's fields only with {VIEW}; without it, only its id."


def _job_action(
    verb: str, summary: str, handler: Callable[[Call], Reply], permission: str
) -> Operation:
    """POST jobs/<id>/<verb>/: an action on one job that takes no input (no body, or an
    empty object), in one transaction, answering 409 when the job's status forbids it."""
    return Operation(
        "POST",
        f"jobs/<int:job_id>/{verb}/",
        f"job-{verb}",
        f"{verb}Job",
        summary,
        handler,
        permission,
        JOB_ACTION,
        needs_view=True,
        body=NO_FIELDS,
        body_required=False,
        writes=True,
        conflicts=True,
    )


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
        body=bodies.SCHEDULE,
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
        listing.list_jobs,
        VIEW,
        (200, "A page of jobs.", ref("JobList")),
        query=listing.LIST_PARAMS,
    ),
    Operation(
        "POST",
        "jobs/bulk/",
        "jobs-bulk",
        "scheduleJobs",
        "Schedule many jobs in one transaction, all or none (delayjobs.schedule_many).",
        handlers.schedule_jobs,
        ADD,
        (201, "The jobs, in the order given.", ref("BulkScheduleResult")),
        body=bodies.BULK_SCHEDULE,
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
        body=bodies.CANCEL_BY_KEY,
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
        (200, "The job and its attempts.", ref("JobDetail")),
    ),
    _job_action(
        "cancel",
        "Cancel a scheduled job (a running one is not interrupted: 409).",
        handlers.cancel_job,
        CANCEL,
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
        body=bodies.RESCHEDULE,
        writes=True,
        conflicts=True,
    ),
    _job_action(
        "retry",
        "Run a finished job (failed, cancelled, succeeded, skipped, expired) again now.",
        handlers.retry_job,
        RETRY,
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
    "int": {"type": "integer", "minimum": 0, "maximum": MAX_ID},
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
            "version": __version__,
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
            "schemas": component_schemas(
                operation.body for operation in OPERATIONS if operation.body is not None
            ),
            "responses": {
                response_name(status): error_response(status) for status in ERROR_STATUSES
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
    success: Schema = {"description": description, "content": json_content(schema)}
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
            "$ref": f"#/components/responses/{response_name(error_status)}"
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
            "content": json_content(body_schema(operation.body)[0]),
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
