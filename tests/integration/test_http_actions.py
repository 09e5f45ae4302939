"""Actions on existing jobs over HTTP (cancel, cancel by key, reschedule, retry): what
each changes, the 409 when the job's status forbids it, and the admin log entry of every
change the API makes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, CHANGE
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from delayjobs import api_keys as keys
from delayjobs.models import DelayedJob, JobStatus
from tests.integration.http_client import (
    ALL_PERMISSIONS,
    SCRIPTED,
    Api,
    assert_error,
    log_entries,
    make_user,
    rows,
)
from tests.integration.test_admin import failed_with_history, make_job

pytestmark = pytest.mark.django_db


def test_cancel_a_scheduled_job(api: Api) -> None:
    job = make_job()
    response = api.post(f"jobs/{job.pk}/cancel/")
    assert (response.status_code, response.json()["status"]) == (200, "cancelled")
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED


@pytest.mark.parametrize("status", [JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.CANCELLED])
def test_cancel_of_a_job_that_is_not_scheduled_is_409(api: Api, status: str) -> None:
    job = make_job(status)
    before = rows()
    assert_error(api.post(f"jobs/{job.pk}/cancel/"), 409, "invalid_transition")
    assert rows() == before


def test_cancel_by_key(api: Api) -> None:
    job = make_job(key="order:7:close")
    other = make_job(key="order:8:close")
    response = api.post("jobs/cancel/", {"key": "order:7:close"})
    assert (response.status_code, response.json()["id"]) == (200, job.pk)
    statuses = dict(DelayedJob.objects.values_list("pk", "status"))
    assert statuses == {job.pk: JobStatus.CANCELLED, other.pk: JobStatus.SCHEDULED}


def test_cancel_by_key_without_a_holder_is_404_and_of_a_running_holder_409(api: Api) -> None:
    assert_error(api.post("jobs/cancel/", {"key": "nobody"}), 404, "not_found")
    make_job(JobStatus.RUNNING, key="busy")
    before = rows()
    assert_error(api.post("jobs/cancel/", {"key": "busy"}), 409, "invalid_transition")
    assert rows() == before
    assert_error(api.post("jobs/cancel/", {}), 422, "invalid", "key")
    assert_error(api.post("jobs/cancel/", {"key": "busy", "force": True}), 422, "invalid", "force")


def test_cancel_by_key_refuses_text_the_database_cannot_compare(api: Api) -> None:
    for key in ("a\x00b", "\ud800"):
        assert_error(api.post("jobs/cancel/", {"key": key}), 422, "invalid", "key")


def test_reschedule_to_a_time_or_after_a_delay(api: Api) -> None:
    job = make_job(delay=timedelta(hours=1))
    response = api.post(f"jobs/{job.pk}/reschedule/", {"run_at": "2030-01-15T15:30:00+01:00"})
    assert (response.status_code, response.json()["run_at"]) == (200, "2030-01-15T14:30:00Z")
    before = timezone.now()
    api.post(f"jobs/{job.pk}/reschedule/", {"delay": 30})
    job.refresh_from_db()
    assert before + timedelta(seconds=30) <= job.run_at <= timezone.now() + timedelta(seconds=30)
    # Neither: now, as reschedule() does.
    api.post(f"jobs/{job.pk}/reschedule/", {})
    job.refresh_from_db()
    assert job.run_at <= timezone.now()


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"run_at": "2030-01-15T14:30:00"}, ("run_at",)),
        ({"run_at": 5}, ("run_at",)),
        ({"run_at": "2030-01-15T14:30:00Z", "delay": 1}, ("delay",)),
        ({"delay": -1}, ("delay",)),
        ({"delay": 1e12}, ("delay",)),
        ({"delay": 1, "when": "now"}, ("when",)),
    ],
)
def test_reschedule_refuses_bad_input(
    api: Api, body: dict[str, Any], fields: tuple[str, ...]
) -> None:
    job = make_job(delay=timedelta(hours=1))
    before = rows()
    assert_error(api.post(f"jobs/{job.pk}/reschedule/", body), 422, "invalid", *fields)
    assert rows() == before


def test_reschedule_of_a_finished_job_is_409(api: Api) -> None:
    job = make_job(JobStatus.SUCCEEDED)
    before = rows()
    assert_error(api.post(f"jobs/{job.pk}/reschedule/", {"delay": 5}), 409, "invalid_transition")
    assert rows() == before


def test_retry_a_failed_job_keeps_its_history(api: Api) -> None:
    job = failed_with_history()
    response = api.post(f"jobs/{job.pk}/retry/")
    assert response.status_code == 200
    assert (response.json()["status"], response.json()["attempts"]) == ("scheduled", 0)
    assert len(api.get(f"jobs/{job.pk}/").json()["history"]) == 2


def test_retry_of_a_scheduled_job_or_a_taken_key_is_409(api: Api) -> None:
    scheduled = make_job()
    assert_error(api.post(f"jobs/{scheduled.pk}/retry/"), 409, "invalid_transition")
    failed = make_job(JobStatus.FAILED, key="shared")
    holder = make_job(key="shared")
    before = rows()
    response = api.post(f"jobs/{failed.pk}/retry/")
    assert assert_error(response, 409, "duplicate_key")["existing_id"] == holder.pk
    assert rows() == before


# The audit log ---------------------------------------------------------------------------


def test_every_change_through_the_api_is_in_the_admin_log_with_user_and_key(
    client: Client,
) -> None:
    user = make_user(*ALL_PERMISSIONS, username="billing")
    api = Api(client, keys.create_api_key(user, "billing: order timeouts")[1])
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
