"""The HTTP API (delayjobs.http): every endpoint, every error code, authentication by key
and by session (with CSRF), permissions, the OpenAPI document, the key admin and command,
and one job scheduled over HTTP and run by a real consumer.

Every response a test receives is checked against the OpenAPI document (``Api.request``):
its status must be documented for that operation, and its body must match the schema.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
from django.contrib import admin
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart
from django.test.utils import CaptureQueriesContext
from django.urls import URLResolver, path, resolve, reverse
from django.utils import timezone
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi

import delayjobs
from delayjobs import api_keys as keys
from delayjobs.http.bodies import MAX_BULK_JOBS
from delayjobs.http.listing import MAX_LIMIT
from delayjobs.http.openapi import OPERATIONS, build_document, openapi_path
from delayjobs.http.operation import MAX_BODY_BYTES
from delayjobs.http.views import Endpoint, NotFound
from delayjobs.jobtypes import registry
from delayjobs.models import ApiKey, AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from sampleproject.meetings.models import Room
from tests.conftest import ConsumerFactory
from tests.integration.test_admin import make_job
from tests.utils import wait_for

pytestmark = pytest.mark.django_db

BASE = "/delayjobs/api/"
JSON = "application/json"
SCRIPTED = "tests.scripted"
FUTURE = datetime(2030, 1, 15, 14, 30, tzinfo=UTC)
ALL_PERMISSIONS = (
    "view_delayedjob",
    "add_delayedjob",
    "cancel_delayedjob",
    "reschedule_delayedjob",
    "retry_delayedjob",
)
KEY_PATTERN = re.compile(r"dj_[0-9a-f]{12}_[A-Za-z0-9_-]{20,}")
NOTHING = object()
CHALLENGE = 'Bearer realm="delayjobs"'
#: Words of Python that must not show in the API's messages.
PYTHON_TERMS = re.compile(r"timedelta|datetime\.|\bNone\b|\bTrue\b|\bFalse\b|\bint\b|\bdict")

#: A URLconf without the API (pytest.mark.urls): nothing of it may be reachable then.
urlpatterns = [path("admin/", admin.site.urls)]


# Helpers --------------------------------------------------------------------------------


@functools.cache
def document() -> dict[str, Any]:
    return build_document("http://testserver/delayjobs/api")


def assert_documented(method: str, url: str, response: Any) -> None:
    """The response's status is documented for its operation, and its body matches.

    HEAD is GET without a body; OPTIONS is 204 with Allow; a URL of no route is a 404."""
    match = resolve(urlsplit(url).path)
    assert match.namespace == "delayjobs_api"
    components = document()["components"]
    if isinstance(match.func, NotFound):
        assert response.status_code == 404
        schema: dict[str, Any] = {"$ref": "#/components/schemas/Error"}
    elif method == "OPTIONS":
        assert (response.status_code, response.content) == (204, b"")
        assert response["Allow"] == match.func.allowed
        return
    else:
        operation = match.func.operations.get("GET" if method == "HEAD" else method)
        if operation is None:
            assert response.status_code == 405
            schema = {"$ref": "#/components/schemas/Error"}
        else:
            paths = document()["paths"][openapi_path(operation.route)]
            responses = paths[operation.method.lower()]["responses"]
            status = str(response.status_code)
            assert status in responses, f"{method} {url} answered {status}, not documented"
            described = responses[status]
            if "$ref" in described:
                described = components["responses"][described["$ref"].rsplit("/", 1)[1]]
            schema = described["content"][JSON]["schema"]
    assert response["Content-Type"] == JSON
    if method == "HEAD":
        assert response.content == b""  # the test client drops it, as servers do
        return
    validator = Draft202012Validator(
        {**schema, "components": components}, format_checker=Draft202012Validator.FORMAT_CHECKER
    )
    validator.validate(response.json())


class Api:
    """A test client speaking to the API, with a key (or a session), checking each reply."""

    def __init__(self, client: Client, key: str | None = None) -> None:
        self.client = client
        self.key = key

    def request(
        self,
        method: str,
        route: str,
        body: Any = NOTHING,
        *,
        raw: bytes | None = None,
        content_type: str = JSON,
        headers: dict[str, str] | None = None,
        **query: Any,
    ) -> Any:
        sent = dict(headers or {})
        if self.key is not None:
            sent.setdefault("authorization", f"Bearer {self.key}")
        data = raw if raw is not None else b"" if body is NOTHING else json.dumps(body).encode()
        url = BASE + route + (f"?{urlencode(query, doseq=True)}" if query else "")
        response = self.client.generic(method, url, data, content_type=content_type, headers=sent)
        assert_documented(method, url, response)
        return response

    def get(self, route: str, **query: Any) -> Any:
        return self.request("GET", route, **query)

    def post(self, route: str, body: Any = NOTHING, **options: Any) -> Any:
        return self.request("POST", route, body, **options)


def make_user(*permissions: str, username: str = "service", **fields: Any) -> User:
    user = User.objects.create_user(username, password="x", **fields)
    user.user_permissions.add(*Permission.objects.filter(codename__in=permissions))
    return user


def key_of(user: User) -> str:
    return keys.create_api_key(user, "tests")[1]


@pytest.fixture
def api(client: Client) -> Api:
    """A client with a key of a user who has every permission of the API."""
    return Api(client, key_of(make_user(*ALL_PERMISSIONS)))


def rows() -> list[dict[str, Any]]:
    """Every job and attempt, to show that a refused request changed nothing."""
    jobs = list(DelayedJob.objects.order_by("pk").values())
    return jobs + list(JobAttempt.objects.order_by("pk").values())


def assert_error(response: Any, status: int, code: str, detail: str, /, **fields: str) -> None:
    """An error response: status, code, a detail containing ``detail``, these fields."""
    body = response.json()
    assert (response.status_code, body["error"]) == (status, code), body
    assert detail in body["detail"], body
    for name, text in fields.items():
        assert text in body["fields"].get(name, ""), body


def with_history(status: str = JobStatus.FAILED) -> DelayedJob:
    job = make_job(status, key="order:42")
    started = timezone.now() - timedelta(minutes=1)
    for number, outcome in ((1, AttemptOutcome.RETRYING), (2, AttemptOutcome.FAILED)):
        JobAttempt.objects.create(
            job=job,
            number=number,
            worker_id="host:1:abc",
            started_at=started + timedelta(seconds=number),
            finished_at=started + timedelta(seconds=number, milliseconds=5),
            outcome=outcome,
            error=f"ScriptedFailure: attempt {number}",
            traceback="Traceback ..." if number == 2 else "",
            lateness=timedelta(milliseconds=3),
        )
    return job


# Mounting and the OpenAPI document -------------------------------------------------------


@pytest.mark.urls("tests.integration.test_http_api")
def test_nothing_is_reachable_unless_mounted(client: Client) -> None:
    for route in ("jobs/", "openapi.json", "jobs/1/"):
        assert client.get(BASE + route).status_code == 404


def test_openapi_document_is_public_valid_and_points_at_the_mount(client: Client) -> None:
    response = Api(client).get("openapi.json")
    assert response.status_code == 200
    doc = response.json()
    validate_openapi(doc)
    assert doc["openapi"] == "3.1.0"
    assert doc["servers"] == [{"url": "http://testserver/delayjobs/api"}]
    assert set(doc["components"]["securitySchemes"]) == {"bearerAuth", "sessionAuth"}
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    unauthorized = doc["components"]["responses"]["Unauthorized"]
    assert "WWW-Authenticate" in unauthorized["headers"]
    assert "Allow" in doc["components"]["responses"]["MethodNotAllowed"]["headers"]
    assert set(doc["components"]["schemas"]["Job"]["properties"]["status"]["enum"]) >= {
        "skipped",
        "expired",
    }


def test_every_url_pattern_is_documented_with_its_methods_and_permission() -> None:
    from delayjobs.http import urls

    documented = document()["paths"]
    mounted: dict[str, set[str]] = {}
    *routes, catch_all = urls.urlpatterns
    assert isinstance(catch_all.callback, NotFound)
    for pattern in routes:
        assert not isinstance(pattern, URLResolver)
        assert isinstance(pattern.callback, Endpoint)
        route = str(pattern.pattern)
        if pattern.name is None:  # the same endpoint without its trailing slash
            assert urls.ENDPOINTS[f"{route}/"] is pattern.callback
            continue
        methods = {method.lower() for method in pattern.callback.operations}
        mounted[openapi_path(route)] = methods
    assert {route: set(item) for route, item in documented.items()} == mounted
    for operation in OPERATIONS:
        described = documented[openapi_path(operation.route)][operation.method.lower()]
        if operation.permission is None:
            assert described["security"] == []
        else:
            assert described["x-permission"] == operation.permission
            assert {"401", "403", "405"} <= set(described["responses"])
    ids = [operation.operation_id for operation in OPERATIONS]
    assert len(ids) == len(set(ids))


def test_the_document_names_every_permission_each_operation_needs(client: Client) -> None:
    view = "delayjobs.view_delayedjob"
    expected = {
        "scheduleJob": ["delayjobs.add_delayedjob"],
        "scheduleJobs": ["delayjobs.add_delayedjob"],
        "listJobs": [view],
        "getJob": [view],
        "cancelJob": ["delayjobs.cancel_delayedjob", view],
        "cancelJobByKey": ["delayjobs.cancel_delayedjob", view],
        "rescheduleJob": ["delayjobs.reschedule_delayedjob", view],
        "retryJob": ["delayjobs.retry_delayedjob", view],
    }
    served = Api(client).get("openapi.json").json()
    described = {
        item["operationId"]: item
        for methods in served["paths"].values()
        for item in methods.values()
    }
    assert set(described) == {*expected, "getOpenApiDocument"}
    for operation_id, permissions in expected.items():
        item = described[operation_id]
        assert item["x-permissions"] == permissions, operation_id
        assert item["x-permission"] == permissions[0]  # the main one, as before
        needs = " and ".join(permissions)
        plural = "s" if len(permissions) > 1 else ""
        assert item["description"].startswith(f"Needs the permission{plural} {needs}."), item
    assert "x-permissions" not in described["getOpenApiDocument"]


def test_every_writing_operation_documents_503_try_again() -> None:
    service_unavailable = document()["components"]["responses"]["ServiceUnavailable"]
    assert service_unavailable["description"].startswith("try_again: ")
    for operation in OPERATIONS:
        responses = document()["paths"][openapi_path(operation.route)][operation.method.lower()]
        assert ("503" in responses["responses"]) == operation.writes, operation.operation_id
    assert {operation.operation_id for operation in OPERATIONS if operation.writes} == {
        "scheduleJob",
        "scheduleJobs",
        "cancelJob",
        "cancelJobByKey",
        "rescheduleJob",
        "retryJob",
    }


def test_the_api_is_mounted_under_its_namespace() -> None:
    assert reverse("delayjobs_api:jobs") == BASE + "jobs/"
    assert reverse("delayjobs_api:job", kwargs={"job_id": 7}) == BASE + "jobs/7/"
    assert reverse("delayjobs_api:openapi") == BASE + "openapi.json"


# Scheduling -----------------------------------------------------------------------------


def test_schedule_with_every_field_returns_201_and_the_job(api: Api) -> None:
    response = api.post(
        "jobs/",
        {
            "job_type": SCRIPTED,
            "payload": {"order_id": 42, "note": "café"},
            "run_at": "2030-01-15T16:30:00+02:00",
            "key": "order:42:close",
            "queue": "orders",
            "max_attempts": 7,
            "max_lateness": 90.5,
            "priority": 10,
        },
    )
    assert response.status_code == 201
    data = response.json()
    job = DelayedJob.objects.get()
    assert response["Location"] == f"http://testserver{BASE}jobs/{job.pk}/"
    assert (job.job_type, job.payload, job.run_at, job.key, job.queue) == (
        SCRIPTED,
        {"order_id": 42, "note": "café"},
        FUTURE,
        "order:42:close",
        "orders",
    )
    assert (job.max_attempts, job.max_lateness, job.priority) == (7, timedelta(seconds=90.5), 10)
    assert data["id"] == job.pk
    assert data["run_at"] == "2030-01-15T14:30:00Z"
    assert data["status"] == "scheduled"
    assert data["max_lateness"] == 90.5
    assert data["trace_id"] == job.trace_id
    assert data["object"] is None
    assert "history" not in data


def test_schedule_with_only_a_job_type_takes_the_defaults(api: Api) -> None:
    before = timezone.now()
    data = api.post("jobs/", {"job_type": "tests.noop"}).json()
    job = DelayedJob.objects.get(pk=data["id"])
    assert before <= job.run_at <= timezone.now()
    assert (job.queue, job.payload, job.key, job.priority, job.max_lateness) == (
        "other",
        {},
        None,
        0,
        None,
    )
    assert job.max_attempts == 5


def test_schedule_with_a_delay(api: Api) -> None:
    before = timezone.now()
    data = api.post("jobs/", {"job_type": SCRIPTED, "delay": 3600}).json()
    run_at = DelayedJob.objects.get(pk=data["id"]).run_at
    assert before + timedelta(hours=1) <= run_at <= timezone.now() + timedelta(hours=1)


INVALID_SCHEDULES: dict[str, tuple[Any, str, dict[str, str]]] = {
    "unknown field (a typo)": (
        {"job_type": SCRIPTED, "dealy": 5},
        "dealy: Unknown field.",
        {"dealy": "Unknown field."},
    ),
    "no job type": ({"payload": {}}, "job_type", {"job_type": "This field is required."}),
    "job type not a string": ({"job_type": 5}, "job_type", {"job_type": "must be a string"}),
    "unknown job type": (
        {"job_type": "nope.never"},
        "Unknown job type 'nope.never'",
        {"job_type": "Unknown job type"},
    ),
    "naive run_at": (
        {"job_type": SCRIPTED, "run_at": "2030-01-15T14:30:00"},
        "run_at",
        {"run_at": "must carry a UTC offset"},
    ),
    "run_at not a date": (
        {"job_type": SCRIPTED, "run_at": "tomorrow"},
        "run_at",
        {"run_at": "must be an RFC 3339 date and time"},
    ),
    "run_at a number": (
        {"job_type": SCRIPTED, "run_at": 1700000000},
        "run_at",
        {"run_at": "must be a string, got a number"},
    ),
    "run_at and delay": (
        {"job_type": SCRIPTED, "run_at": "2030-01-15T14:30:00Z", "delay": 5},
        "Give run_at or delay, not both.",
        {},
    ),
    "delay as text": (
        {"job_type": SCRIPTED, "delay": "10"},
        "delay",
        {"delay": "must be a number of seconds, got a string"},
    ),
    "negative delay": (
        {"job_type": SCRIPTED, "delay": -1},
        "delay",
        {"delay": "must be 0 or more seconds"},
    ),
    "boolean delay": ({"job_type": SCRIPTED, "delay": True}, "delay", {"delay": "got a boolean"}),
    "delay too long": ({"job_type": SCRIPTED, "delay": 1e20}, "delay", {"delay": "too long"}),
    "empty key": ({"job_type": SCRIPTED, "key": ""}, "key must be 1-255", {"key": "1-255"}),
    "key too long": ({"job_type": SCRIPTED, "key": "k" * 256}, "key must be", {"key": "got 256"}),
    "key with NUL": ({"job_type": SCRIPTED, "key": "a\x00b"}, "NUL", {"key": "NUL"}),
    "bad queue": (
        {"job_type": SCRIPTED, "queue": "no spaces"},
        "queue must be",
        {"queue": "letters, digits"},
    ),
    "max_attempts zero": (
        {"job_type": SCRIPTED, "max_attempts": 0},
        "max_attempts: must be an integer from 1 to 2147483647, got 0.",
        {"max_attempts": "from 1"},
    ),
    "max_attempts of 300 digits": (
        {"job_type": SCRIPTED, "max_attempts": 1e300},
        "max_attempts: must be an integer from 1 to 2147483647, got 1e+300.",
        {"max_attempts": "got 1e+300"},
    ),
    "max_attempts fractional": (
        {"job_type": SCRIPTED, "max_attempts": 1.5},
        "max_attempts",
        {"max_attempts": "must be an integer"},
    ),
    "max_lateness zero": (
        {"job_type": SCRIPTED, "max_lateness": 0},
        "max_lateness: must be from 0.001 to 31622400 seconds (366 days), got 0.",
        {"max_lateness": "from 0.001 to 31622400 seconds"},
    ),
    "max_lateness over 366 days": (
        {"job_type": SCRIPTED, "max_lateness": 31622400.5},
        "max_lateness: must be from 0.001",
        {"max_lateness": "got 31622400.5"},
    ),
    "run_at before the year 1 in UTC": (
        {"job_type": SCRIPTED, "run_at": "0001-01-01T00:30:00+01:00"},
        "run_at: must be between the years 1 and 9999 in UTC",
        {"run_at": "'0001-01-01T00:30:00+01:00'"},
    ),
    "delay past the year 9999": (
        {"job_type": SCRIPTED, "delay": 8e13},
        "delay: 80000000000000 seconds from now is after the year 9999",
        {"delay": "after the year 9999"},
    ),
    "queue with spaces": (
        {"job_type": SCRIPTED, "queue": "a b"},
        "queue must be 1-100 characters",
        {"queue": "letters, digits"},
    ),
    "priority out of range": (
        {"job_type": SCRIPTED, "priority": 101},
        "priority: must be an integer from -100 to 100, got 101.",
        {"priority": "-100 to 100"},
    ),
    "priority as text": (
        {"job_type": SCRIPTED, "priority": "high"},
        "priority",
        {"priority": "must be an integer"},
    ),
    "replace without a key": (
        {"job_type": SCRIPTED, "replace": True},
        "replace: true needs a key",
        {"replace": "needs a key"},
    ),
    "replace not a boolean": (
        {"job_type": SCRIPTED, "key": "k", "replace": "yes"},
        "replace",
        {"replace": "must be true or false"},
    ),
    "payload with NUL": (
        {"job_type": SCRIPTED, "payload": {"text": "a\x00b"}},
        "NUL characters",
        {"payload": "NUL"},
    ),
    "payload over the limit": (
        {"job_type": SCRIPTED, "payload": {"blob": "x" * (65 * 1024)}},
        "over the limit",
        {"payload": "MAX_PAYLOAD_BYTES"},
    ),
    "payload with a lone surrogate": (
        {"job_type": SCRIPTED, "payload": "\ud800"},
        "lone surrogate",
        {"payload": "surrogate"},
    ),
    "body an array": ([{"job_type": SCRIPTED}], "must be a JSON object, got an array", {}),
    "several problems": (
        {"job_type": 1, "priority": "x"},
        "and 1 more problem",
        {"job_type": "string", "priority": "integer"},
    ),
}


@pytest.mark.parametrize(
    ("body", "detail", "fields"), list(INVALID_SCHEDULES.values()), ids=list(INVALID_SCHEDULES)
)
def test_schedule_refuses_invalid_input_with_400_and_writes_nothing(
    api: Api, body: Any, detail: str, fields: dict[str, str]
) -> None:
    response = api.post("jobs/", body)
    assert_error(response, 400, "invalid", detail, **fields)
    assert not DelayedJob.objects.exists()
    # Written for people who send JSON, not for Python programmers.
    assert not PYTHON_TERMS.search(json.dumps(response.json())), response.json()


MALFORMED: dict[str, tuple[bytes, str]] = {
    "truncated": (b'{"job_type": ', "not valid JSON: Expecting value (line 1, column 14)"),
    "empty": (b"", "The body is empty"),
    "not UTF-8": (b'{"job_type": "\xff"}', "not UTF-8"),
    "duplicate field": (
        b'{"job_type": "tests.scripted", "job_type": "tests.noop"}',
        "the field 'job_type' twice",
    ),
    "NaN": (b'{"job_type": "tests.scripted", "payload": NaN}', "NaN is not JSON"),
    "nested too deeply": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "a number of 5000 digits": (b'{"payload": ' + b"9" * 5000 + b"}", "not valid JSON"),
    "a delay of 1e400 seconds": (
        b'{"job_type": "tests.scripted", "delay": 1e400}',
        "The body holds the number 1e400, too large for this API",
    ),
    "a payload of -1e400": (
        b'{"job_type": "tests.scripted", "payload": [-1e400]}',
        "the number -1e400, too large",
    ),
}


@pytest.mark.parametrize(("raw", "detail"), list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_json_is_400(api: Api, raw: bytes, detail: str) -> None:
    response = api.post("jobs/", raw=raw)
    assert_error(response, 400, "malformed", detail)
    assert not DelayedJob.objects.exists()


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"],
)
def test_a_body_that_is_not_json_is_415(api: Api, content_type: str) -> None:
    response = api.post("jobs/", {"job_type": SCRIPTED}, content_type=content_type)
    assert_error(response, 415, "unsupported_media_type", f"the Content-Type was {content_type}")
    assert not DelayedJob.objects.exists()


def test_a_json_content_type_with_utf8_charset_is_accepted(api: Api) -> None:
    response = api.post(
        "jobs/", {"job_type": SCRIPTED}, content_type="application/json; charset=UTF-8"
    )
    assert response.status_code == 201


def test_a_body_over_the_limit_is_413_and_not_read(api: Api) -> None:
    body = {"job_type": SCRIPTED, "payload": "x" * MAX_BODY_BYTES}
    response = api.post("jobs/", body)
    assert_error(response, 413, "too_large", f"over the limit of {MAX_BODY_BYTES} bytes")
    assert not DelayedJob.objects.exists()


def test_a_body_over_djangos_own_upload_limit_is_413(api: Api, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = api.post("jobs/bulk/", {"jobs": [{"job_type": SCRIPTED, "payload": "x" * 2000}]})
    assert_error(response, 413, "too_large", "over the limit")


def request_schema(operation_id: str) -> Draft202012Validator:
    """A validator of the request body of one operation, as the document describes it."""
    for item in document()["paths"].values():
        for operation in item.values():
            if operation["operationId"] == operation_id:
                schema = operation["requestBody"]["content"][JSON]["schema"]
                return Draft202012Validator(schema)
    raise AssertionError(operation_id)


def test_the_document_describes_the_bodies_the_api_takes_and_refuses(api: Api) -> None:
    """Every body below is sent to the API too: the schema accepts exactly what it takes."""
    job = make_job(delay=timedelta(hours=1))
    cases = [
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "run_at": None, "delay": 5}, True),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "run_at": "2030-01-15T14:30:00Z"}, True),
        (
            "scheduleJob",
            "jobs/",
            {"job_type": SCRIPTED, "run_at": "2030-01-15T14:30:00Z", "delay": 5},
            False,
        ),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "max_lateness": 0.001}, True),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "max_lateness": 0.0009}, False),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "max_lateness": 366 * 86400}, True),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "max_lateness": 366 * 86400 + 1}, False),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "queue": "a.b-c_1"}, True),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "queue": "a b"}, False),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "max_attempts": 0}, False),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "priority": -101}, False),
        ("rescheduleJob", f"jobs/{job.pk}/reschedule/", {"delay": 5}, True),
        ("rescheduleJob", f"jobs/{job.pk}/reschedule/", {"run_at": "2030-01-15T14:30:00Z"}, True),
        ("rescheduleJob", f"jobs/{job.pk}/reschedule/", {}, False),
        (
            "rescheduleJob",
            f"jobs/{job.pk}/reschedule/",
            {"run_at": "2030-01-15T14:30:00Z", "delay": 5},
            False,
        ),
    ]
    for operation_id, route, body, valid in cases:
        assert request_schema(operation_id).is_valid(body) == valid, (operation_id, body)
        response = api.post(route, body)
        assert (response.status_code < 400) == valid, (body, response.json())


def test_the_document_promises_no_404_where_none_can_come(api: Api) -> None:
    paths = document()["paths"]
    assert "404" not in paths["/jobs/"]["post"]["responses"]
    assert "404" not in paths["/jobs/bulk/"]["post"]["responses"]
    assert "404" in paths["/jobs/cancel/"]["post"]["responses"]
    assert "404" in paths["/jobs/{job_id}/reschedule/"]["post"]["responses"]
    job = document()["components"]["schemas"]["Job"]["properties"]
    assert "retried until it succeeds" in job["max_attempts"]["description"]
    assert "job type's max_lateness applies" in job["max_lateness"]["description"]
    schedule = paths["/jobs/"]["post"]
    assert "delayjobs.reschedule_delayedjob" in schedule["description"]


def test_the_413_names_the_limit_that_applied(api: Api, settings: Any) -> None:
    body = {"jobs": [{"job_type": SCRIPTED, "payload": "x" * 2000}]}
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = api.post("jobs/bulk/", body)
    assert_error(
        response,
        413,
        "too_large",
        "over the limit of 1000 bytes (Django's DATA_UPLOAD_MAX_MEMORY_SIZE).",
    )
    described = build_document("http://testserver/delayjobs/api")["paths"]["/jobs/bulk/"]
    assert "At most 1000 bytes" in described["post"]["requestBody"]["description"]
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = None
    body = {"job_type": SCRIPTED, "payload": "x" * MAX_BODY_BYTES}
    response = api.post("jobs/", body)
    assert_error(response, 413, "too_large", f"over the limit of {MAX_BODY_BYTES} bytes.")


def test_a_held_key_is_409_with_the_holder_and_replace_moves_it(api: Api) -> None:
    first = api.post("jobs/", {"job_type": SCRIPTED, "key": "order:1", "delay": 60}).json()
    response = api.post("jobs/", {"job_type": SCRIPTED, "key": "order:1", "delay": 5})
    assert_error(response, 409, "duplicate_key", "already holds key 'order:1'", key="order:1")
    assert response.json()["existing_id"] == first["id"]
    moved = api.post(
        "jobs/",
        {"job_type": SCRIPTED, "key": "order:1", "run_at": "2030-01-15T14:30:00Z", "replace": True},
    )
    assert moved.status_code == 201
    assert moved.json()["id"] == first["id"]
    assert DelayedJob.objects.get().run_at == FUTURE


def test_replace_of_a_running_job_is_409_and_changes_nothing(api: Api) -> None:
    job = make_job(JobStatus.RUNNING, key="order:2")
    before = rows()
    response = api.post(
        "jobs/", {"job_type": SCRIPTED, "key": "order:2", "delay": 5, "replace": True}
    )
    assert_error(response, 409, "duplicate_key", "it is running and cannot be moved")
    assert response.json()["existing_id"] == job.pk
    assert rows() == before


VICTIM = {"job_type": SCRIPTED, "key": "order:42:close", "queue": "default"}
#: A replace of another service's job that would rewrite all of it.
HIJACK = {
    "job_type": "tests.noop",
    "payload": {"x": 1},
    "key": "order:42:close",
    "replace": True,
    "run_at": "9999-01-01T00:00:00Z",
    "queue": "nowhere",
}


def test_replace_needs_the_reschedule_permission_too(client: Client) -> None:
    make_job(key="order:42:close", delay=timedelta(hours=1))
    before = rows()
    scheduler = Api(client, key_of(make_user("add_delayedjob", "view_delayedjob")))
    same_type = {"job_type": SCRIPTED, "key": "order:42:close", "replace": True, "delay": 5}
    for route, body in (
        ("jobs/", HIJACK),
        ("jobs/", same_type),
        ("jobs/bulk/", {"jobs": [{"job_type": SCRIPTED}, same_type]}),
    ):
        response = scheduler.post(route, body)
        assert_error(
            response, 403, "permission_denied", "needs the permission delayjobs.reschedule"
        )
        assert rows() == before
    # Without replace, add_delayedjob is enough, and the held key is a plain 409.
    response = scheduler.post("jobs/", {"job_type": SCRIPTED, "key": "order:42:close"})
    assert_error(response, 409, "duplicate_key", "already holds key 'order:42:close'")
    assert rows() == before


@pytest.mark.parametrize(
    "change",
    [{"job_type": "tests.noop", "queue": "default"}, {"queue": "elsewhere"}, {"queue": None}],
    ids=["another job type", "another queue", "the job type's queue"],
)
def test_replace_never_changes_the_job_type_or_queue_of_the_held_job(
    api: Api, change: dict[str, Any]
) -> None:
    job = make_job(key="order:42:close", queue="orders", delay=timedelta(hours=1))
    before = rows()
    body = {**VICTIM, "queue": "orders", "replace": True, "delay": 5, **change}
    for route, sent, field in (
        ("jobs/", body, "key"),
        ("jobs/bulk/", {"jobs": [{"job_type": SCRIPTED}, body]}, "jobs[1].key"),
    ):
        response = api.post(route, sent)
        assert_error(
            response,
            409,
            "duplicate_key",
            f"An active job already holds key 'order:42:close' (job {job.pk}): it is a "
            f"'tests.scripted' job on queue 'orders', and replace over HTTP never changes a "
            f"job's job type or queue.",
            **{field: "never changes"},
        )
        assert response.json()["existing_id"] == job.pk
        assert rows() == before
    moved = api.post("jobs/", {**VICTIM, "queue": "orders", "replace": True, "delay": 5})
    assert (moved.status_code, moved.json()["id"]) == (201, job.pk)


def test_replies_show_a_job_only_to_callers_who_may_view_jobs(client: Client) -> None:
    """Scheduling does not let a caller read jobs: without view_delayedjob it gets the
    job's id, never its fields or a holder's id. (Cancelling, rescheduling and retrying
    need view_delayedjob: see test_an_action_without_the_view_permission_is_403.)"""
    other = make_job(key="order:42:close", delay=timedelta(hours=1))
    blind = Api(client, key_of(make_user("add_delayedjob", "reschedule_delayedjob")))
    created = blind.post("jobs/", {"job_type": SCRIPTED, "payload": {"a": 1}})
    assert created.status_code == 201
    new = DelayedJob.objects.latest("pk")
    assert created.json() == {"id": new.pk}
    assert created["Location"].endswith(f"{BASE}jobs/{new.pk}/")
    bulk = blind.post("jobs/bulk/", {"jobs": [{"job_type": SCRIPTED}]})
    assert bulk.json() == {"jobs": [{"id": DelayedJob.objects.latest("pk").pk}]}
    # A key conflict tells a caller without view_delayedjob only that the key is taken:
    # the same answer whatever holds it (another job type, a running job, or plainly).
    taken = "Key 'order:42:close' is taken: an active job holds it."
    answer = {"error": "duplicate_key", "detail": taken, "fields": {"key": taken}}
    held = blind.post("jobs/", {"job_type": SCRIPTED, "key": "order:42:close"})
    assert (held.status_code, held.json()) == (409, answer)
    wrong = blind.post("jobs/", {**HIJACK, "queue": None})
    assert (wrong.status_code, wrong.json()) == (409, answer)
    moved = blind.post("jobs/", {**VICTIM, "replace": True, "payload": {"b": 2}, "delay": 9})
    assert moved.json() == {"id": other.pk}
    DelayedJob.objects.filter(pk=other.pk).update(status=JobStatus.RUNNING)
    running = blind.post("jobs/", {**VICTIM, "replace": True})
    assert (running.status_code, running.json()) == (409, answer)


class Internal(delayjobs.JobType):
    """A job type whose payload only trusted code may write: closed to the HTTP API."""

    name = "tests.internal"
    public = False

    def execute(self, job: DelayedJob) -> None:
        return None


@pytest.fixture
def internal() -> Iterator[type[Internal]]:
    delayjobs.register(Internal)
    try:
        yield Internal
    finally:
        registry.remove(Internal.name)


def test_a_job_type_closed_to_the_api_is_refused_as_if_unknown(
    api: Api, internal: type[Internal]
) -> None:
    closed = [jobtype.name for jobtype in registry if not jobtype.public]
    assert Internal.name in closed  # and django.task, once it is closed
    for name in closed:
        for route, body in (
            ("jobs/", {"job_type": name, "payload": {"task": "x"}}),
            ("jobs/bulk/", {"jobs": [{"job_type": SCRIPTED}, {"job_type": name}]}),
        ):
            response = api.post(route, body)
            unknown = api.post(route, json.loads(json.dumps(body).replace(name, "no.such")))
            assert response.status_code == unknown.status_code == 400
            assert response.json() == json.loads(
                json.dumps(unknown.json()).replace("no.such", name)
            )
            assert_error(response, 400, "invalid", f"Unknown job type '{name}'.")
    assert not DelayedJob.objects.exists()
    # Python code still schedules it, and a key it holds cannot be taken over by a replace.
    job = delayjobs.schedule(Internal, key="internal:1")
    response = api.post(
        "jobs/", {"job_type": SCRIPTED, "key": "internal:1", "queue": "default", "replace": True}
    )
    assert_error(response, 409, "duplicate_key", "never changes a job's job type")
    assert DelayedJob.objects.get().job_type == job.job_type == Internal.name


def test_an_unknown_job_type_error_lists_no_job_types(api: Api) -> None:
    for route, body in (
        ("jobs/", {"job_type": "nope"}),
        ("jobs/bulk/", {"jobs": [{"job_type": "nope"}]}),
    ):
        text = json.dumps(api.post(route, body).json())
        assert "Unknown job type 'nope'" in text
        assert "Registered" not in text
        assert not [name for name in registry.names() if name in text]


# Bulk -----------------------------------------------------------------------------------


def test_bulk_schedules_all_in_order(api: Api) -> None:
    response = api.post(
        "jobs/bulk/",
        {
            "jobs": [
                {"job_type": SCRIPTED, "key": "a", "run_at": "2030-01-15T14:30:00Z"},
                {"job_type": "tests.noop", "delay": 60, "priority": -5},
            ]
        },
    )
    assert response.status_code == 201
    jobs = response.json()["jobs"]
    assert [job["job_type"] for job in jobs] == [SCRIPTED, "tests.noop"]
    assert [job["id"] for job in jobs] == list(
        DelayedJob.objects.order_by("pk").values_list("pk", flat=True)
    )
    assert DelayedJob.objects.get(pk=jobs[1]["id"]).priority == -5


BULK_REFUSALS: dict[str, tuple[Any, str, dict[str, str]]] = {
    "a naive time in the second job": (
        [{"job_type": SCRIPTED}, {"job_type": SCRIPTED, "run_at": "2030-01-15T14:30"}],
        "jobs[1].run_at",
        {"jobs[1].run_at": "UTC offset"},
    ),
    "a typo in the first job": (
        [{"job_type": SCRIPTED, "payloda": {}}],
        "jobs[0].payloda: Unknown field.",
        {"jobs[0].payloda": "Unknown field."},
    ),
    "a job that is not an object": (
        [{"job_type": SCRIPTED}, "tests.noop"],
        "jobs[1]",
        {"jobs[1]": "must be a JSON object"},
    ),
    "an unknown job type": (
        [{"job_type": SCRIPTED}, {"job_type": "nope"}],
        "jobs[1]: Unknown job type 'nope'",
        {"jobs[1].job_type": "Unknown job type"},
    ),
    "no jobs": ([], "jobs", {"jobs": "must hold 1 to 1000 items, got 0"}),
    "too many jobs": (
        [{"job_type": SCRIPTED}] * (MAX_BULK_JOBS + 1),
        "jobs",
        {"jobs": f"got {MAX_BULK_JOBS + 1}"},
    ),
    "not a list": ({"job_type": SCRIPTED}, "jobs", {"jobs": "must be an array, got an object"}),
}


@pytest.mark.parametrize(
    ("jobs", "detail", "fields"), list(BULK_REFUSALS.values()), ids=list(BULK_REFUSALS)
)
def test_bulk_refuses_the_whole_batch_for_one_bad_job(
    api: Api, jobs: Any, detail: str, fields: dict[str, str]
) -> None:
    response = api.post("jobs/bulk/", {"jobs": jobs})
    assert_error(response, 400, "invalid", detail, **fields)
    assert not DelayedJob.objects.exists()


def test_bulk_with_a_key_twice_is_a_409_conflict_and_schedules_none(api: Api) -> None:
    """Two jobs of one request cannot both hold a key: a conflict (409), as with a key an
    active job holds, not a malformed request (which the OpenAPI document could not say)."""
    jobs = [{"job_type": SCRIPTED, "key": "k"}, {"job_type": SCRIPTED, "key": "k"}]
    response = api.post("jobs/bulk/", {"jobs": jobs})
    assert_error(
        response,
        409,
        "duplicate_key",
        "jobs[1]: key 'k' is given to an earlier job of this request too.",
        **{"jobs[1].key": "earlier job"},
    )
    assert not DelayedJob.objects.exists()


def test_bulk_with_a_key_already_held_is_409_and_schedules_none(api: Api) -> None:
    holder = make_job(key="taken")
    before = rows()
    response = api.post(
        "jobs/bulk/", {"jobs": [{"job_type": SCRIPTED}, {"job_type": SCRIPTED, "key": "taken"}]}
    )
    assert_error(response, 409, "duplicate_key", "already holds key 'taken'")
    assert response.json()["existing_id"] == holder.pk
    assert rows() == before


# Reading --------------------------------------------------------------------------------


def test_get_a_job_with_its_history_oldest_first(api: Api) -> None:
    job = with_history()
    DelayedJob.objects.filter(pk=job.pk).update(result={"sent": 3}, last_error="ScriptedFailure")
    room = Room.objects.create(name="Blue")
    linked = delayjobs.schedule(SCRIPTED, obj=room, delay=timedelta(minutes=5))
    data = api.get(f"jobs/{job.pk}/").json()
    assert (data["id"], data["status"], data["key"], data["attempts"]) == (
        job.pk,
        "failed",
        "order:42",
        2,
    )
    assert (data["result"], data["last_error"]) == ({"sent": 3}, "ScriptedFailure")
    assert [attempt["number"] for attempt in data["history"]] == [1, 2]
    assert data["history"][1]["outcome"] == "failed"
    assert data["history"][1]["traceback"] == "Traceback ..."
    assert data["history"][0]["lateness"] == 0.003
    assert api.get(f"jobs/{linked.pk}/").json()["object"] == {
        "type": "meetings.room",
        "id": str(room.pk),
    }


@pytest.mark.parametrize("job_id", [999_999, 2**64])
def test_an_unknown_job_is_404_on_every_job_route(api: Api, job_id: int) -> None:
    assert_error(api.get(f"jobs/{job_id}/"), 404, "not_found", f"Job {job_id} does not exist.")
    for action, body in (("cancel", NOTHING), ("retry", NOTHING), ("reschedule", {"delay": 1})):
        response = api.post(f"jobs/{job_id}/{action}/", body)
        assert_error(response, 404, "not_found", str(job_id))


def test_list_filters_by_status_type_queue_key_and_object(api: Api) -> None:
    room = Room.objects.create(name="Blue")
    scheduled = make_job(key="k1")
    failed = make_job(JobStatus.FAILED)
    expired = make_job(JobStatus.EXPIRED)
    noop = make_job(job_type="tests.noop")
    linked = delayjobs.schedule(SCRIPTED, obj=room)

    def ids(**query: Any) -> list[int]:
        response = api.get("jobs/", **query)
        assert response.status_code == 200
        return [job["id"] for job in response.json()["jobs"]]

    assert ids() == [linked.pk, noop.pk, expired.pk, failed.pk, scheduled.pk]
    assert ids(status="failed") == [failed.pk]
    assert ids(status=["failed", "expired"]) == [expired.pk, failed.pk]
    assert ids(job_type="tests.noop") == [noop.pk]
    assert ids(queue="other") == [noop.pk]
    assert ids(key="k1") == [scheduled.pk]
    assert ids(object_type="meetings.room") == [linked.pk]
    assert ids(object_type="meetings.room", object_id=str(room.pk)) == [linked.pk]
    assert ids(object_type="meetings.room", object_id="0") == []
    assert ids(status="skipped") == []


def test_list_pages_with_a_cursor_through_every_job_once(api: Api) -> None:
    created = [make_job().pk for _ in range(5)]
    seen: list[int] = []
    page = api.get("jobs/", limit=2).json()
    while True:
        seen += [job["id"] for job in page["jobs"]]
        if page["next"] is None:
            assert page["next_cursor"] is None
            break
        assert urlsplit(page["next"]).path == BASE + "jobs/"
        assert "limit=2" in page["next"]
        # Jobs added meanwhile are newer: they do not shift the pages still to come.
        make_job(JobStatus.CANCELLED)
        page = api.get("jobs/", limit=2, cursor=page["next_cursor"]).json()
    assert seen == sorted(created, reverse=True)


def test_list_follows_the_next_link_as_given(api: Api) -> None:
    for _ in range(3):
        make_job()
    first = api.get("jobs/", limit=2, status="scheduled").json()
    response = api.client.get(first["next"], headers={"authorization": f"Bearer {api.key}"})
    assert len(response.json()["jobs"]) == 1


LIST_REFUSALS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "limit zero": ({"limit": "0"}, {"limit": f"from 1 to {MAX_LIMIT}"}),
    "limit too high": ({"limit": str(MAX_LIMIT + 1)}, {"limit": f"from 1 to {MAX_LIMIT}"}),
    "limit not a number": ({"limit": "ten"}, {"limit": "whole number"}),
    # More digits than int() converts (sys.get_int_max_str_digits(), 4300): no 500.
    "limit of 5000 digits": ({"limit": "9" * 5000}, {"limit": f"from 1 to {MAX_LIMIT}"}),
    "limit twice": ({"limit": ["1", "2"]}, {"limit": "Give this parameter once."}),
    "unknown status": ({"status": "done"}, {"status": "must be one of scheduled, running"}),
    "unknown parameter": ({"staus": "failed"}, {"staus": "Unknown query parameter."}),
    "garbage cursor": ({"cursor": "abc"}, {"cursor": "must be the next_cursor of a page"}),
    "empty cursor": ({"cursor": ""}, {"cursor": "must be the next_cursor of a page"}),
    "not a model label": ({"object_type": "nothing"}, {"object_type": "app_label.model"}),
    "NUL in a model label": ({"object_type": "a.b\x00"}, {"object_type": "app_label.model"}),
    "NUL in a filter": ({"key": "a\x00b"}, {"key": "NUL"}),
}


@pytest.mark.parametrize(("query", "fields"), list(LIST_REFUSALS.values()), ids=list(LIST_REFUSALS))
def test_list_refuses_bad_query_parameters(
    api: Api, query: dict[str, Any], fields: dict[str, str]
) -> None:
    assert_error(api.get("jobs/", **query), 400, "invalid", "", **fields)


def test_a_model_that_does_not_exist_has_no_jobs(api: Api) -> None:
    """A well-formed label of no model filters everything out: the document calls it
    valid, so it is not refused."""
    make_job()
    page = api.get("jobs/", object_type="nope.nothing").json()
    assert (page["jobs"], page["next_cursor"]) == ([], None)


def test_a_cursor_past_every_id_lists_from_the_newest(api: Api) -> None:
    newest = make_job()
    for cursor in ("9" * 19, str(2**63), str(newest.pk + 1)):
        assert [job["id"] for job in api.get("jobs/", cursor=cursor).json()["jobs"]] == [newest.pk]
    assert api.get("jobs/", cursor=str(newest.pk)).json()["jobs"] == []


def test_a_limit_with_leading_zeros_is_its_number(api: Api) -> None:
    for _ in range(3):
        make_job()
    for limit in ("02", "0" * 5000 + "2"):
        page = api.get("jobs/", limit=limit).json()
        assert (len(page["jobs"]), page["next_cursor"] is not None) == (2, True)
    assert len(api.get("jobs/", limit="0" * 10 + str(MAX_LIMIT)).json()["jobs"]) == 3
    assert_error(api.get("jobs/", limit="000"), 400, "invalid", "", limit="from 1 to")


def test_more_query_fields_than_django_takes_is_a_json_400(api: Api, settings: Any) -> None:
    """Django refuses to parse such a query (TooManyFieldsSent): the API answers in its
    own shape, on a read and on a write, and the write changes nothing."""
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 5
    job = make_job()
    before = rows()
    too_many = {"status": ["scheduled"] * 6}
    for response in (
        api.get("jobs/", **too_many),
        api.post(f"jobs/{job.pk}/cancel/", **too_many),
    ):
        assert_error(
            response, 400, "invalid", "The request could not be read: The number of GET/POST"
        )
        assert "DATA_UPLOAD_MAX_NUMBER_FIELDS" in response.json()["detail"]
    assert rows() == before
    # Up to the setting, the query is read as usual.
    assert api.get("jobs/", status=["scheduled"] * 5).status_code == 200


def test_unknown_query_parameters_are_refused_on_every_operation(api: Api) -> None:
    job = make_job()
    assert_error(api.get(f"jobs/{job.pk}/", expand="history"), 400, "invalid", "", expand="Unknown")
    response = api.post(f"jobs/{job.pk}/cancel/", force="1")
    assert_error(response, 400, "invalid", "", force="Unknown query parameter.")
    assert DelayedJob.objects.get().status == JobStatus.SCHEDULED
    assert_error(api.get("openapi.json", format="yaml"), 400, "invalid", "", format="Unknown")


def test_a_page_costs_the_same_queries_whatever_its_size(api: Api) -> None:
    room = Room.objects.create(name="Blue")
    api.get("jobs/")  # the key's first use writes last_used_at: not part of a page's cost

    def queries(count: int) -> int:
        DelayedJob.objects.all().delete()
        for _ in range(count):
            delayjobs.schedule(SCRIPTED, obj=room)
        with CaptureQueriesContext(connection) as captured:
            assert len(api.get("jobs/").json()["jobs"]) == count
        return len(captured)

    assert queries(2) == queries(12)


# Cancel, reschedule, retry ---------------------------------------------------------------


def test_cancel_a_scheduled_job(api: Api) -> None:
    job = make_job()
    response = api.post(f"jobs/{job.pk}/cancel/")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED


def test_cancel_takes_an_empty_json_object_but_no_fields(api: Api) -> None:
    job = make_job()
    response = api.post(f"jobs/{job.pk}/cancel/", {"reason": "paid"})
    assert_error(response, 400, "invalid", "reason: Unknown field.", reason="Unknown field.")
    assert DelayedJob.objects.get().status == JobStatus.SCHEDULED
    assert api.post(f"jobs/{job.pk}/cancel/", {}).status_code == 200


@pytest.mark.parametrize("status", [JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.CANCELLED])
def test_cancel_of_a_job_that_is_not_scheduled_is_409(api: Api, status: str) -> None:
    job = make_job(status)
    before = rows()
    response = api.post(f"jobs/{job.pk}/cancel/")
    assert_error(response, 409, "invalid_transition", f"Cannot cancel job {job.pk}: it is {status}")
    assert rows() == before


def test_cancel_by_key(api: Api) -> None:
    job = make_job(key="order:7:close")
    other = make_job(key="order:8:close")
    response = api.post("jobs/cancel/", {"key": "order:7:close"})
    assert response.status_code == 200
    assert response.json()["id"] == job.pk
    statuses = dict(DelayedJob.objects.values_list("pk", "status"))
    assert statuses == {job.pk: JobStatus.CANCELLED, other.pk: JobStatus.SCHEDULED}


def test_cancel_by_key_without_a_holder_is_404_and_of_a_running_holder_409(api: Api) -> None:
    assert_error(
        api.post("jobs/cancel/", {"key": "nobody"}),
        404,
        "not_found",
        "No scheduled or running job holds key 'nobody'.",
    )
    make_job(JobStatus.RUNNING, key="busy")
    before = rows()
    response = api.post("jobs/cancel/", {"key": "busy"})
    assert_error(response, 409, "invalid_transition", "it is running")
    assert rows() == before
    assert_error(api.post("jobs/cancel/", {}), 400, "invalid", "key", key="This field is required.")


def test_cancel_by_key_refuses_text_the_database_cannot_compare(api: Api) -> None:
    for key, problem in (("a\x00b", "NUL"), ("\ud800", "lone surrogate")):
        response = api.post("jobs/cancel/", {"key": key})
        assert_error(response, 400, "invalid", "key", key=problem)


def test_reschedule_to_a_time_or_after_a_delay(api: Api) -> None:
    job = make_job(delay=timedelta(hours=1))
    response = api.post(f"jobs/{job.pk}/reschedule/", {"run_at": "2030-01-15T15:30:00+01:00"})
    assert response.status_code == 200
    assert response.json()["run_at"] == "2030-01-15T14:30:00Z"
    before = timezone.now()
    api.post(f"jobs/{job.pk}/reschedule/", {"delay": 30})
    job.refresh_from_db()
    assert before + timedelta(seconds=30) <= job.run_at <= timezone.now() + timedelta(seconds=30)


@pytest.mark.parametrize(
    ("body", "detail", "fields"),
    [
        ({}, "Invalid reschedule request.", {"run_at": "Give one of these fields."}),
        ({"run_at": None}, "run_at", {"run_at": "must be a string, got null"}),
        ({"run_at": "2030-01-15T14:30:00"}, "run_at", {"run_at": "UTC offset"}),
        ({"run_at": "2030-01-15T14:30:00Z", "delay": 1}, "Give run_at or delay, not both.", {}),
        ({"delay": 1, "when": "now"}, "when", {"when": "Unknown field."}),
    ],
)
def test_reschedule_refuses_bad_input(
    api: Api, body: dict[str, Any], detail: str, fields: dict[str, str]
) -> None:
    job = make_job(delay=timedelta(hours=1))
    before = rows()
    assert_error(api.post(f"jobs/{job.pk}/reschedule/", body), 400, "invalid", detail, **fields)
    assert rows() == before


def test_reschedule_of_a_finished_job_is_409(api: Api) -> None:
    job = make_job(JobStatus.SUCCEEDED)
    before = rows()
    response = api.post(f"jobs/{job.pk}/reschedule/", {"delay": 5})
    assert_error(response, 409, "invalid_transition", "only a scheduled job moves")
    assert rows() == before


def test_retry_a_failed_job_keeps_its_history(api: Api) -> None:
    job = with_history()
    response = api.post(f"jobs/{job.pk}/retry/")
    assert response.status_code == 200
    assert (response.json()["status"], response.json()["attempts"]) == ("scheduled", 0)
    assert len(api.get(f"jobs/{job.pk}/").json()["history"]) == 2


def test_retry_of_a_scheduled_job_or_a_taken_key_is_409(api: Api) -> None:
    scheduled = make_job()
    assert_error(api.post(f"jobs/{scheduled.pk}/retry/"), 409, "invalid_transition", "scheduled")
    failed = make_job(JobStatus.FAILED, key="shared")
    make_job(key="shared")
    before = rows()
    response = api.post(f"jobs/{failed.pk}/retry/")
    assert_error(response, 409, "duplicate_key", "already holds key 'shared'")
    assert rows() == before


def test_a_wrong_method_is_405_with_allow(api: Api) -> None:
    for method, route, allow in (
        ("PUT", "jobs/", "POST, GET, HEAD, OPTIONS"),
        ("DELETE", "jobs/1/", "GET, HEAD, OPTIONS"),
        ("GET", "jobs/1/cancel/", "POST, OPTIONS"),
        ("PATCH", "jobs/cancel/", "POST, OPTIONS"),
        ("POST", "openapi.json", "GET, HEAD, OPTIONS"),
    ):
        response = api.request(method, route)
        assert_error(response, 405, "method_not_allowed", f"{method} is not allowed here")
        assert response["Allow"] == allow


@pytest.mark.parametrize(
    "route", ["jobs/abc/", "jobs/-1/", "jobs/%D9%A3/", "nope/", "jobs/1/nope/", "jobs/1//"]
)
def test_a_url_of_no_route_is_a_json_404(api: Api, route: str) -> None:
    for method in ("GET", "POST", "DELETE"):
        response = api.request(method, route)
        assert_error(response, 404, "not_found", "No such URL")
        assert "no-cache" in response["Cache-Control"]


def test_a_session_post_to_no_route_is_a_json_404_too() -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user(*ALL_PERMISSIONS, is_staff=True))
    assert_error(Api(client).post("nope/", {}), 404, "not_found", "No such URL")


def test_every_route_is_served_without_its_trailing_slash_too(api: Api) -> None:
    """No APPEND_SLASH redirect: a redirected POST would arrive as a GET without its body."""
    created = api.post("jobs", {"job_type": SCRIPTED, "delay": 60})
    assert created.status_code == 201
    job_id = created.json()["id"]
    assert created["Location"] == f"http://testserver{BASE}jobs/{job_id}/"
    assert api.get(f"jobs/{job_id}").json()["id"] == job_id
    assert api.get("jobs", status="scheduled").json()["jobs"][0]["id"] == job_id
    assert api.post(f"jobs/{job_id}/reschedule", {"delay": 5}).status_code == 200
    assert api.post(f"jobs/{job_id}/cancel").json()["status"] == "cancelled"
    assert api.post("jobs/bulk", {"jobs": [{"job_type": SCRIPTED}]}).status_code == 201
    assert_error(api.get("jobs/999999"), 404, "not_found", "Job 999999 does not exist.")


def test_head_is_answered_as_get_and_options_with_allow(api: Api, client: Client) -> None:
    job = make_job()
    for route in ("jobs/", f"jobs/{job.pk}/", "openapi.json"):
        get, head = api.get(route), api.request("HEAD", route)
        assert (head.status_code, head["Content-Type"]) == (get.status_code, JSON) == (200, JSON)
    unauthenticated = Api(client).request("HEAD", "jobs/")
    assert (unauthenticated.status_code, unauthenticated["WWW-Authenticate"]) == (401, CHALLENGE)
    refused = api.request("HEAD", "jobs/cancel/")
    assert (refused.status_code, refused["Allow"]) == (405, "POST, OPTIONS")
    for route, allow in (
        ("jobs/", "POST, GET, HEAD, OPTIONS"),
        (f"jobs/{job.pk}/retry/", "POST, OPTIONS"),
    ):
        # Without a key: the methods of a URL are no secret (openapi.json is public).
        response = Api(client).request("OPTIONS", route)
        assert (response.status_code, response["Allow"]) == (204, allow)


# Authentication -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("authorization", "detail"),
    [
        (None, "Authentication credentials were not provided"),
        ("Token abc", "Malformed Authorization header"),
        ("Bearer", "Malformed Authorization header"),
        ("Bearer a b", "Malformed Authorization header"),
        ("Bearer not-a-delayjobs-key", "Invalid API key."),
        ("Bearer dj_000000000000_secret", "Invalid API key."),
    ],
)
def test_requests_without_a_valid_key_are_401(
    client: Client, authorization: str | None, detail: str
) -> None:
    make_user(*ALL_PERMISSIONS)
    headers = {"authorization": authorization} if authorization else {}
    for method, route, body in (
        ("GET", "jobs/", NOTHING),
        ("POST", "jobs/", {"job_type": SCRIPTED}),
    ):
        response = Api(client).request(method, route, body, headers=headers)
        assert_error(response, 401, "not_authenticated", detail)
        assert response["WWW-Authenticate"] == CHALLENGE
    assert not DelayedJob.objects.exists()


def test_a_wrong_secret_for_a_real_prefix_is_401(client: Client) -> None:
    key = key_of(make_user(*ALL_PERMISSIONS))
    prefix, secret = keys.split_key(key) or ("", "")
    forged = f"dj_{prefix}_{secret[:-1]}{'A' if secret[-1] != 'A' else 'B'}"
    assert_error(Api(client, forged).get("jobs/"), 401, "not_authenticated", "Invalid API key.")


@pytest.mark.parametrize(
    "token",
    [
        "dj_ab\x00cd00000000_" + "s" * 43,
        "dj_abcdef012345_" + "s" * 42 + "\x00",
        "dj_" + "a" * 40 + "_" + "s" * 43,
        "dj_ABCDEF012345_" + "s" * 43,
        "dj_abcdef01234\u00e9_" + "s" * 43,
        "dj_abcdef012345_" + "s" * 42 + "\u00e9",
        "dj_abcdef012345_short",
    ],
    ids=["NUL in prefix", "NUL in secret", "long prefix", "upper case", "é", "é2", "short"],
)
def test_a_token_not_shaped_like_a_key_is_401_before_any_query(client: Client, token: str) -> None:
    """PostgreSQL refuses a NUL in a query parameter: junk must never reach the database."""
    make_user(*ALL_PERMISSIONS)
    with CaptureQueriesContext(connection) as captured:
        response = Api(client, token).get("jobs/")
    assert_error(response, 401, "not_authenticated", "Invalid API key.")
    assert not [query for query in captured if "apikey" in query["sql"]]


def test_a_revoked_key_and_a_key_of_an_inactive_user_are_401(client: Client) -> None:
    user = make_user(*ALL_PERMISSIONS)
    key, plaintext = keys.create_api_key(user, "svc")
    assert Api(client, plaintext).get("jobs/").status_code == 200
    ApiKey.objects.filter(pk=key.pk).update(is_active=False)
    assert_error(Api(client, plaintext).get("jobs/"), 401, "not_authenticated", "revoked")
    ApiKey.objects.filter(pk=key.pk).update(is_active=True)
    User.objects.filter(pk=user.pk).update(is_active=False)
    assert_error(Api(client, plaintext).get("jobs/"), 401, "not_authenticated", "inactive")


def test_a_bad_key_is_refused_even_with_a_logged_in_session(client: Client) -> None:
    client.force_login(make_user(*ALL_PERMISSIONS, is_staff=True))
    assert Api(client).get("jobs/").status_code == 200
    assert_error(
        Api(client, "dj_000000000000_nope").get("jobs/"), 401, "not_authenticated", "Invalid"
    )


def test_last_used_at_is_written_at_most_once_a_minute(client: Client) -> None:
    key, plaintext = keys.create_api_key(make_user(*ALL_PERMISSIONS), "svc")
    assert key.last_used_at is None
    Api(client, plaintext).get("jobs/")
    first = ApiKey.objects.get().last_used_at
    assert first is not None
    Api(client, plaintext).get("jobs/")
    assert ApiKey.objects.get().last_used_at == first
    stale = timezone.now() - keys.TOUCH_INTERVAL - timedelta(seconds=1)
    ApiKey.objects.update(last_used_at=stale)
    Api(client, plaintext).get("jobs/")
    assert ApiKey.objects.get().last_used_at > stale


def test_keys_store_only_the_digest_of_the_secret() -> None:
    key, plaintext = keys.create_api_key(make_user(), "svc")
    assert KEY_PATTERN.fullmatch(plaintext)
    prefix, secret = keys.split_key(plaintext) or ("", "")
    assert key.prefix == prefix
    assert key.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in key.digest
    assert keys.find_key(plaintext) == key
    with pytest.raises(ValueError, match="name must be 1-100 characters"):
        keys.create_api_key(make_user(username="other"), "")


# Session and CSRF -----------------------------------------------------------------------


def test_a_session_reads_and_writes_with_a_csrf_token_only() -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user(*ALL_PERMISSIONS, username="staff", is_staff=True))
    session = Api(client)
    assert session.get("jobs/").status_code == 200
    response = session.post("jobs/", {"job_type": SCRIPTED})
    assert_error(response, 403, "csrf_failed", "CSRF check failed: CSRF cookie not set.")
    assert not DelayedJob.objects.exists()
    # Any page sets the cookie; the token goes back in the header, as a script sends it.
    client.get(reverse("admin:index"))
    token = client.cookies["csrftoken"].value
    response = session.post("jobs/", {"job_type": SCRIPTED}, headers={"x-csrftoken": token})
    assert response.status_code == 201


def staff_session() -> tuple[Api, str]:
    """A staff user's session of a client that enforces CSRF, and its CSRF token."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user(*ALL_PERMISSIONS, username="staff", is_staff=True))
    client.get(reverse("admin:index"))  # any page sets the CSRF cookie
    return Api(client), client.cookies["csrftoken"].value


