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
import re
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import URLResolver, path, resolve, reverse
from django.utils import timezone
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi

import delayjobs
from delayjobs.http import keys
from delayjobs.http.handlers import MAX_BULK_JOBS, MAX_LIMIT
from delayjobs.http.openapi import MAX_BODY_BYTES, OPERATIONS, build_document, openapi_path
from delayjobs.http.views import Endpoint
from delayjobs.models import ApiKey, AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from sampleproject.meetings.models import Room
from tests.conftest import ConsumerFactory
from tests.test_admin import make_job
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

#: A URLconf without the API (pytest.mark.urls): nothing of it may be reachable then.
urlpatterns = [path("admin/", admin.site.urls)]


# Helpers --------------------------------------------------------------------------------


@functools.cache
def document() -> dict[str, Any]:
    return build_document("http://testserver/delayjobs/api")


def assert_documented(method: str, url: str, response: Any) -> None:
    """The response's status is documented for its operation, and its body matches."""
    match = resolve(urlsplit(url).path)
    assert match.namespace == "delayjobs_api"
    operation = match.func.operations.get(method)
    components = document()["components"]
    if operation is None:
        assert response.status_code == 405
        schema: dict[str, Any] = {"$ref": "#/components/schemas/Error"}
    else:
        responses = document()["paths"][openapi_path(operation.route)][method.lower()]["responses"]
        status = str(response.status_code)
        assert status in responses, f"{method} {url} answered {status}, not documented"
        described = responses[status]
        if "$ref" in described:
            described = components["responses"][described["$ref"].rsplit("/", 1)[1]]
        schema = described["content"][JSON]["schema"]
    assert response["Content-Type"] == JSON
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


@pytest.mark.urls("tests.test_http_api")
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
    for pattern in urls.urlpatterns:
        assert not isinstance(pattern, URLResolver)
        assert isinstance(pattern.callback, Endpoint)
        methods = {method.lower() for method in pattern.callback.operations}
        mounted[openapi_path(str(pattern.pattern))] = methods
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
        {"run_at": "must be an ISO 8601 date and time"},
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
        "max_attempts must be",
        {"max_attempts": "from 1"},
    ),
    "max_attempts fractional": (
        {"job_type": SCRIPTED, "max_attempts": 1.5},
        "max_attempts",
        {"max_attempts": "must be an integer"},
    ),
    "max_lateness zero": (
        {"job_type": SCRIPTED, "max_lateness": 0},
        "max_lateness must be",
        {"max_lateness": "max_lateness must be"},
    ),
    "priority out of range": (
        {"job_type": SCRIPTED, "priority": 101},
        "priority must be an int from -100 to 100",
        {"priority": "-100 to 100"},
    ),
    "priority as text": (
        {"job_type": SCRIPTED, "priority": "high"},
        "priority",
        {"priority": "must be an integer"},
    ),
    "replace without a key": (
        {"job_type": SCRIPTED, "replace": True},
        "replace=True needs a key",
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
    "the same key twice": (
        [{"job_type": SCRIPTED, "key": "k"}, {"job_type": SCRIPTED, "key": "k"}],
        "jobs[1]: key 'k' appears twice in this batch.",
        {"jobs[1].key": "appears twice"},
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
    "limit twice": ({"limit": ["1", "2"]}, {"limit": "Give this parameter once."}),
    "unknown status": ({"status": "done"}, {"status": "must be one of scheduled, running"}),
    "unknown parameter": ({"staus": "failed"}, {"staus": "Unknown query parameter."}),
    "garbage cursor": ({"cursor": "abc"}, {"cursor": "is not a cursor this API gave out"}),
    "object_id alone": ({"object_id": "1"}, {"object_id": "needs object_type"}),
    "unknown model": ({"object_type": "nope.nothing"}, {"object_type": "app_label.model"}),
    "NUL in a filter": ({"key": "a\x00b"}, {"key": "NUL"}),
}


@pytest.mark.parametrize(("query", "fields"), list(LIST_REFUSALS.values()), ids=list(LIST_REFUSALS))
def test_list_refuses_bad_query_parameters(
    api: Api, query: dict[str, Any], fields: dict[str, str]
) -> None:
    assert_error(api.get("jobs/", **query), 400, "invalid", "", **fields)


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
        ("PUT", "jobs/", "POST, GET"),
        ("DELETE", "jobs/1/", "GET"),
        ("GET", "jobs/1/cancel/", "POST"),
        ("PATCH", "jobs/cancel/", "POST"),
        ("POST", "openapi.json", "GET"),
    ):
        response = api.request(method, route)
        assert_error(response, 405, "method_not_allowed", f"{method} is not allowed here")
        assert response["Allow"] == allow


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
        assert response["WWW-Authenticate"] == 'Bearer realm="delayjobs"'
    assert not DelayedJob.objects.exists()


