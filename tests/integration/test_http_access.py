"""Who may call the HTTP API: API keys (401 for every bad one, before any query for junk),
staff sessions with CSRF, and the permissions of each operation, checked before the body
is read."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from delayjobs import api_keys as keys
from delayjobs.models import ApiKey, DelayedJob, JobStatus
from tests.integration.http_client import (
    ALL_PERMISSIONS,
    BASE,
    CHALLENGE,
    JSON,
    NOTHING,
    SCRIPTED,
    Api,
    assert_error,
    documented_operation,
    key_of,
    log_entries,
    make_user,
    rows,
)
from tests.integration.test_admin import make_job

pytestmark = pytest.mark.django_db


# API keys ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [None, "Token abc", "Bearer", "Bearer a b", "Bearer not-a-key", "Bearer dj_000000000000_x"],
)
def test_requests_without_a_valid_key_are_401(client: Client, authorization: str | None) -> None:
    make_user(*ALL_PERMISSIONS)
    headers = {"authorization": authorization} if authorization else {}
    for method, route, body in (("GET", "jobs/", NOTHING), ("POST", "jobs/", {"job_type": "x"})):
        response = Api(client).request(method, route, body, headers=headers)
        assert_error(response, 401, "not_authenticated")
        assert response["WWW-Authenticate"] == CHALLENGE
    assert not DelayedJob.objects.exists()


def test_a_wrong_secret_a_revoked_key_and_an_inactive_user_are_401(client: Client) -> None:
    user = make_user(*ALL_PERMISSIONS)
    key, plaintext = keys.create_api_key(user, "svc")
    assert Api(client, plaintext).get("jobs/").status_code == 200
    prefix, secret = keys.split_key(plaintext) or ("", "")
    forged = f"dj_{prefix}_{secret[:-1]}{'A' if secret[-1] != 'A' else 'B'}"
    assert_error(Api(client, forged).get("jobs/"), 401, "not_authenticated")
    ApiKey.objects.filter(pk=key.pk).update(is_active=False)
    assert_error(Api(client, plaintext).get("jobs/"), 401, "not_authenticated")
    ApiKey.objects.filter(pk=key.pk).update(is_active=True)
    User.objects.filter(pk=user.pk).update(is_active=False)
    assert_error(Api(client, plaintext).get("jobs/"), 401, "not_authenticated")


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
    assert_error(response, 401, "not_authenticated")
    assert not [query for query in captured if "apikey" in query["sql"]]


def test_a_bad_key_is_refused_even_with_a_logged_in_session(client: Client) -> None:
    client.force_login(make_user(*ALL_PERMISSIONS, is_staff=True))
    assert Api(client).get("jobs/").status_code == 200
    for header in ("Bearer dj_000000000000_nope", "Basic eDp5"):
        response = Api(client).get("jobs/", headers={"authorization": header})
        assert_error(response, 401, "not_authenticated")


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


# Sessions and CSRF -----------------------------------------------------------------------


def staff_session(*permissions: str) -> tuple[Api, str]:
    """A staff user's session of a client that enforces CSRF, and its CSRF token."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user(*permissions, username="staff", is_staff=True))
    client.get(reverse("admin:index"))  # any page sets the CSRF cookie
    return Api(client), client.cookies["csrftoken"].value


def test_a_session_reads_and_writes_with_a_csrf_token_only() -> None:
    session, token = staff_session(*ALL_PERMISSIONS)
    assert session.get("jobs/").status_code == 200
    assert_error(session.post("jobs/", {"job_type": SCRIPTED}), 403, "csrf_failed")
    assert not DelayedJob.objects.exists()
    response = session.post("jobs/", {"job_type": SCRIPTED}, headers={"x-csrftoken": token})
    assert response.status_code == 201


def test_key_requests_need_no_csrf_token() -> None:
    api = Api(Client(enforce_csrf_checks=True), key_of(make_user(*ALL_PERMISSIONS)))
    assert api.post("jobs/", {"job_type": SCRIPTED}).status_code == 201


def test_an_anonymous_request_and_a_session_of_a_user_who_is_not_staff_are_401(
    client: Client,
) -> None:
    assert_error(Api(client).get("jobs/"), 401, "not_authenticated")
    client.force_login(make_user(*ALL_PERMISSIONS, username="customer"))
    for method, route, body in (("GET", "jobs/", NOTHING), ("POST", "jobs/", {"job_type": "x"})):
        assert_error(Api(client).request(method, route, body), 401, "not_authenticated")
    assert not DelayedJob.objects.exists()
    # A key needs no staff status: a service's user is a plain account.
    keyed = Api(Client(), key_of(make_user(*ALL_PERMISSIONS, username="svc")))
    assert keyed.get("jobs/").status_code == 200