def test_a_session_post_of_a_form_with_its_csrf_token_is_415() -> None:
    """The CSRF check reads a form's token from request.POST, which consumes a multipart
    body: the request is still refused as a body that is not JSON, not with a 500."""
    session, token = staff_session()
    job = make_job(delay=timedelta(hours=1))
    before = rows()
    for route, fields, headers in (
        ("jobs/", {"job_type": SCRIPTED, "csrfmiddlewaretoken": token}, {}),
        ("jobs/", {"job_type": SCRIPTED}, {"x-csrftoken": token}),
        (f"jobs/{job.pk}/cancel/", {"csrfmiddlewaretoken": token}, {}),
    ):
        response = session.post(
            route,
            raw=encode_multipart(BOUNDARY, fields),
            content_type=MULTIPART_CONTENT,
            headers=headers,
        )
        assert_error(
            response,
            415,
            "unsupported_media_type",
            "Send the body as application/json (UTF-8); the Content-Type was multipart/form-data",
        )
        assert rows() == before
    assert log_entries() == []


FORM = "application/x-www-form-urlencoded"
#: Form bodies Django refuses to parse when the CSRF check reads request.POST, with the
#: settings that make it so, and the API's reply.
UNREADABLE_FORMS: dict[str, tuple[dict[str, Any], str, bytes, int, str, str]] = {
    "too many form fields": (
        {"DATA_UPLOAD_MAX_NUMBER_FIELDS": 5},
        FORM,
        urlencode({"field": range(6)}, doseq=True).encode(),
        400,
        "invalid",
        "The request could not be read: The number of GET/POST parameters exceeded",
    ),
    "too many multipart fields": (
        {"DATA_UPLOAD_MAX_NUMBER_FIELDS": 5},
        MULTIPART_CONTENT,
        encode_multipart(BOUNDARY, {"field": list(range(6))}),
        400,
        "invalid",
        "The request could not be read: The number of GET/POST parameters exceeded",
    ),
    "multipart without a boundary": (
        {},
        "multipart/form-data",
        b"field=1",
        400,
        "invalid",
        "The request could not be read: Invalid boundary in multipart",
    ),
    "form over DATA_UPLOAD_MAX_MEMORY_SIZE": (
        {"DATA_UPLOAD_MAX_MEMORY_SIZE": 1000},
        FORM,
        urlencode({"field": "x" * 2000}).encode(),
        413,
        "too_large",
        "The body is over Django's size limits.",
    ),
}


