"""Browser tests: Debian's chromium, driven by Playwright, against a live test server.

A staff user finds a failed job, reads its traceback, retries it and sees a consumer run
it; a view-only user is offered no action; the dashboard shows every section, filled by
real jobs run by a real consumer (one still running). Screenshots of these pages
illustrate the README: with ``DELAYJOBS_SCREENSHOTS=1`` they are written to
docs/screenshots/, otherwise to the test's tmp_path (so a CI run leaves the tree alone).

These tests never skip: without chromium or Playwright they fail (tests/run.sh installs
both; Playwright cannot download its own browsers here, so it launches /usr/bin/chromium).
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

import delayjobs
from delayjobs import pauses
from delayjobs.models import Consumer, DelayedJob, JobStatus
from tests.browser.conftest import ASYNC_UNSAFE
from tests.conftest import ConsumerFactory, ConsumerProcess
from tests.consumers import wait_final
from tests.utils import wait_for, wait_listening

try:
    from playwright.sync_api import Page, expect
except ImportError as exc:  # a clear failure, never a skip
    raise ImportError(
        "The browser tests need Playwright for Python: pip install -e '.[test]'"
    ) from exc

pytestmark = [pytest.mark.browser, pytest.mark.subprocess]

PASSWORD = "browser-test-password"
CHANGELIST = "/admin/delayjobs/delayedjob/"
DASHBOARD = "/admin/delayjobs/delayedjob/dashboard/"
FILTERED_BY_FAILED = re.compile(r"/admin/delayjobs/delayedjob/\?status__exact=failed$")
#: Consumer subprocesses keep Django's async-safety check (see ``allow_orm_next_to_playwright``
#: in conftest.py).
CONSUMER_ENV = {ASYNC_UNSAFE: ""}


def staff_user(username: str, *permissions: str) -> User:
    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    for codename in permissions:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="delayjobs", codename=codename)
        )
    return user


def log_in(page: Page, user: User) -> None:
    page.goto("/admin/login/")
    page.locator("#id_username").fill(user.username)
    page.locator("#id_password").fill(PASSWORD)
    page.locator("#login-form [type=submit]").click()
    expect(page).not_to_have_url(re.compile(r"/login/"))
    expect(page.locator("#user-tools")).to_contain_text(re.compile(user.username, re.IGNORECASE))


def consumer(consumer_process: ConsumerFactory, *args: str) -> ConsumerProcess:
    return consumer_process(*args, env=CONSUMER_ENV)


def job_row(page: Page, job: DelayedJob):
    """The changelist row that links to ``job``."""
    link = page.locator(f'a[href*="/delayjobs/delayedjob/{job.pk}/change/"]')
    return page.locator("#result_list tbody tr").filter(has=link)


def jobs_that_ran(consumer_process: ConsumerFactory) -> DelayedJob:
    """Some history, run by a real consumer; returns a job that failed every attempt.

    Its payload is then emptied, as a fix deployed meanwhile would, so that a retry works.
    """
    failing = delayjobs.schedule(
        "tests.scripted", {"fail_attempts": [1, 2, 3]}, key="order:42:close"
    )
    also_failing = delayjobs.schedule(
        "tests.scripted", {"fail_attempts": [1, 2, 3]}, key="meeting:7:remind"
    )
    succeeding = delayjobs.schedule("tests.scripted", {"fail_attempts": [1]}, key="order:43:close")
    delayjobs.schedule("tests.scripted", delay=timedelta(hours=1), key="order:44:close")

    # Not --burst: a burst ends as soon as nothing is due, before the retries' backoff.
    running = consumer(consumer_process, "--worker-id", "browser-test-1")
    finished = (failing.pk, also_failing.pk, succeeding.pk)

    def all_finished() -> bool:
        if running.returncode is not None:
            raise AssertionError(f"consumer exited early:\n{running.output()}")
        return not DelayedJob.objects.filter(
            pk__in=finished, status__in=[JobStatus.SCHEDULED, JobStatus.RUNNING]
        ).exists()

    wait_for(all_finished, message="the jobs did not finish")
    running.send_signal(signal.SIGTERM)
    assert running.wait() == 0, running.output()

    failing.refresh_from_db()
    assert (failing.status, failing.attempts) == (JobStatus.FAILED, 3)
    assert DelayedJob.objects.get(pk=succeeding.pk).status == JobStatus.SUCCEEDED
    DelayedJob.objects.filter(pk=failing.pk).update(payload={})
    return failing


def test_staff_finds_a_failed_job_reads_its_traceback_and_retries_it(
    page: Page, consumer_process: ConsumerFactory, screenshot
):
    job = jobs_that_ran(consumer_process)
    # The attempts inline needs the view permission of JobAttempt too.
    log_in(page, staff_user("operator", "view_delayedjob", "view_jobattempt", "retry_delayedjob"))

    # The changelist, filtered by status "failed" through the filter sidebar.
    page.goto(CHANGELIST)
    expect(job_row(page, job)).to_have_count(1)
    page.locator('#changelist-filter a[href*="status__exact=failed"]').click()
    expect(page).to_have_url(FILTERED_BY_FAILED)
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(2)  # the two jobs that failed, nothing else
    expect(job_row(page, job)).to_contain_text("failed")
    screenshot("admin-changelist.png")

    # The job's page: every attempt, with the traceback of each.
    job_row(page, job).locator(f'a[href*="/{job.pk}/change/"]').first.click()
    expect(page.get_by_text("Traceback (most recent call last)")).to_have_count(3)
    for attempt in (1, 2, 3):
        # The last line of each traceback (the job's "last error" is not qualified).
        failure = f"tests.delay_jobs.ScriptedFailure: scripted failure of job {job.pk}"
        expect(page.get_by_text(f"{failure} on attempt {attempt}")).to_be_visible()
    screenshot("admin-job-detail.png")

    # Back to the list: select the job and run the Retry action.
    page.go_back()
    expect(page).to_have_url(FILTERED_BY_FAILED)
    job_row(page, job).locator('input[name="_selected_action"]').check()
    page.locator('select[name="action"]').select_option("retry_jobs")
    page.locator('button[name="index"]').click()
    # A success message counting one job (its wording is the admin's), and no warning.
    expect(page.locator(".messagelist .success")).to_contain_text(re.compile(r"\b1\b"))
    expect(page.locator(".messagelist li:not(.success)")).to_have_count(0)

    # Scheduled again, and nothing runs it until a consumer does.
    page.goto(CHANGELIST)
    expect(job_row(page, job)).to_contain_text("scheduled")
    burst = consumer(consumer_process, "--burst", "--worker-id", "browser-test-2")
    assert burst.wait() == 0, burst.output()
    page.reload()
    expect(job_row(page, job)).to_contain_text("succeeded")
    job.refresh_from_db()
    assert (job.status, job.worker_id) == (JobStatus.SUCCEEDED, "browser-test-2")


#: A lateness or duration as the admin writes it: "0.4 ms", "18 ms", "1.2 s", "3 min".
HUMAN_DURATION = re.compile(r"^\s*\d+(\.\d)? (ms|s|min|h|d)( \d+ (s|min|h))?\s*$")
#: A moment on a job's page: to the millisecond, in the current time zone.
PRECISE_TIME = re.compile(r"^\s*\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+\s*$")
#: A moment in a list: to the second.
LIST_TIME = re.compile(r"^\s*\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d\s*$")


def test_an_on_time_job_shows_a_lateness_that_is_not_negative_and_times_to_the_millisecond(
    page: Page, consumer_process: ConsumerFactory, redis_client
):
    # Claimed seconds ahead of its run_at, as every job is by CLAIM_AHEAD, then started on
    # time: its lateness counts from the start of its execution, not from its claim.
    env = {**CONSUMER_ENV, "DELAYJOBS_TEST_OVERRIDES": json.dumps({"CLAIM_AHEAD": 5})}
    running = consumer_process("--worker-id", "browser-test-3", env=env)
    wait_listening(redis_client, [running])
    job = delayjobs.schedule("tests.scripted", run_at=timezone.now() + timedelta(seconds=1))
    wait_final([job.pk], [running])
    running.send_signal(signal.SIGTERM)
    assert running.wait() == 0, running.output()
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED and job.claimed_at < job.run_at
    log_in(page, staff_user("viewer", "view_delayedjob", "view_jobattempt"))

    page.goto(CHANGELIST)
    expect(job_row(page, job).locator("td.field-due")).to_have_text(LIST_TIME)
    expect(job_row(page, job).locator("td.field-lateness")).to_have_text(HUMAN_DURATION)

    page.goto(f"{CHANGELIST}{job.pk}/change/")
    lateness = page.locator(".field-lateness .readonly")
    expect(lateness).to_have_text(HUMAN_DURATION)  # a negative one starts with "-"
    for field in ("due_at", "claimed", "started", "finished"):
        expect(page.locator(f".field-{field} .readonly")).to_have_text(PRECISE_TIME)
    attempt = page.locator("td.field-lateness_shown")
    expect(attempt).to_have_count(1)
    expect(attempt).to_have_text(HUMAN_DURATION)  # not "0:00:00.000412"
    expect(page.locator("td.field-started")).to_have_text(PRECISE_TIME)


def test_view_only_staff_is_offered_no_action(page: Page):
    job = delayjobs.schedule("tests.scripted", key="order:42:close")
    DelayedJob.objects.filter(pk=job.pk).update(status=JobStatus.FAILED)
    log_in(page, staff_user("auditor", "view_delayedjob"))

    page.goto(CHANGELIST)
    expect(job_row(page, job)).to_contain_text("failed")
    # Django leaves the select out when no action is allowed; either way, none is offered.
    expect(page.locator('select[name="action"] option:not([value=""])')).to_have_count(0)
    expect(job_row(page, job).locator('input[name="_selected_action"]')).to_have_count(0)


@pytest.fixture
def release_file(consumer_process: ConsumerFactory, tmp_path: Path) -> Iterator[Path]:
    """A file whose existence ends the holds of ``hold_attempts``; created at teardown.

    It needs ``consumer_process`` so that it is torn down first: the held jobs are let go
    before their consumers are stopped, even when the test failed.
    """
    path = tmp_path / "release"
    try:
        yield path
    finally:
        path.touch()


def test_dashboard_draws_the_chart_of_jobs_due_in_the_next_hour(
    page: Page, consumer_process: ConsumerFactory, release_file: Path, screenshot
):
    # Paused before any consumer starts: its jobs stay scheduled, whatever is due.
    assert pauses.pause(job_type="tests.slow_queue", by="operator")
    delayjobs.schedule_many({"job_type": "tests.slow_queue"} for _ in range(2))
    # Due five minutes ago on a queue that no consumer below consumes: overdue.
    overdue = delayjobs.schedule("tests.noop", run_at=timezone.now() - timedelta(minutes=5))
    due = [
        {"job_type": job_type, "delay": timedelta(minutes=minutes)}
        for job_type, minutes_due in (
            ("tests.scripted", (2, 3, 3, 11, 12, 12, 12, 25, 38, 39, 52, 58)),
            ("tests.noop", (3, 7, 12, 30, 31, 44)),
        )
        for minutes in minutes_due
    ]
    delayjobs.schedule_many(due)
    # History, run by a real consumer: three jobs succeed at once, one on its second
    # attempt, one fails all three; then one is held while the page is read.
    succeeding = delayjobs.schedule_many(
        [
            *({"job_type": "tests.scripted", "key": f"invoice:{n}:send"} for n in (101, 102, 103)),
            {
                "job_type": "tests.scripted",
                "payload": {"fail_attempts": [1]},
                "key": "order:43:close",
            },
        ]
    )
    failing = delayjobs.schedule(
        "tests.scripted", {"fail_attempts": [1, 2, 3]}, key="order:42:close"
    )
    # tests.limited is tests.scripted with a time_to_run that outlasts the hold.
    held = delayjobs.schedule(
        "tests.limited",
        {"hold_attempts": [1], "release_file": str(release_file)},
        key="report:2024:build",
    )

    worker_id = "browser-test-dashboard"
    running = consumer(
        consumer_process,
        *("--worker-id", worker_id, "--concurrency", "4"),
        *("--queue", "default", "--queue", "slow"),
    )
    finished = [job.pk for job in (*succeeding, failing)]

    def ran_and_holds() -> bool:
        if running.returncode is not None:
            raise AssertionError(f"consumer exited early:\n{running.output()}")
        return (
            not DelayedJob.objects.filter(
                pk__in=finished, status__in=[JobStatus.SCHEDULED, JobStatus.RUNNING]
            ).exists()
            and DelayedJob.objects.filter(
                pk=held.pk, status=JobStatus.RUNNING, worker_id=worker_id
            ).exists()
            # A heartbeat since the last of the 3 + 2 + 3 executions ended.
            and Consumer.objects.filter(worker_id=worker_id, processed=8).exists()
        )

    wait_for(ran_and_holds, message="the jobs did not run, or the held job is not running")
    assert DelayedJob.objects.get(pk=failing.pk).status == JobStatus.FAILED
    assert set(
        DelayedJob.objects.filter(pk__in=[job.pk for job in succeeding]).values_list(
            "status", flat=True
        )
    ) == {JobStatus.SUCCEEDED}
    log_in(page, staff_user("operator", "view_delayedjob"))

    response = page.goto(DASHBOARD)
    assert response is not None
    assert response.status == 200, f"{DASHBOARD} answered {response.status}"
    assert page.url.endswith(DASHBOARD), f"{DASHBOARD} redirected to {page.url}"

    chart = page.locator("svg#due-next-hour-chart")
    expect(chart).to_be_visible()
    expect(chart.locator("rect")).not_to_have_count(0)
    expect(page.locator("#due-next-hour")).to_contain_text(f"{len(due)} jobs due in the next hour")

    expect(page.locator(f'#overdue a[href*="/delayedjob/{overdue.pk}/change/"]')).to_be_visible()

    paused = page.locator("#paused tbody tr")
    expect(paused).to_have_count(1)
    expect(paused).to_contain_text("job_type")
    expect(paused).to_contain_text("tests.slow_queue")
    expect(paused).to_contain_text("operator")
    slow_queue = page.locator("#by-job-type tbody tr").filter(has_text="tests.slow_queue")
    expect(slow_queue.locator(".paused")).to_be_visible()

    # Attempts 1 and 2 of the failing job and 1 of the job that succeeded on its second.
    failures = page.locator("#failures")
    expect(failures.locator("h2")).to_have_text("4 failed attempts in the last 24 hours")
    expect(failures).to_contain_text("retrying: 3")
    expect(failures).to_contain_text("failed: 1")
    expect(failures.locator("tbody tr")).to_have_count(4)
    last_failure = f"scripted failure of job {failing.pk} on attempt 3"
    expect(failures.locator("tbody tr").filter(has_text=last_failure).locator("td")).to_have_text(
        [
            f"#{failing.pk}",
            "tests.scripted",
            "3",
            "failed",
            re.compile(r"\d"),
            worker_id,
            re.compile(re.escape(last_failure) + "$"),
        ]
    )

    # Every finished attempt: 3 + 2 + 3 (the held one has not finished).
    lateness = page.locator("#lateness")
    expect(lateness).to_contain_text("Start minus due time of 8 attempts started in the last hour")
    expect(lateness.locator("tbody td")).to_have_count(4)
    for cell in lateness.locator("tbody td").all():
        expect(cell).to_have_text(re.compile(r"\d"))  # a duration, not "-"

    consumers = page.locator("#consumers")
    expect(consumers.locator("h2")).to_have_text("1 live consumer")
    row = consumers.locator("tbody tr")
    expect(row).to_have_count(1)
    # worker, host, pid, queues, running / concurrency, processed, last heartbeat, clock
    # offset (this host's, from the database server's, to the millisecond), jobs.
    expect(row.locator("td")).to_have_text(
        [
            worker_id,
            re.compile(r"\S"),
            str(running.pid),
            "default, slow",
            "1 / 4",
            "8",
            re.compile(r"\d"),
            re.compile(r"^-?\d+\.\d{3} s$"),
            f"#{held.pk} tests.limited",
        ]
    )
    expect(row.locator(f'a[href*="/delayedjob/{held.pk}/change/"]')).to_have_text(f"#{held.pk}")
    screenshot("admin-dashboard.png")
