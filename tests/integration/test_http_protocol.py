"""The HTTP API as HTTP: strict JSON bodies, the size limits, the media type, methods
(405 with Allow, HEAD, OPTIONS), a JSON 404 for every other URL under the mount point,
no caching, and errors of the server (500 with an id in the log, 503 after a deadlock):
always JSON, and a refused request changes nothing."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test import Client
from django.urls import path

from delayjobs.http.auth import MAX_BODY_BYTES, MAX_BULK_BODY_BYTES
from delayjobs.models import DelayedJob, JobStatus
from tests.integration.http_client import (
    BASE,
    CHALLENGE,
    JSON,
    NOTHING,
    SCRIPTED,
    Api,
    assert_error,
    log_entries,
    make_user,
    rows,
)
from tests.integration.test_admin import make_job

pytestmark = pytest.mark.django_db

#: A URLconf without the API (pytest.mark.urls): nothing of it may be reachable then.
urlpatterns = [path("admin/", admin.site.urls)]


@pytest.mark.urls("tests.integration.test_http_protocol")
def test_nothing_is_reachable_unless_mounted(client: Client) -> None:
    for route in ("jobs/", "openapi.json", "jobs/1/"):
        assert client.get(BASE + route).status_code == 404


MALFORMED: dict[str, bytes] = {
    "truncated": b'{"job_type": ',
    "not UTF-8": b'{"job_type": "\xff"}',
    "a name twice": b'{"job_type": "tests.scripted", "job_type": "tests.noop"}',
    "NaN": b'{"job_type": "tests.scripted", "payload": NaN}',
    "Infinity": b'{"job_type": "tests.scripted", "payload": -Infinity}',
    "a delay of 1e400 seconds": b'{"job_type": "tests.scripted", "delay": 1e400}',
    "a number of 5000 digits": b'{"payload": ' + b"9" * 5000 + b"}",
    "nested deeper than a payload may be": b"[" * 100 + b"]" * 100,
    "nested deeper than Python's parser goes": b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("raw", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_body_that_is_not_strict_json_is_400(api: Api, raw: bytes) -> None:
    assert_error(api.post("jobs/", raw=raw), 400, "malformed")
    assert not DelayedJob.objects.exists()


def test_an_empty_body_is_422_where_a_body_is_required(api: Api) -> None:
    assert_error(api.post("jobs/", raw=b""), 422, "invalid")


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"],
)
def test_a_body_that_is_not_json_is_415(api: Api, content_type: str) -> None:
    response = api.post("jobs/", {"job_type": SCRIPTED}, content_type=content_type)
    assert_error(response, 415, "unsupported_media_type")
    assert not DelayedJob.objects.exists()
    response = api.post("jobs/", {"job_type": SCRIPTED}, content_type=f"{JSON}; charset=UTF-8")
    assert response.status_code == 201


def test_a_body_over_the_limit_of_its_operation_is_413(api: Api, settings: Any) -> None:
    one_job = {"job_type": SCRIPTED, "payload": "x" * MAX_BODY_BYTES}
    assert_error(api.post("jobs/", one_job), 413, "too_large")
    # A bulk request may be larger, up to its own limit, when Django's allows it.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = None
    jobs = [{"job_type": SCRIPTED, "payload": "x" * 60_000}] * 20
    assert api.post("jobs/bulk/", {"jobs": jobs}).status_code == 201
    many = [{"job_type": SCRIPTED, "payload": "x" * 60_000}] * (MAX_BULK_BODY_BYTES // 60_000 + 1)
    assert_error(api.post("jobs/bulk/", {"jobs": many}), 413, "too_large")
    # Django's own limit, when smaller, applies too.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = api.post("jobs/bulk/", {"jobs": [{"job_type": SCRIPTED, "payload": "x" * 2000}]})
    assert_error(response, 413, "too_large")
    assert DelayedJob.objects.count() == 20


def test_more_query_fields_than_django_takes_is_a_json_400(api: Api, settings: Any) -> None:
    """Django refuses to parse such a query (TooManyFieldsSent): the API answers in its own
    shape. (Operations without query parameters never parse the query.)"""
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 5
    assert_error(api.get("jobs/", status=["scheduled"] * 6), 400, "malformed")
    assert api.get("jobs/", status=["scheduled"] * 5).status_code == 200


def test_a_wrong_method_is_405_with_allow(api: Api) -> None:
    for method, route, allow in (
        ("PUT", "jobs/", "GET, HEAD, OPTIONS, POST"),
        ("DELETE", "jobs/1/", "GET, HEAD, OPTIONS"),
        ("GET", "jobs/1/cancel/", "OPTIONS, POST"),
        ("PATCH", "jobs/cancel/", "OPTIONS, POST"),
        ("PROPFIND", "jobs/bulk/", "OPTIONS, POST"),
    ):
        response = api.request(method, route)
        assert_error(response, 405, "method_not_allowed")
        assert response["Allow"] == allow


@pytest.mark.parametrize(
    "route", ["", "jobs", "jobs/abc/", "jobs/-1/", "jobs/%D9%A3/", "nope/", "jobs/1/nope/"]
)
def test_a_url_of_no_route_is_a_json_404(api: Api, route: str) -> None:
    """Without APPEND_SLASH's redirect either: a redirected POST would lose its body."""
    for method in ("GET", "POST", "DELETE"):
        response = api.request(method, route)
        assert_error(response, 404, "not_found")
        assert "no-cache" in response["Cache-Control"]
    session = Client(enforce_csrf_checks=True)
    session.force_login(make_user(username="staff", is_staff=True))
    assert_error(Api(session).post("nope/", {}), 404, "not_found")