@pytest.mark.parametrize(
    ("overrides", "content_type", "raw", "status", "code", "detail"),
    list(UNREADABLE_FORMS.values()),
    ids=list(UNREADABLE_FORMS),
)
def test_a_session_form_body_django_will_not_parse_is_a_json_error(
    settings: Any,
    overrides: dict[str, Any],
    content_type: str,
    raw: bytes,
    status: int,
    code: str,
    detail: str,
) -> None:
    for name, value in overrides.items():
        setattr(settings, name, value)
    session, token = staff_session()
    job = make_job(delay=timedelta(hours=1))
    before = rows()
    for route in ("jobs/", f"jobs/{job.pk}/cancel/"):
        response = session.post(
            route, raw=raw, content_type=content_type, headers={"x-csrftoken": token}
        )
        assert_error(response, status, code, detail)
        assert rows() == before


def test_key_requests_need_no_csrf_token() -> None:
    client = Client(enforce_csrf_checks=True)
    response = Api(client, key_of(make_user(*ALL_PERMISSIONS))).post(
        "jobs/", {"job_type": SCRIPTED}
    )
    assert response.status_code == 201


def test_an_anonymous_session_is_401(client: Client) -> None:
    assert_error(Api(client).get("jobs/"), 401, "not_authenticated", "not provided")