def test_a_wrong_secret_for_a_real_prefix_is_401(client: Client) -> None:
    key = key_of(make_user(*ALL_PERMISSIONS))
    prefix, secret = keys.split_key(key) or ("", "")
    forged = f"dj_{prefix}_{secret[:-1]}{'A' if secret[-1] != 'A' else 'B'}"
    assert_error(Api(client, forged).get("jobs/"), 401, "not_authenticated", "Invalid API key.")


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
    client.force_login(make_user(*ALL_PERMISSIONS))
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


def test_key_requests_need_no_csrf_token() -> None:
    client = Client(enforce_csrf_checks=True)
    response = Api(client, key_of(make_user(*ALL_PERMISSIONS))).post(
        "jobs/", {"job_type": SCRIPTED}
    )
    assert response.status_code == 201


def test_an_anonymous_session_is_401(client: Client) -> None:
    assert_error(Api(client).get("jobs/"), 401, "not_authenticated", "not provided")


# Permissions ----------------------------------------------------------------------------


PERMISSION_CASES = {
    "schedule": ("add_delayedjob", lambda job: ("POST", "jobs/", {"job_type": SCRIPTED}), 201),
    "bulk": (
        "add_delayedjob",
        lambda job: ("POST", "jobs/bulk/", {"jobs": [{"job_type": SCRIPTED}]}),
        201,
    ),
    "list": ("view_delayedjob", lambda job: ("GET", "jobs/", NOTHING), 200),
    "get": ("view_delayedjob", lambda job: ("GET", f"jobs/{job.pk}/", NOTHING), 200),
    "cancel": ("cancel_delayedjob", lambda job: ("POST", f"jobs/{job.pk}/cancel/", NOTHING), 200),
    "cancel by key": ("cancel_delayedjob", lambda job: ("POST", "jobs/cancel/", {"key": "p"}), 200),
    "reschedule": (
        "reschedule_delayedjob",
        lambda job: ("POST", f"jobs/{job.pk}/reschedule/", {"delay": 5}),
        200,
    ),
    "retry": ("retry_delayedjob", lambda job: ("POST", f"jobs/{job.pk}/retry/", NOTHING), 200),
}


@pytest.mark.parametrize(
    ("permission", "request_of", "success"),
    list(PERMISSION_CASES.values()),
    ids=list(PERMISSION_CASES),
)
def test_each_operation_needs_its_permission(
    client: Client, permission: str, request_of: Any, success: int
) -> None:
    job = make_job(key="p")
    if permission == "retry_delayedjob":
        DelayedJob.objects.filter(pk=job.pk).update(status=JobStatus.FAILED)
    method, route, body = request_of(job)
    others = [codename for codename in ALL_PERMISSIONS if codename != permission]
    without = Api(client, key_of(make_user(*others, username="without")))
    before = rows()
    response = without.request(method, route, body)
    assert_error(response, 403, "permission_denied", f"delayjobs.{permission}")
    assert rows() == before
    with_it = Api(client, key_of(make_user(permission, username="with")))
    assert with_it.request(method, route, body).status_code == success


def test_a_superuser_may_do_everything(client: Client) -> None:
    superuser = User.objects.create_superuser("root", password="x")
    api = Api(client, key_of(superuser))
    job = api.post("jobs/", {"job_type": SCRIPTED, "delay": 60}).json()
    assert api.post(f"jobs/{job['id']}/cancel/").status_code == 200


def test_permission_is_checked_before_the_body_is_read(client: Client) -> None:
    reader = Api(client, key_of(make_user("view_delayedjob")))
    response = reader.post("jobs/", raw=b"not json")
    assert_error(response, 403, "permission_denied", "delayjobs.add_delayedjob")


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