def test_a_session_form_is_refused_as_not_json_whatever_django_makes_of_it(
    settings: Any,
) -> None:
    """The CSRF check reads a form's token from request.POST, which parses the body (or
    refuses to): the reply is still the API's JSON, and nothing changes."""
    session, token = staff_session(*ALL_PERMISSIONS)
    job = make_job(delay=timedelta(hours=1))
    before = rows()
    form = "application/x-www-form-urlencoded"
    cases = [
        (MULTIPART_CONTENT, encode_multipart(BOUNDARY, {"csrfmiddlewaretoken": token}), 415),
        (form, f"csrfmiddlewaretoken={token}".encode(), 415),
        ("multipart/form-data", b"field=1", 400),  # no boundary: Django will not parse it
    ]
    for content_type, raw, status in cases:
        for route in ("jobs/", "jobs/cancel/"):
            response = session.post(route, raw=raw, content_type=content_type)
            assert response.status_code == status, response.json()
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 5
    many = encode_multipart(BOUNDARY, {"field": list(range(6))})
    response = session.post("jobs/", raw=many, content_type=MULTIPART_CONTENT)
    assert_error(response, 400, "malformed")
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    big = f"csrfmiddlewaretoken={token}&field={'x' * 2000}".encode()
    assert_error(session.post("jobs/", raw=big, content_type=form), 413, "too_large")
    assert rows() == before
    assert log_entries() == [] and job.status == JobStatus.SCHEDULED


def test_login_required_middleware_leaves_the_api_to_its_own_authentication(
    client: Client, settings: Any
) -> None:
    """Django's LoginRequiredMiddleware redirects anonymous requests to the login page; a
    key request is anonymous to Django, and a client wants a JSON 401, not a redirect."""
    settings.MIDDLEWARE = [
        *settings.MIDDLEWARE,
        "django.contrib.auth.middleware.LoginRequiredMiddleware",
    ]
    page = client.get(reverse("meetings:list"))
    assert (page.status_code, page["Location"].split("?")[0]) == (302, settings.LOGIN_URL)
    keyed = Api(client, key_of(make_user(*ALL_PERMISSIONS)))
    created = keyed.post("jobs/", {"job_type": SCRIPTED})
    assert keyed.post(f"jobs/{created.json()['id']}/cancel/").status_code == 200
    anonymous = Api(client)
    assert_error(anonymous.get("jobs/"), 401, "not_authenticated")
    assert anonymous.get("openapi.json").status_code == 200
    assert anonymous.request("OPTIONS", "jobs/").status_code == 204
    assert_error(anonymous.get("nowhere/"), 404, "not_found")


# Permissions ---------------------------------------------------------------------------

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
def test_each_operation_needs_its_permissions_and_the_document_names_them(
    client: Client, permissions: tuple[str, ...], request_of: Any, success: int
) -> None:
    job = make_job(key="p")
    if "retry_delayedjob" in permissions:
        DelayedJob.objects.filter(pk=job.pk).update(status=JobStatus.FAILED)
    method, route, body = request_of(job)
    needed = [f"delayjobs.{codename}" for codename in permissions]
    operation = documented_operation(method, f"/delayjobs/api/{route}")
    assert operation is not None and operation["x-permissions"] == needed
    before = rows()
    # Any one of them missing is enough to be refused, whatever else the user may do; for
    # an action, a job that does not exist is no 404 either.
    for missing in permissions:
        others = [codename for codename in ALL_PERMISSIONS if codename != missing]
        without = Api(client, key_of(make_user(*others, username=f"without-{missing}")))
        assert_error(without.request(method, route, body), 403, "permission_denied")
        missing_job = route.replace(str(job.pk), "999999")
        assert_error(without.request(method, missing_job, body), 403, "permission_denied")
        assert rows() == before
    assert log_entries() == []
    with_them = Api(client, key_of(make_user(*permissions, username="with")))
    assert with_them.request(method, route, body).status_code == success


def test_a_superuser_may_do_everything(client: Client) -> None:
    api = Api(client, key_of(User.objects.create_superuser("root", password="x")))
    job = api.post("jobs/", {"job_type": SCRIPTED, "delay": 60}).json()
    assert api.post(f"jobs/{job['id']}/cancel/").status_code == 200


def test_permission_and_size_are_checked_before_the_body_is_read(client: Client) -> None:
    reader = Api(client, key_of(make_user("view_delayedjob")))
    assert_error(reader.post("jobs/", raw=b"not json"), 403, "permission_denied")
    # A declared length over the limit is refused before a byte of the body is read (here
    # there are none: reading would fail).
    key = key_of(make_user("add_delayedjob", username="writer"))
    response = client.generic(
        "POST",
        f"{BASE}jobs/",
        b"",
        content_type=JSON,
        headers={"authorization": f"Bearer {key}"},
        CONTENT_LENGTH=str(2 * 1024 * 1024),
    )
    assert_error(response, 413, "too_large")