def test_login_required_middleware_leaves_the_api_to_its_own_authentication(
    client: Client, settings: Any
) -> None:
    """Django 5.1's LoginRequiredMiddleware redirects anonymous requests to the login page;
    a key request is anonymous to Django, and a client wants a JSON 401, not a redirect."""
    login_required = "django.contrib.auth.middleware.LoginRequiredMiddleware"
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, login_required]
    # The middleware is on: any other page of the site sends an anonymous visitor away.
    page = client.get(reverse("meetings:list"))
    assert (page.status_code, page["Location"].split("?")[0]) == (302, settings.LOGIN_URL)
    keyed = Api(client, key_of(make_user(*ALL_PERMISSIONS)))
    assert keyed.get("jobs/").status_code == 200
    created = keyed.post("jobs/", {"job_type": SCRIPTED})
    assert created.status_code == 201
    assert keyed.post(f"jobs/{created.json()['id']}/cancel/").status_code == 200
    anonymous = Api(client)
    response = anonymous.get("jobs/")
    assert_error(response, 401, "not_authenticated", "not provided")
    assert response["WWW-Authenticate"] == CHALLENGE
    assert_error(anonymous.post("jobs/", {"job_type": SCRIPTED}), 401, "not_authenticated", "")
    assert anonymous.get("openapi.json").status_code == 200
    assert anonymous.request("OPTIONS", "jobs/").status_code == 204
    assert_error(anonymous.get("nowhere/"), 404, "not_found", "No such URL")


