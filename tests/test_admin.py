"""The admin: history with filters and search, attempts inline, a permission-gated retry."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

import delayjobs
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:delayjobs_delayedjob_changelist"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "tests/delay_jobs.py", line 42, in execute\n'
    "tests.delay_jobs.ScriptedFailure: scripted failure of job on attempt 2"
)


def changelist_url(**query: str) -> str:
    url = reverse(CHANGELIST)
    if query:
        url += "?" + "&".join(f"{name}={value}" for name, value in query.items())
    return url


def listed(response) -> list[int]:
    assert response.status_code == 200
    return sorted(job.pk for job in response.context["cl"].result_list)


def make_job(status: str = JobStatus.SCHEDULED, **kwargs) -> DelayedJob:
    job = delayjobs.schedule(kwargs.pop("job_type", "tests.scripted"), **kwargs)
    if status != JobStatus.SCHEDULED:
        DelayedJob.objects.filter(pk=job.pk).update(
            status=status, attempts=2, finished_at=timezone.now()
        )
        job.refresh_from_db()
    return job


def failed_with_history() -> DelayedJob:
    job = make_job(JobStatus.FAILED, key="order:42")
    started = timezone.now() - timedelta(minutes=1)
    for number, outcome in ((1, AttemptOutcome.RETRYING), (2, AttemptOutcome.FAILED)):
        JobAttempt.objects.create(
            job=job,
            number=number,
            worker_id="host:123:abc",
            started_at=started + timedelta(seconds=number),
            finished_at=started + timedelta(seconds=number, milliseconds=5),
            outcome=outcome,
            error=f"ScriptedFailure: attempt {number} <failed>",
            traceback=TRACEBACK if number == 2 else "",
            lateness=timedelta(milliseconds=3),
        )
    DelayedJob.objects.filter(pk=job.pk).update(last_error="ScriptedFailure: attempt 2")
    return job


def staff_client(client, *permissions: str):
    user = User.objects.create_user("staff", password="x", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="delayjobs", codename=codename)
        )
    client.force_login(user)
    return client


def post_retry(client, jobs: list[DelayedJob]):
    return client.post(
        changelist_url(),
        {"action": "retry_jobs", "_selected_action": [str(job.pk) for job in jobs]},
        follow=True,
    )


def message_texts(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


# The changelist ----------------------------------------------------------------------


def test_changelist_lists_jobs_with_the_filters(admin_client):
    jobs = [make_job(), make_job(JobStatus.FAILED), make_job(job_type="tests.noop")]
    response = admin_client.get(changelist_url())
    assert listed(response) == sorted(job.pk for job in jobs)
    filters = [spec.title for spec in response.context["cl"].filter_specs]
    assert [str(title) for title in filters] == ["status", "job type", "queue"]


def test_changelist_filters_by_status_job_type_and_queue(admin_client):
    scheduled = make_job()
    failed = make_job(JobStatus.FAILED)
    noop = make_job(job_type="tests.noop")
    assert listed(admin_client.get(changelist_url(status__exact="failed"))) == [failed.pk]
    assert listed(admin_client.get(changelist_url(job_type__exact="tests.noop"))) == [noop.pk]
    assert listed(admin_client.get(changelist_url(queue__exact="default"))) == sorted(
        [scheduled.pk, failed.pk]
    )


def test_changelist_searches_by_exact_key(admin_client):
    wanted = make_job(key="order:42")
    make_job(key="order:421")
    make_job(key="meeting:42:start")
    assert listed(admin_client.get(changelist_url(q="order:42"))) == [wanted.pk]


def test_changelist_searches_by_id(admin_client):
    jobs = [make_job() for _ in range(3)]
    assert listed(admin_client.get(changelist_url(q=str(jobs[1].pk)))) == [jobs[1].pk]
    assert listed(admin_client.get(changelist_url(q=f"%23{jobs[2].pk}"))) == [jobs[2].pk]


def test_changelist_search_for_nothing_matching_lists_nothing(admin_client):
    make_job(key="order:1")
    assert listed(admin_client.get(changelist_url(q="order:2"))) == []


def test_admin_offers_no_add_and_no_delete(admin_client):
    job = make_job()
    response = admin_client.get(changelist_url())
    assert response.context["has_add_permission"] is False
    assert "delete_selected" not in response.content.decode()
    assert admin_client.get(reverse("admin:delayjobs_delayedjob_add")).status_code == 403
    delete_url = reverse("admin:delayjobs_delayedjob_delete", args=[job.pk])
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403
    assert DelayedJob.objects.filter(pk=job.pk).exists()


# The detail page ---------------------------------------------------------------------


def test_detail_page_shows_the_payload_and_every_attempt_with_its_traceback(admin_client):
    job = failed_with_history()
    DelayedJob.objects.filter(pk=job.pk).update(payload={"order_id": 42})
    response = admin_client.get(reverse("admin:delayjobs_delayedjob_change", args=[job.pk]))
    assert response.status_code == 200
    content = response.content.decode()
    assert "&quot;order_id&quot;: 42" in content
    assert "ScriptedFailure: attempt 1 &lt;failed&gt;" in content  # escaped, not markup
    assert "ScriptedFailure: attempt 2 &lt;failed&gt;" in content
    assert "most recent call last" in content
    assert "tests.delay_jobs.ScriptedFailure: scripted failure of job on attempt 2" in content
    [inline] = response.context["inline_admin_formsets"]
    assert len(inline.formset.queryset) == 2


# The retry action --------------------------------------------------------------------


def test_retry_action_retries_failed_jobs_and_skips_the_others(admin_client):
    failed = failed_with_history()
    cancelled = make_job(JobStatus.CANCELLED)
    scheduled = make_job()
    running = make_job(JobStatus.RUNNING)

    response = post_retry(admin_client, [failed, cancelled, scheduled, running])

    assert response.status_code == 200
    texts = message_texts(response)
    assert "2 jobs scheduled to run again." in texts
    assert any(text.startswith("2 jobs skipped") for text in texts)
    statuses = dict(DelayedJob.objects.values_list("pk", "status"))
    assert statuses[failed.pk] == JobStatus.SCHEDULED
    assert statuses[cancelled.pk] == JobStatus.SCHEDULED
    assert statuses[scheduled.pk] == JobStatus.SCHEDULED
    assert statuses[running.pk] == JobStatus.RUNNING
    failed.refresh_from_db()
    assert failed.attempts == 0
    assert failed.history.count() == 2  # history kept


def test_retry_action_reports_a_job_whose_key_was_taken(admin_client):
    failed = failed_with_history()
    holder = make_job(key="order:42")
    response = post_retry(admin_client, [failed])
    texts = message_texts(response)
    assert "0 jobs scheduled to run again." in texts
    assert any(f"#{failed.pk}" in text and "order:42" in text for text in texts)
    assert DelayedJob.objects.get(pk=failed.pk).status == JobStatus.FAILED
    assert DelayedJob.objects.get(pk=holder.pk).status == JobStatus.SCHEDULED


# Permissions -------------------------------------------------------------------------


def test_view_permission_alone_shows_the_list_without_the_retry_action(client):
    job = make_job(JobStatus.FAILED)
    staff = staff_client(client, "view_delayedjob")
    response = staff.get(changelist_url())
    assert listed(response) == [job.pk]
    assert "retry_jobs" not in response.content.decode()
    detail = staff.get(reverse("admin:delayjobs_delayedjob_change", args=[job.pk]))
    assert detail.status_code == 200


def test_staff_without_the_retry_permission_cannot_post_the_action(client):
    job = make_job(JobStatus.FAILED)
    staff = staff_client(client, "view_delayedjob")
    response = post_retry(staff, [job])
    assert response.status_code == 200
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.FAILED
    assert not any("run again" in text for text in message_texts(response))


def test_staff_with_the_retry_permission_gets_the_action(client):
    job = make_job(JobStatus.FAILED)
    staff = staff_client(client, "view_delayedjob", "retry_delayedjob")
    assert "retry_jobs" in staff.get(changelist_url()).content.decode()
    post_retry(staff, [job])
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SCHEDULED


def test_staff_without_view_permission_is_refused(client):
    make_job()
    staff = staff_client(client)
    assert staff.get(changelist_url()).status_code == 403


def test_search_for_a_number_beyond_any_id_lists_nothing(admin_client):
    make_job(key="order:1")
    assert listed(admin_client.get(changelist_url(q="9" * 30))) == []
