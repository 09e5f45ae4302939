"""The OpenAPI document's component schemas and error responses: jobs, attempts, pages,
payloads and the one shape of every error."""

from __future__ import annotations

from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from delayjobs.conf import settings as conf
from delayjobs.http.app import body_schema
from delayjobs.http.errors import ERRORS
from delayjobs.http.field_types import NO_NUL, TEXT_SCHEMA
from delayjobs.http.fields import Body
from delayjobs.http.permissions import VIEW
from delayjobs.http.serialize import ATTEMPT_SCHEMA, JOB_DETAIL_SCHEMA, JOB_SCHEMA, OBJECT_SCHEMA

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


#: A job in a reply to a change: all of it, or only its id to a caller without VIEW.
JOB_OR_ID: Schema = {"oneOf": [ref("Job"), ref("JobId")]}


def payload_schemas() -> dict[str, Schema]:
    """The component schema of a payload: any JSON value the database stores, with no NUL
    in its strings or names. Its depth and size limits are in words and in extension
    keywords: JSON Schema cannot count nesting but by one schema per level, and 65 levels
    of them make tools that generate requests from the document (Schemathesis) hang."""
    size = conf.MAX_PAYLOAD_BYTES
    limit = f", and at most {size} bytes as JSON (DELAYJOBS['MAX_PAYLOAD_BYTES'])" if size else ""
    itself = {"$ref": "#/components/schemas/Payload"}
    payload: Schema = {
        "anyOf": [
            {"type": ["null", "boolean", "number"]},
            TEXT_SCHEMA,
            {"type": "array", "items": itself},
            {
                "type": "object",
                "propertyNames": {"pattern": NO_NUL},
                "additionalProperties": itself,
            },
        ],
        "description": (
            f"Any JSON value, nesting lists and objects at most {conf.MAX_PAYLOAD_DEPTH} "
            f"levels deep (DELAYJOBS['MAX_PAYLOAD_DEPTH']), without NUL characters{limit}."
        ),
        "x-maxDepth": conf.MAX_PAYLOAD_DEPTH,
    }
    if size:
        payload["x-maxBytes"] = size
    return {"Payload": payload}


def json_content(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


def response_name(status: int) -> str:
    return HTTPStatus(status).phrase.replace(" ", "").replace("-", "")


def error_response(status: int) -> Schema:
    meanings = [
        f"{code}: {text}" for code, (code_status, text) in ERRORS.items() if code_status == status
    ]
    response: Schema = {"description": " ".join(meanings), "content": json_content(ref("Error"))}
    if status == 401:
        response["headers"] = {
            "WWW-Authenticate": {"description": "Bearer.", "schema": {"type": "string"}}
        }
    if status == 405:
        response["headers"] = {
            "Allow": {"description": "The methods this URL takes.", "schema": {"type": "string"}}
        }
    return response


def component_schemas(request_bodies: Iterable[Body]) -> Schema:
    """The document's component schemas: the payload's, the models ``request_bodies``
    refer to, jobs, attempts, lists and errors."""
    # The models a request body refers to (a bulk request's items), as pydantic names them.
    requests = {
        name: schema for body in request_bodies for name, schema in body_schema(body)[1].items()
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
                "jobs": {"type": "array", "items": ref("Job")},
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