def test_a_session_of_a_user_who_is_not_staff_is_401(client: Client) -> None:
    client.force_login(make_user(*ALL_PERMISSIONS, username="customer"))
    for method, route, body in (
        ("GET", "jobs/", NOTHING),
        ("POST", "jobs/", {"job_type": SCRIPTED}),
    ):
        response = Api(client).request(method, route, body)
        assert_error(response, 401, "not_authenticated", "only staff users")
    assert not DelayedJob.objects.exists()
    # A key needs no staff status: a service's user is a plain account.
    assert (
        Api(Client(), key_of(make_user(*ALL_PERMISSIONS, username="svc"))).get("jobs/").status_code
        == 200
    )


# Permissions ----------------------------------------------------------------------------


#: Every permission each operation needs (an action on existing jobs also needs
#: view_delayedjob, as in the admin), a request of it, and its success status.
PERMISSION_CASES = {
    "schedule": (("add_delayedjob",), lambda job: ("POST", "jobs/", {"job_type": SCRIPTED}), 201),
    "bulk": (
        ("add_delayedjob",),
        lambda job: ("POST", "jobs/bulk/", {"jobs": [{"job_type": SCRIPTED}]}),
        201,
    ),
    "list": (("view_delayedjob",), lambda job: ("GET", "jobs/", NOTHING), 200),
    "get": (("view_delayedjob",), lambda job: ("GET", f"jobs/{job.pk}/", NOTHING), 200),
    "cancel": (
        ("cancel_delayedjob", "view_delayedjob"),
        lambda job: ("POST", f"jobs/{job.pk}/cancel/", NOTHING),
        200,
    ),
    "cancel by key": (
        ("cancel_delayedjob", "view_delayedjob"),
        lambda job: ("POST", "jobs/cancel/", {"key": "p"}),
        200,
    ),
    "reschedule": (
        ("reschedule_delayedjob", "view_delayedjob"),
        lambda job: ("POST", f"jobs/{job.pk}/reschedule/", {"delay": 5}),
        200,
    ),
    "retry": (
        ("retry_delayedjob", "view_delayedjob"),
        lambda job: ("POST", f"jobs/{job.pk}/retry/", NOTHING),
        200,
    ),
}