def test_head_is_answered_as_get_and_options_with_allow(api: Api, client: Client) -> None:
    job = make_job()
    for route in ("jobs/", f"jobs/{job.pk}/", "openapi.json"):
        get, head = api.get(route), api.request("HEAD", route)
        assert (head.status_code, get.status_code) == (200, 200)
        assert head["Content-Type"] == get["Content-Type"]
    unauthenticated = Api(client).request("HEAD", "jobs/")
    assert (unauthenticated.status_code, unauthenticated["WWW-Authenticate"]) == (401, CHALLENGE)
    assert api.request("HEAD", "jobs/cancel/")["Allow"] == "OPTIONS, POST"
    # Without a key: the methods of a URL are no secret (the document is public too).
    for route, allow in (
        ("jobs/", "GET, HEAD, OPTIONS, POST"),
        (f"jobs/{job.pk}/retry/", "OPTIONS, POST"),
    ):
        response = Api(client).request("OPTIONS", route)
        assert (response.status_code, response["Allow"]) == (204, allow)


def test_replies_are_never_cached(api: Api) -> None:
    job = make_job()
    for response in (
        api.get(f"jobs/{job.pk}/"),
        api.post(f"jobs/{job.pk}/cancel/"),
        api.post("jobs/", {"job_type": 5}),
        api.request("PUT", "jobs/"),
    ):
        assert "no-store" in response["Cache-Control"], response


def test_an_unexpected_error_is_a_json_500_whose_id_is_in_the_log(
    api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any) -> Any:
        raise ZeroDivisionError("a bug nobody foresaw")

    monkeypatch.setattr("delayjobs.http.schemas.job_json", broken)
    make_job()
    with caplog.at_level(logging.ERROR, logger="delayjobs.http.errors"):
        response = api.get("jobs/")
    body = assert_error(response, 500, "server_error")
    assert body["id"] in body["detail"]
    [record] = [r for r in caplog.records if body["id"] in r.getMessage()]
    assert record.exc_info is not None and record.exc_info[0] is ZeroDivisionError


@contextmanager
def failing_audit_log(sqlstate: str) -> Iterator[None]:
    """Every insert into the admin's log raises a PostgreSQL error with ``sqlstate``: the
    last write of every writing operation fails, after its changes to the jobs."""
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
            assert_error(response, 503, "try_again")
            assert response["Retry-After"] == "1"
            assert rows() == before, route
            assert log_entries() == []
            assert callbacks == []  # nothing for Redis either
    # Any other database error is not the client's to retry: a JSON 500, logged with its id.
    with failing_audit_log("55P03"):  # lock_not_available
        assert_error(api.post("jobs/", {"job_type": SCRIPTED}), 500, "server_error")
    assert rows() == before
    # Sent again, once the database lets it through, each passes.
    for route, body in writes[:2]:
        with django_capture_on_commit_callbacks() as callbacks:
            assert api.post(route, body).status_code == 201
        assert callbacks  # its jobs go to Redis once it commits
    assert len(log_entries()) == 3