@pytest.mark.parametrize(
    ("permissions", "request_of", "success"),
    list(PERMISSION_CASES.values()),
    ids=list(PERMISSION_CASES),
)
def test_each_operation_needs_its_permissions(
    client: Client, permissions: tuple[str, ...], request_of: Any, success: int
) -> None:
    job = make_job(key="p")
    if "retry_delayedjob" in permissions:
        DelayedJob.objects.filter(pk=job.pk).update(status=JobStatus.FAILED)
    method, route, body = request_of(job)
    needed = [f"delayjobs.{codename}" for codename in permissions]
    # The document names the same permissions the view checks.
    operation = resolve(BASE + route).func.operations[method]
    described = document()["paths"][openapi_path(operation.route)][method.lower()]
    assert described["x-permissions"] == needed
    plural = "s" if len(needed) > 1 else ""
    message = f"This operation needs the permission{plural} {' and '.join(needed)}."
    before = rows()
    # Any one of them missing is enough to be refused, whatever else the user may do.
    for missing in permissions:
        others = [codename for codename in ALL_PERMISSIONS if codename != missing]
        without = Api(client, key_of(make_user(*others, username=f"without-{missing}")))
        response = without.request(method, route, body)
        assert_error(response, 403, "permission_denied", message)
        assert f"delayjobs.{missing}" in response.json()["detail"]
        assert rows() == before
    with_them = Api(client, key_of(make_user(*permissions, username="with")))
    assert with_them.request(method, route, body).status_code == success


def test_an_action_without_the_view_permission_is_403_and_changes_nothing(
    client: Client,
) -> None:
    """As in the admin, whose actions are on its job list: cancel, reschedule and retry
    need view_delayedjob too, or a caller could act on jobs it may not see (and tell from
    404 against 409 which ids exist, and in what state)."""
    job = make_job(key="by-key", delay=timedelta(hours=1))
    failed = make_job(JobStatus.FAILED)
    acting = Api(client, key_of(make_user(*ALL_PERMISSIONS[2:], username="actor")))
    before = rows()
    for route, body, permission in (
        (f"jobs/{job.pk}/cancel/", NOTHING, "cancel"),
        ("jobs/cancel/", {"key": "by-key"}, "cancel"),
        (f"jobs/{job.pk}/reschedule/", {"delay": 60}, "reschedule"),
        (f"jobs/{failed.pk}/retry/", NOTHING, "retry"),
        # Refused before the job is looked up: a missing job is no 404 either.
        ("jobs/999999/cancel/", NOTHING, "cancel"),
    ):
        response = acting.post(route, body)
        assert_error(
            response,
            403,
            "permission_denied",
            f"This operation needs the permissions delayjobs.{permission}_delayedjob and "
            f"delayjobs.view_delayedjob.",
        )
        assert rows() == before
    assert log_entries() == []


def test_a_superuser_may_do_everything(client: Client) -> None:
    superuser = User.objects.create_superuser("root", password="x")
    api = Api(client, key_of(superuser))
    job = api.post("jobs/", {"job_type": SCRIPTED, "delay": 60}).json()
    assert api.post(f"jobs/{job['id']}/cancel/").status_code == 200


def test_permission_is_checked_before_the_body_is_read(client: Client) -> None:
    reader = Api(client, key_of(make_user("view_delayedjob")))
    response = reader.post("jobs/", raw=b"not json")
    assert_error(response, 403, "permission_denied", "delayjobs.add_delayedjob")


# The audit log ------------------------------------------------------------------------


def log_entries() -> list[tuple[int, str, int, str]]:
    """(job id, username, action flag, message) of every admin log entry about a job."""
    entries = LogEntry.objects.filter(
        content_type=ContentType.objects.get_for_model(DelayedJob)
    ).order_by("pk")
    return [
        (int(entry.object_id), entry.user.username, entry.action_flag, entry.change_message)
        for entry in entries
    ]


def test_every_change_through_the_api_is_in_the_admin_log_with_user_and_key(
    client: Client,
) -> None:
    user = make_user(*ALL_PERMISSIONS, username="billing")
    _key, plaintext = keys.create_api_key(user, "billing: order timeouts")
    api = Api(client, plaintext)
    via = "(API key 'billing: order timeouts')"
    job = api.post("jobs/", {"job_type": SCRIPTED, "key": "k", "run_at": "2030-01-15T14:30:00Z"})
    job_id = job.json()["id"]
    scheduled = api.post("jobs/bulk/", {"jobs": [{"job_type": SCRIPTED}] * 2}).json()["jobs"]
    bulk = [item["id"] for item in scheduled]
    moved = {"job_type": SCRIPTED, "key": "k", "replace": True, "run_at": "2030-01-16T00:00:00Z"}
    api.post("jobs/", moved)
    api.post(f"jobs/{job_id}/reschedule/", {"run_at": "2030-01-17T00:00:00Z"})
    api.post(f"jobs/{job_id}/cancel/")
    api.post(f"jobs/{job_id}/retry/")
    api.post("jobs/cancel/", {"key": "k"})
    assert log_entries() == [
        (job_id, "billing", ADDITION, f"Scheduled through the HTTP API {via}."),
        (bulk[0], "billing", ADDITION, f"Scheduled through the HTTP API {via}."),
        (bulk[1], "billing", ADDITION, f"Scheduled through the HTTP API {via}."),
        (
            job_id,
            "billing",
            CHANGE,
            "Moved through the HTTP API by a schedule with replace, from "
            f"2030-01-15T14:30:00Z to 2030-01-16T00:00:00Z {via}.",
        ),
        (
            job_id,
            "billing",
            CHANGE,
            "Rescheduled through the HTTP API from 2030-01-16T00:00:00Z to "
            f"2030-01-17T00:00:00Z {via}.",
        ),
        (job_id, "billing", CHANGE, f"Cancelled through the HTTP API {via}."),
        (
            job_id,
            "billing",
            CHANGE,
            "Retried through the HTTP API (was cancelled; API key 'billing: order timeouts').",
        ),
        (job_id, "billing", CHANGE, f"Cancelled through the HTTP API {via}."),
    ]
    # Shown on the job's history page in the admin, as the admin's own actions are.
    client.force_login(User.objects.create_superuser("root", password="x"))
    history = client.get(reverse("admin:delayjobs_delayedjob_history", args=[job_id]))
    assert "Rescheduled through the HTTP API" in history.content.decode()


def test_a_session_is_named_in_the_log_and_a_refusal_logs_nothing(client: Client) -> None:
    client.force_login(make_user(*ALL_PERMISSIONS, username="operator", is_staff=True))
    job = make_job(JobStatus.SUCCEEDED)
    assert Api(client).post(f"jobs/{job.pk}/cancel/").status_code == 409
    assert log_entries() == []
    Api(client).post(f"jobs/{job.pk}/retry/")
    assert log_entries() == [
        (job.pk, "operator", CHANGE, "Retried through the HTTP API (was succeeded; session).")
    ]


# A write PostgreSQL rolls back ----------------------------------------------------------


@contextmanager
def failing_audit_log(sqlstate: str) -> Iterator[None]:
    """Every insert into the admin's log raises a PostgreSQL error with ``sqlstate``: the
    last write of every writing operation fails, after its changes to the jobs. (Within the
    test's transaction, which takes the trigger away with it; dropped here anyway.)"""
    table = connection.ops.quote_name(LogEntry._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION delayjobs_test_fail() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN RAISE EXCEPTION 'raised by a test trigger' USING ERRCODE = '{sqlstate}'; "
            "END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER delayjobs_test_fail BEFORE INSERT ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION delayjobs_test_fail()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER delayjobs_test_fail ON {table}")
            cursor.execute("DROP FUNCTION delayjobs_test_fail()")


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"], ids=["deadlock", "serialization"])
def test_a_write_the_database_rolls_back_is_503_try_again_and_changes_nothing(
    api: Api, sqlstate: str, django_capture_on_commit_callbacks: Any
) -> None:
    """PostgreSQL breaks a deadlock (or a serialization failure) by rolling back one of the
    transactions: nothing of it was written, and sent again it will pass."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no deadlock detection: a writer waits for the database lock")
    job = make_job(key="k", delay=timedelta(hours=1))
    failed = make_job(JobStatus.FAILED)
    writes = [
        ("jobs/", {"job_type": SCRIPTED}),
        ("jobs/bulk/", {"jobs": [{"job_type": SCRIPTED}, {"job_type": SCRIPTED}]}),
        ("jobs/", {"job_type": SCRIPTED, "key": "k", "replace": True, "delay": 5}),
        (f"jobs/{job.pk}/cancel/", NOTHING),
        ("jobs/cancel/", {"key": "k"}),
        (f"jobs/{job.pk}/reschedule/", {"delay": 60}),
        (f"jobs/{failed.pk}/retry/", NOTHING),
    ]
    api.get("jobs/")  # the key's first use writes last_used_at: not part of the writes
    before = rows()
    with failing_audit_log(sqlstate):
        for route, body in writes:
            with django_capture_on_commit_callbacks() as callbacks:
                response = api.post(route, body)
            assert_error(response, 503, "try_again", "nothing was changed. Send it again.")
            assert response["Retry-After"] == "1"
            assert rows() == before, route
            assert log_entries() == []
            assert callbacks == []  # nothing for Redis either
    # Any other database error is not the client's to retry: a JSON 500, logged with its id.
    with failing_audit_log("55P03"):  # lock_not_available
        response = api.post("jobs/", {"job_type": SCRIPTED})
    assert_error(response, 500, "server_error", response.json()["id"])
    assert rows() == before
    # Sent again, once the database lets it through, each passes.
    for route, body in writes[:2]:
        with django_capture_on_commit_callbacks() as callbacks:
            assert api.post(route, body).status_code == 201
        assert callbacks  # its jobs go to Redis once it commits
    assert len(log_entries()) == 3


# Key admin and command -----------------------------------------------------------------


def test_create_delay_api_key_prints_a_working_key_once(client: Client) -> None:
    make_user(*ALL_PERMISSIONS, username="billing")
    stdout, stderr = StringIO(), StringIO()
    call_command(
        "create_delay_api_key",
        "--user",
        "billing",
        "--name",
        "billing svc",
        stdout=stdout,
        stderr=stderr,
    )
    plaintext = stdout.getvalue().strip()
    assert KEY_PATTERN.fullmatch(plaintext)
    assert "shown only this once" in stderr.getvalue()
    key = ApiKey.objects.get()
    assert (key.name, key.user.username) == ("billing svc", "billing")
    assert Api(client, plaintext).get("jobs/").status_code == 200


@pytest.mark.parametrize(
    ("username", "name", "message"),
    [
        ("ghost", "svc", "No user 'ghost'"),
        ("sleeper", "svc", "User 'sleeper' is inactive"),
        ("billing", "x" * 101, "name must be 1-100 characters"),
    ],
)
def test_create_delay_api_key_refuses_clearly(username: str, name: str, message: str) -> None:
    make_user(username="billing")
    make_user(username="sleeper", is_active=False)
    with pytest.raises(CommandError, match=message):
        call_command("create_delay_api_key", "--user", username, "--name", name)
    assert not ApiKey.objects.exists()


def test_the_admin_creates_a_key_shows_it_once_and_revokes_it(client: Client) -> None:
    client.force_login(User.objects.create_superuser("root", password="x"))
    service = make_user(*ALL_PERMISSIONS)
    response = client.post(
        reverse("admin:delayjobs_apikey_add"), {"user": service.pk, "name": "reports"}
    )
    assert response.status_code == 200
    plaintext = KEY_PATTERN.search(response.content.decode())[0]  # type: ignore[index]
    key = ApiKey.objects.get()
    assert (key.user, key.name) == (service, "reports")
    assert Api(Client(), plaintext).get("jobs/").status_code == 200
    for page in (
        client.get(reverse("admin:delayjobs_apikey_changelist")),
        client.get(reverse("admin:delayjobs_apikey_change", args=[key.pk])),
    ):
        assert page.status_code == 200
        assert key.prefix in page.content.decode()
        assert key.digest not in page.content.decode()
        assert plaintext not in page.content.decode()
    # Revoked by unticking "active" in the list (list_editable).
    response = client.post(
        reverse("admin:delayjobs_apikey_changelist"),
        {
            "form-TOTAL_FORMS": "1",
            "form-INITIAL_FORMS": "1",
            "form-0-id": str(key.pk),
            "_save": "Save",
        },
    )
    assert response.status_code == 302
    assert not ApiKey.objects.get().is_active
    assert Api(Client(), plaintext).get("jobs/").status_code == 401


def test_only_a_superuser_creates_keys_for_another_user(client: Client) -> None:
    staff = make_user("add_apikey", "view_apikey", username="staff", is_staff=True)
    client.force_login(staff)
    other = make_user(*ALL_PERMISSIONS, username="powerful")
    url = reverse("admin:delayjobs_apikey_add")
    response = client.post(url, {"user": other.pk, "name": "borrowed"})
    assert response.status_code == 200
    assert "Only a superuser may create a key for another user" in response.content.decode()
    assert not ApiKey.objects.exists()
    response = client.post(url, {"user": staff.pk, "name": "mine"})
    assert KEY_PATTERN.search(response.content.decode())
    assert ApiKey.objects.get().user == staff


def revoked_key_of(user: User, name: str = "old") -> ApiKey:
    key, _plaintext = keys.create_api_key(user, name)
    ApiKey.objects.filter(pk=key.pk).update(is_active=False)
    return ApiKey.objects.get(pk=key.pk)


def editable_list_post(client: Client, *keys_and_active: tuple[ApiKey, bool]) -> Any:
    """The key list's form posted, with "active" ticked or not on each key given."""
    data = {
        "form-TOTAL_FORMS": str(len(keys_and_active)),
        "form-INITIAL_FORMS": str(len(keys_and_active)),
        "_save": "Save",
    }
    for index, (key, active) in enumerate(keys_and_active):
        data[f"form-{index}-id"] = str(key.pk)
        if active:
            data[f"form-{index}-is_active"] = "on"
    return client.post(reverse("admin:delayjobs_apikey_changelist"), data)


def test_a_revoked_key_stays_revoked_even_for_a_superuser(client: Client) -> None:
    root = User.objects.create_superuser("root", password="x")
    client.force_login(root)
    key = revoked_key_of(make_user(*ALL_PERMISSIONS))
    page = client.get(reverse("admin:delayjobs_apikey_change", args=[key.pk]))
    assert 'name="is_active"' not in page.content.decode()  # shown, not editable
    client.post(
        reverse("admin:delayjobs_apikey_change", args=[key.pk]),
        {"name": "old", "is_active": "on"},
    )
    assert not ApiKey.objects.get(pk=key.pk).is_active
    editable_list_post(client, (key, True))
    assert not ApiKey.objects.get(pk=key.pk).is_active
    # Renaming it is still possible; it stays revoked.
    client.post(reverse("admin:delayjobs_apikey_change", args=[key.pk]), {"name": "renamed"})
    assert ApiKey.objects.values_list("name", "is_active").get(pk=key.pk) == ("renamed", False)


def test_staff_see_and_change_only_their_own_keys(client: Client) -> None:
    boss = User.objects.create_superuser("boss", password="x")
    boss_key, boss_plaintext = keys.create_api_key(boss, "boss key")
    revoked = revoked_key_of(boss, "boss old key")
    staff = make_user(
        "view_apikey", "change_apikey", "delete_apikey", username="staff", is_staff=True
    )
    own, _plaintext = keys.create_api_key(staff, "mine")
    client.force_login(staff)
    listed = client.get(reverse("admin:delayjobs_apikey_changelist")).content.decode()
    assert own.prefix in listed
    assert boss_key.prefix not in listed and revoked.prefix not in listed
    for key in (boss_key, revoked):
        for view in ("change", "delete"):
            response = client.get(reverse(f"admin:delayjobs_apikey_{view}", args=[key.pk]))
            assert response.status_code in (302, 403, 404)
            assert key.prefix not in response.content.decode()
        client.post(
            reverse("admin:delayjobs_apikey_change", args=[key.pk]),
            {"name": "hijacked", "is_active": "on" if key is revoked else ""},
        )
        client.post(reverse("admin:delayjobs_apikey_delete", args=[key.pk]), {"post": "yes"})
    editable_list_post(client, (boss_key, False), (revoked, True))
    assert list(ApiKey.objects.filter(user=boss).values_list("name", "is_active")) == [
        ("boss old key", False),
        ("boss key", True),
    ]
    assert Api(Client(), boss_plaintext).get("jobs/").status_code == 200
    # Their own key they may revoke, in the list.
    assert editable_list_post(client, (own, False)).status_code == 302
    assert not ApiKey.objects.get(pk=own.pk).is_active


# End to end ------------------------------------------------------------------------------


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_job_scheduled_over_http_runs_in_a_consumer_and_shows_succeeded(
    client: Client, consumer_process: ConsumerFactory
) -> None:
    api = Api(client, key_of(make_user(*ALL_PERMISSIONS)))
    consumer = consumer_process("--worker-id", "http-e2e")
    job = api.post("jobs/", {"job_type": SCRIPTED, "payload": {"via": "http"}}).json()

    def finished() -> dict[str, Any] | None:
        assert consumer.returncode is None, consumer.output()
        data = api.get(f"jobs/{job['id']}/").json()
        return data if data["status"] == "succeeded" else None

    data = wait_for(finished, message="the job scheduled over HTTP never succeeded")
    assert data["attempts"] == 1
    assert [(a["number"], a["outcome"], a["worker_id"]) for a in data["history"]] == [
        (1, "succeeded", "http-e2e")
    ]


def test_a_run_at_past_max_schedule_ahead_is_a_400_and_writes_nothing(api: Api) -> None:
    # Year 9999 used to be stored, then broke the admin's date hierarchy.
    response = api.post("jobs/", {"job_type": "tests.scripted", "run_at": "9999-12-31T00:00:00Z"})
    assert_error(response, 400, "invalid", "DELAYJOBS['MAX_SCHEDULE_AHEAD']")
    assert rows() == []


# Job types are private by default; keys may list private ones ---------------------------


class Undeclared(delayjobs.JobType):
    """A job type that says nothing about the HTTP API: private, as every type by default."""

    name = "tests.undeclared"

    def execute(self, job: DelayedJob) -> None:
        return None


@pytest.fixture
def undeclared() -> Iterator[type[Undeclared]]:
    delayjobs.register(Undeclared)
    try:
        yield Undeclared
    finally:
        registry.remove(Undeclared.name)


def test_a_job_type_is_private_unless_it_says_public(
    api: Api, undeclared: type[Undeclared]
) -> None:
    assert Undeclared.public is False
    response = api.post("jobs/", {"job_type": Undeclared.name})
    assert_error(response, 400, "invalid", f"Unknown job type '{Undeclared.name}'.")
    assert not DelayedJob.objects.exists()


def test_a_key_listing_a_private_job_type_may_schedule_it_and_no_other_key(
    client: Client, undeclared: type[Undeclared]
) -> None:
    user = make_user(*ALL_PERMISSIONS)
    listed = Api(client, keys.create_api_key(user, "listed", [Undeclared.name])[1])
    plain = Api(Client(), keys.create_api_key(user, "plain")[1])

    assert listed.post("jobs/", {"job_type": Undeclared.name}).status_code == 201
    assert_error(plain.post("jobs/", {"job_type": Undeclared.name}), 400, "invalid", "Unknown")
    bulk = {"jobs": [{"job_type": SCRIPTED}, {"job_type": Undeclared.name}]}
    assert listed.post("jobs/bulk/", bulk).status_code == 201
    assert plain.post("jobs/bulk/", bulk).status_code == 400
    assert DelayedJob.objects.filter(job_type=Undeclared.name).count() == 2


def test_a_key_may_list_only_registered_job_types() -> None:
    user = make_user()
    with pytest.raises(ValueError, match="Unknown job types"):
        keys.create_api_key(user, "typo", ["tests.no_such_type"])
    with pytest.raises(CommandError, match="Unknown job types"):
        call_command(
            "create_delay_api_key", "--user", "service", "--name", "x", "--job-type", "nope"
        )
    assert not ApiKey.objects.exists()
    call_command(
        "create_delay_api_key",
        "--user",
        "service",
        "--name",
        "y",
        "--job-type",
        SCRIPTED,
        stdout=StringIO(),
        stderr=StringIO(),
    )
    assert ApiKey.objects.get().job_types == [SCRIPTED]


def test_only_a_superuser_sets_the_job_types_of_a_key_in_the_admin(client: Client) -> None:
    staff = make_user("add_apikey", "change_apikey", "view_apikey", username="staff")
    staff.is_staff = True
    staff.save()
    client.force_login(staff)
    response = client.post(
        reverse("admin:delayjobs_apikey_add"),
        {"user": staff.pk, "name": "mine", "job_types": json.dumps([SCRIPTED])},
    )
    assert "Only a superuser may let a key schedule private job types." in response.content.decode()
    assert not ApiKey.objects.exists()

    client.force_login(User.objects.create_superuser("root", password="x"))
    client.post(
        reverse("admin:delayjobs_apikey_add"),
        {"user": staff.pk, "name": "theirs", "job_types": json.dumps([SCRIPTED])},
    )
    assert ApiKey.objects.get().job_types == [SCRIPTED]


def test_w002_is_silent_for_settings_without_any_urls(settings: Any) -> None:
    # Consumers often run with a settings module of their own, without ROOT_URLCONF.
    from delayjobs.checks import check_http_api

    del settings.ROOT_URLCONF
    assert check_http_api() == []


def test_w002_when_the_api_is_mounted_and_no_job_type_is_public(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from delayjobs.checks import check_http_api

    assert check_http_api() == []  # tests.scripted is public
    for jobtype in registry:
        monkeypatch.setattr(type(jobtype), "public", False)
    assert [message.id for message in check_http_api()] == ["delayjobs.W002"]


# Depth, and errors nobody foresaw: always JSON ------------------------------------------


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_a_payload_nested_past_max_payload_depth_is_a_400_and_writes_nothing(api: Api) -> None:
    deep = api.post("jobs/", {"job_type": SCRIPTED, "payload": {"a": nested(64)}})
    assert_error(deep, 400, "invalid", "DELAYJOBS['MAX_PAYLOAD_DEPTH']", payload="64 levels")
    assert api.post("jobs/", {"job_type": SCRIPTED, "payload": nested(64)}).status_code == 201
    assert DelayedJob.objects.count() == 1


def test_a_body_nested_deeper_than_any_payload_may_be_is_a_json_400(api: Api) -> None:
    for depth in (100, 900, 5000):  # 5000: deeper than Python 3.12's JSON parser goes
        response = api.post("jobs/", raw=b"[" * depth + b"]" * depth)
        assert response["Content-Type"] == JSON
        # "nests ... levels deep", or (where the parser gave up first) "nested too deeply"
        assert_error(response, 400, "malformed", "levels deep" if depth < 1000 else "nest")
    assert rows() == []


def test_an_unexpected_error_is_a_json_500_whose_id_is_in_the_log(
    api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(request: Any) -> Any:
        raise ZeroDivisionError("a bug nobody foresaw")

    monkeypatch.setattr("delayjobs.http.views.authenticate", broken)
    with caplog.at_level(logging.ERROR, logger="delayjobs.http.views"):
        response = api.get("jobs/")
    assert (response.status_code, response["Content-Type"]) == (500, JSON)
    body = response.json()
    assert body["error"] == "server_error" and body["id"] in body["detail"]
    [record] = [r for r in caplog.records if body["id"] in r.getMessage()]
    assert record.exc_info is not None and record.exc_info[0] is ZeroDivisionError
