"""The admin: the job list (filters, search, badges, constant queries), the read-only
detail page, the actions and their permissions and log entries, the reschedule page,
pauses, consumers, and the jobs inline on a domain object's own admin page."""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

import delayjobs
from delayjobs import pauses
from delayjobs.models import (
    RETRYABLE_STATUSES,
    AttemptOutcome,
    Consumer,
    DelayedJob,
    JobAttempt,
    JobStatus,
    Pause,
    PauseKind,
)
from sampleproject.meetings.models import Meeting, Room
from sampleproject.orders.models import Order

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:delayjobs_delayedjob_changelist"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "tests/delay_jobs.py", line 42, in execute\n'
    "tests.delay_jobs.ScriptedFailure: scripted failure of job on attempt 2"
)
FUTURE = datetime(2030, 1, 15, 14, 30, tzinfo=UTC)


def changelist_url(**query: str) -> str:
    url = reverse(CHANGELIST)
    if query:
        url += "?" + "&".join(f"{name}={value}" for name, value in query.items())
    return url


def change_url(job: DelayedJob) -> str:
    return reverse("admin:delayjobs_delayedjob_change", args=[job.pk])


def listed(response: Any) -> list[int]:
    assert response.status_code == 200
    return sorted(job.pk for job in response.context["cl"].result_list)


def make_job(status: str = JobStatus.SCHEDULED, **kwargs: Any) -> DelayedJob:
    job = delayjobs.schedule(kwargs.pop("job_type", "tests.scripted"), **kwargs)
    if status != JobStatus.SCHEDULED:
        DelayedJob.objects.filter(pk=job.pk).update(
            status=status, attempts=2, finished_at=timezone.now()
        )
        job.refresh_from_db()
    return job


def failed_with_history(attempts: int = 2) -> DelayedJob:
    job = make_job(JobStatus.FAILED, key="order:42")
    started = timezone.now() - timedelta(minutes=1)
    for number in range(1, attempts + 1):
        last = number == attempts
        JobAttempt.objects.create(
            job=job,
            number=number,
            worker_id="host:123:abc",
            started_at=started + timedelta(seconds=number),
            finished_at=started + timedelta(seconds=number, milliseconds=5),
            outcome=AttemptOutcome.FAILED if last else AttemptOutcome.RETRYING,
            error=f"ScriptedFailure: attempt {number} <failed>",
            traceback=TRACEBACK if last else "",
            lateness=timedelta(milliseconds=3),
        )
    DelayedJob.objects.filter(pk=job.pk).update(last_error=f"ScriptedFailure: attempt {attempts}")
    return job


def staff_client(client: Any, *permissions: str, username: str = "staff") -> Any:
    """``client`` logged in as a staff user with these permissions (codenames)."""
    user = User.objects.create_user(username, password="x", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    return client


def post_action(client: Any, name: str, jobs: list[DelayedJob], **extra: str) -> Any:
    return client.post(
        changelist_url(),
        {"action": name, "_selected_action": [str(job.pk) for job in jobs], **extra},
        follow=True,
    )


def post_retry(client: Any, jobs: list[DelayedJob]) -> Any:
    return post_action(client, "retry_jobs", jobs)


def message_texts(response: Any) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


class Containing(str):
    """Equal to any string containing it: for messages with a variable part."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and str(self) in other

    __hash__ = str.__hash__


def rows() -> dict[int, dict[str, Any]]:
    """Every job row as it is in the database, by id."""
    return {row["id"]: row for row in DelayedJob.objects.values()}


def count_queries(client: Any, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured)


def local_input(moment: datetime) -> str:
    """``moment`` as a datetime-local input sends it: naive, in the current time zone."""
    return timezone.localtime(moment).strftime("%Y-%m-%dT%H:%M:%S")


# The changelist ----------------------------------------------------------------------


def test_changelist_lists_jobs_with_the_filters_and_filters_by_date(admin_client):
    jobs = [make_job(), make_job(JobStatus.FAILED), make_job(job_type="tests.noop")]
    response = admin_client.get(changelist_url())
    assert listed(response) == sorted(job.pk for job in jobs)
    cl = response.context["cl"]
    assert [str(spec.title) for spec in cl.filter_specs] == ["status", "job type", "queue", "due"]
    # No date hierarchy (its SELECT DISTINCT reads the whole table); the dates still filter.
    assert cl.date_hierarchy is None
    year = str(timezone.localtime(jobs[0].run_at).year)
    assert listed(admin_client.get(changelist_url(run_at__year=year))) == listed(response)
    assert listed(admin_client.get(changelist_url(run_at__year="2001"))) == []


def test_changelist_filters_by_status_job_type_and_queue(admin_client):
    scheduled = make_job()
    failed = make_job(JobStatus.FAILED)
    noop = make_job(job_type="tests.noop")
    assert listed(admin_client.get(changelist_url(status__exact="failed"))) == [failed.pk]
    assert listed(admin_client.get(changelist_url(job_type__exact="tests.noop"))) == [noop.pk]
    assert listed(admin_client.get(changelist_url(queue__exact="default"))) == sorted(
        [scheduled.pk, failed.pk]
    )


def test_changelist_filters_by_when_jobs_are_due(admin_client):
    now = timezone.now()
    overdue = make_job(run_at=now - timedelta(hours=2))
    recently_failed = make_job(JobStatus.FAILED, run_at=now - timedelta(minutes=30))
    soon = make_job(run_at=now + timedelta(minutes=30))
    make_job(run_at=now + timedelta(hours=2))
    make_job(JobStatus.SUCCEEDED, run_at=now - timedelta(days=2))
    assert listed(admin_client.get(changelist_url(due="overdue"))) == [overdue.pk]
    assert listed(admin_client.get(changelist_url(due="next_hour"))) == [soon.pk]
    assert listed(admin_client.get(changelist_url(due="last_24h"))) == sorted(
        [overdue.pk, recently_failed.pk]
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


def test_changelist_searches_by_key_prefix(admin_client):
    first = make_job(key="order:42")
    second = make_job(key="order:421")
    make_job(key="meeting:42:start")
    assert listed(admin_client.get(changelist_url(q="order:42*"))) == [first.pk, second.pk]
    assert listed(admin_client.get(changelist_url(q="order:5*"))) == []
    assert listed(admin_client.get(changelist_url(q="*"))) == []  # no prefix: a key "*"


def test_changelist_searches_payload_text_on_every_database(admin_client):
    zoe = make_job(payload={"email": "Zoë@Example.com", "order_id": 987654})
    quoted = make_job(payload={"note": 'say "hi" \\ bye'})
    bob = make_job(payload={"email": "bob@example.com", "order_id": 12})

    def search(term: str) -> list[int]:
        return listed(admin_client.get(changelist_url(), {"q": term}))

    # Case-insensitive, and non-ASCII text matches (SQLite stores it escaped as \u00eb).
    assert search("zoë@example") == []  # a plain word is an id or a key
    assert search("payload:zoë@example") == [zoe.pk]
    assert search("PAYLOAD: zoë@example") == [zoe.pk]
    assert search("payload:987654") == [zoe.pk]
    assert search("987654") == []  # digits without "payload:": ids and keys only
    assert search("#987654") == []  # "#": ids only
    assert search('payload:"order_id": 12') == [bob.pk]
    assert search('payload:"say bye"') == []  # quoted: one term, matched as a whole
    assert search("payload:say hi") == [quoted.pk]
    assert search("payload:say nothing") == []  # every word must match
    assert search("payload:'say \"hi\" \\ bye'") == [quoted.pk]  # quotes and backslash
    assert search("payload:example 987654") == [zoe.pk]
    assert search("payload:nobody@example") == []
    assert search("payload:") == listed(admin_client.get(changelist_url()))  # no words


def test_changelist_search_for_nothing_matching_lists_nothing(admin_client):
    make_job(key="order:1")
    assert listed(admin_client.get(changelist_url(q="order:2"))) == []


def test_search_for_a_number_beyond_any_id_lists_nothing(admin_client):
    make_job(key="order:1")
    assert listed(admin_client.get(changelist_url(q="9" * 30))) == []
    assert listed(admin_client.get(changelist_url(q="%23" + "9" * 30))) == []


def row_html(response: Any, job: DelayedJob) -> str:
    """The changelist's table row of ``job``."""
    content = response.content.decode()
    match = re.search(
        rf'<tr>(?:(?!</tr>).)*href="{re.escape(change_url(job))}"(?:(?!</tr>).)*</tr>',
        content,
        re.DOTALL,
    )
    assert match, f"job {job.pk} is not listed"
    return match.group(0)


def test_changelist_rows_show_status_badges_pauses_lateness_and_objects(admin_client):
    now = timezone.now()
    overdue = make_job(run_at=now - timedelta(seconds=90))
    finished = make_job(JobStatus.SUCCEEDED)
    DelayedJob.objects.filter(pk=finished.pk).update(
        started_at=finished.run_at + timedelta(milliseconds=1500)
    )
    paused_scheduled = make_job(job_type="tests.noop")
    paused_failed = make_job(JobStatus.FAILED, job_type="tests.noop")
    room = Room.objects.create(name="Blue")
    linked = make_job(obj=room)
    gone = make_job(obj=Room.objects.create(name="Gone"))
    Room.objects.filter(name="Gone").delete()
    pauses.pause(queue="other", by="ops")

    response = admin_client.get(changelist_url())

    assert "background: #417690" in row_html(response, overdue)  # scheduled: blue
    assert "background: #2e7d32" in row_html(response, finished)  # succeeded: green
    assert "due 1 min 30 s ago" in row_html(response, overdue)
    assert "1.5 s" in row_html(response, finished)  # started_at - run_at
    # Paused: scheduled jobs of the paused queue only.
    assert ">paused</span>" in row_html(response, paused_scheduled)
    for job in (paused_failed, overdue, finished):
        assert ">paused</span>" not in row_html(response, job)
    room_url = reverse("admin:meetings_room_change", args=[room.pk])
    assert f'<a href="{room_url}">Room: Blue</a>' in row_html(response, linked)
    assert f"Room {gone.object_id} (deleted)" in row_html(response, gone)
    # And the paused queue is named above the list.
    assert "queue <strong>other</strong>" in response.content.decode()


def test_changelist_survives_a_job_linked_to_a_model_that_no_longer_exists(admin_client):
    """A content type whose app was removed: its model_class() is None."""
    from django.contrib.contenttypes.models import ContentType

    removed = ContentType.objects.create(app_label="removed_app", model="thing")
    job = make_job()
    DelayedJob.objects.filter(pk=job.pk).update(content_type=removed, object_id="7")

    response = admin_client.get(changelist_url())

    assert response.status_code == 200
    assert "thing 7" in row_html(response, job)  # its type and id, without a link


def test_changelist_queries_are_the_same_for_5_and_50_jobs(admin_client):
    rooms = [Room.objects.create(name=f"Room {n}") for n in range(3)]
    orders = [Order.objects.create(customer=f"c{n}", total=Decimal("1.00")) for n in range(3)]
    pauses.pause(queue="other")

    def add_jobs(count: int) -> None:
        for n in range(count):
            target = (rooms + orders + [None])[n % 7]
            status = JobStatus.values[n % len(JobStatus.values)]
            make_job(status, job_type=("tests.scripted", "tests.noop")[n % 2], obj=target)

    add_jobs(5)
    admin_client.get(changelist_url())  # warms caches (content types) both runs share
    few = count_queries(admin_client, changelist_url())
    add_jobs(45)
    many = count_queries(admin_client, changelist_url())
    # Plus each order's close job, scheduled by its binding when the order was created.
    assert DelayedJob.objects.count() == 50 + len(orders)
    assert many == few


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


def test_detail_page_shows_the_payload_and_every_attempt_newest_first(admin_client):
    job = failed_with_history()
    DelayedJob.objects.filter(pk=job.pk).update(payload={"order_id": 42, "items": [1, 2]})
    response = admin_client.get(change_url(job))
    assert response.status_code == 200
    content = response.content.decode()
    # Pretty-printed, keys sorted, escaped.
    assert '<pre style="white-space: pre-wrap">{\n  &quot;items&quot;: [\n    1,' in content
    assert "&quot;order_id&quot;: 42\n}</pre>" in content
    assert "ScriptedFailure: attempt 1 &lt;failed&gt;" in content  # escaped, not markup
    newest = content.index("ScriptedFailure: attempt 2 &lt;failed&gt;")
    assert newest < content.index("ScriptedFailure: attempt 1 &lt;failed&gt;")
    assert "most recent call last" in content
    assert "tests.delay_jobs.ScriptedFailure: scripted failure of job on attempt 2" in content
    [inline] = response.context["inline_admin_formsets"]
    assert [attempt.number for attempt in inline.formset.queryset] == [2, 1]


def test_times_read_to_the_millisecond_on_a_job_page_and_to_the_second_in_the_list(
    admin_client,
):
    job = failed_with_history(attempts=1)
    run_at = datetime(2026, 1, 31, 13, 5, 9, 42_500, tzinfo=UTC)
    DelayedJob.objects.filter(pk=job.pk).update(
        run_at=run_at,
        claimed_at=run_at - timedelta(milliseconds=20),
        started_at=run_at + timedelta(microseconds=412),
    )
    JobAttempt.objects.filter(job=job).update(lateness=timedelta(microseconds=412))
    with timezone.override(zoneinfo.ZoneInfo("Europe/Paris")):
        content = admin_client.get(change_url(job)).content.decode()
        listing = row_html(admin_client.get(changelist_url()), job)
    assert "2026-01-31 14:05:09.042 CET" in content  # run_at, in the current time zone
    assert "2026-01-31 14:05:09.022 CET" in content  # the claim, 20 ms before
    assert "0.4 ms" in content  # the job's lateness and its attempt's, from the start
    assert "0:00:00.000412" not in content
    assert "2026-01-31 14:05:09+01:00" in listing and ".042" not in listing


def test_detail_page_is_read_only_even_for_a_superuser(admin_client):
    job = make_job(payload={"order_id": 42}, key="order:42")
    response = admin_client.get(change_url(job))
    assert response.status_code == 200
    assert response.context["adminform"].form.fields == {}  # nothing is an input
    content = response.content.decode()
    assert 'name="_save"' not in content
    assert "order:42" in content and "tests.scripted" in content
    before = rows()
    admin_client.post(change_url(job), {"key": "changed", "payload": "{}", "_save": "Save"})
    assert rows() == before


def test_detail_page_queries_are_the_same_for_2_and_20_attempts(admin_client):
    few_job = failed_with_history(2)
    admin_client.get(change_url(few_job))
    few = count_queries(admin_client, change_url(few_job))
    DelayedJob.objects.filter(pk=few_job.pk).update(key=None)  # frees "order:42"
    many_job = failed_with_history(20)
    assert count_queries(admin_client, change_url(many_job)) == few


# Actions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ActionCase:
    name: str
    permission: str
    applies_to: tuple[str, ...]
    logged: str  # what its admin log entry says
    #: Extra POST data (the reschedule page's answer), as a function of nothing.
    extra: Callable[[], dict[str, str]] = dict
    #: Checks a job it changed, given the row before.
    check: Callable[[dict[str, Any], dict[str, Any]], None] = field(default=lambda b, a: None)


def check_retried(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert (after["status"], after["attempts"]) == (JobStatus.SCHEDULED, 0)


def check_run_now(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert after["status"] == JobStatus.SCHEDULED
    assert after["run_at"] <= timezone.now() < before["run_at"]


def check_cancelled(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert after["status"] == JobStatus.CANCELLED


def check_rescheduled(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert (after["status"], after["run_at"]) == (JobStatus.SCHEDULED, FUTURE)


ACTIONS = [
    ActionCase(
        "retry_jobs", "retry_delayedjob", RETRYABLE_STATUSES, "Retried", check=check_retried
    ),
    ActionCase(
        "run_jobs_now", "run_now_delayedjob", (JobStatus.SCHEDULED,), "Run now", check=check_run_now
    ),
    ActionCase(
        "cancel_jobs",
        "cancel_delayedjob",
        (JobStatus.SCHEDULED,),
        "Cancelled",
        check=check_cancelled,
    ),
    ActionCase(
        "reschedule_jobs",
        "reschedule_delayedjob",
        (JobStatus.SCHEDULED,),
        "Rescheduled",
        extra=lambda: {"post": "yes", "run_at": local_input(FUTURE)},
        check=check_rescheduled,
    ),
]
ACTION_IDS = [case.name for case in ACTIONS]


def one_job_per_status() -> list[DelayedJob]:
    # Due in an hour: "run now" visibly moves a scheduled one.
    return [make_job(status, delay=timedelta(hours=1)) for status in JobStatus.values]


@pytest.mark.parametrize("case", ACTIONS, ids=ACTION_IDS)
def test_an_action_changes_only_the_jobs_it_applies_to_and_logs_each(client, case: ActionCase):
    jobs = one_job_per_status()
    staff = staff_client(client, "view_delayedjob", case.permission, username="operator")
    before = rows()

    response = post_action(staff, case.name, jobs, **case.extra())

    applies = [job.pk for job in jobs if job.status in case.applies_to]
    skipped = len(jobs) - len(applies)
    assert message_texts(response) == [Containing(f": {len(applies)} changed, {skipped} skipped.")]
    after = rows()
    for job in jobs:
        if job.pk in applies:
            case.check(before[job.pk], after[job.pk])
        else:
            assert after[job.pk] == before[job.pk], f"{job.status} job changed"
    entries = LogEntry.objects.filter(
        content_type=ContentType.objects.get_for_model(DelayedJob), action_flag=CHANGE
    )
    assert sorted(int(entry.object_id) for entry in entries) == sorted(applies)
    for entry in entries:
        assert entry.user.username == "operator"
        assert case.logged in entry.get_change_message()


@pytest.mark.parametrize("case", ACTIONS, ids=ACTION_IDS)
def test_an_action_is_hidden_and_refused_without_its_own_permission(client, case: ActionCase):
    jobs = one_job_per_status()
    others = [action.permission for action in ACTIONS if action is not case]
    staff = staff_client(client, "view_delayedjob", *others)
    response = staff.get(changelist_url())
    offered = {value for value, _label in response.context["action_form"].fields["action"].choices}
    assert case.name not in offered
    assert offered >= {action.name for action in ACTIONS if action is not case}
    before = rows()
    # A forged POST, with the reschedule page's answer too.
    response = post_action(staff, case.name, jobs, **case.extra())
    assert response.status_code == 200
    assert rows() == before
    assert not LogEntry.objects.exists()


def test_retry_action_keeps_the_history(admin_client):
    failed = failed_with_history()
    post_retry(admin_client, [failed])
    failed.refresh_from_db()
    assert (failed.status, failed.attempts) == (JobStatus.SCHEDULED, 0)
    assert failed.history.count() == 2


def test_retry_action_reports_a_job_whose_key_was_taken(admin_client):
    failed = failed_with_history()
    holder = make_job(key="order:42")
    response = post_retry(admin_client, [failed])
    [text] = message_texts(response)
    assert text.startswith("Retry: 0 changed, 1 skipped.")
    assert f"#{failed.pk}" in text and "order:42" in text
    assert DelayedJob.objects.get(pk=failed.pk).status == JobStatus.FAILED
    assert DelayedJob.objects.get(pk=holder.pk).status == JobStatus.SCHEDULED
    assert not LogEntry.objects.exists()


def test_view_permission_alone_shows_the_list_without_any_action(client):
    job = make_job(JobStatus.FAILED)
    staff = staff_client(client, "view_delayedjob")
    response = staff.get(changelist_url())
    assert listed(response) == [job.pk]
    content = response.content.decode()
    assert not any(case.name in content for case in ACTIONS)
    assert staff.get(change_url(job)).status_code == 200


def test_staff_without_view_permission_is_refused(client):
    make_job()
    staff = staff_client(client)
    assert staff.get(changelist_url()).status_code == 403
    assert staff.get(reverse("admin:delayjobs_delayedjob_dashboard")).status_code == 403


def test_the_changelist_links_to_the_dashboard(client):
    staff = staff_client(client, "view_delayedjob")
    dashboard = reverse("admin:delayjobs_delayedjob_dashboard")
    assert f'href="{dashboard}"' in staff.get(changelist_url()).content.decode()
    assert staff.get(dashboard).status_code == 200


# The reschedule page -----------------------------------------------------------------


@pytest.fixture
def rescheduler(client: Any) -> Any:
    return staff_client(client, "view_delayedjob", "reschedule_delayedjob")


def test_reschedule_asks_for_the_new_time_first_and_changes_nothing(rescheduler):
    jobs = [make_job(), make_job(), make_job(JobStatus.FAILED)]
    before = rows()
    response = post_action(rescheduler, "reschedule_jobs", jobs)
    assert response.status_code == 200
    assert response.templates[0].name == "admin/delayjobs/delayedjob/reschedule_selected.html"
    content = response.content.decode()
    assert 'type="datetime-local"' in content
    assert "3 jobs selected, 2 of them scheduled" in " ".join(content.split())
    for job in jobs:
        assert f'name="_selected_action" value="{job.pk}"' in content
    assert 'name="post" value="yes"' in content
    assert f'href="{changelist_url()}" class="button cancel-link"' in content
    assert rows() == before


@pytest.mark.parametrize(
    ("run_at", "error"),
    [
        (lambda: local_input(timezone.now() - timedelta(hours=1)), "is in the past"),
        (lambda: "next tuesday", "Enter a valid date/time."),
        (lambda: "", "This field is required."),
        # Clocks jump from 2:00 to 3:00 that night: this time does not exist there.
        (lambda: "2030-03-10T02:30", "couldn\u2019t be interpreted in time zone America/New_York"),
    ],
    ids=["past", "not-a-time", "empty", "nonexistent"],
)
def test_reschedule_with_a_bad_time_shows_the_error_and_changes_nothing(
    rescheduler, settings, run_at: Callable[[], str], error: str
):
    settings.TIME_ZONE = "America/New_York"
    job = make_job(delay=timedelta(hours=1))
    before = rows()
    response = post_action(rescheduler, "reschedule_jobs", [job], post="yes", run_at=run_at())
    assert response.status_code == 200
    assert response.context["form"].errors["run_at"] == [Containing(error)]
    assert 'class="errorlist' in response.content.decode()
    assert rows() == before
    assert not LogEntry.objects.exists()


def test_reschedule_reads_the_time_in_the_current_time_zone(rescheduler, settings):
    settings.TIME_ZONE = "America/New_York"
    scheduled, failed = make_job(), make_job(JobStatus.FAILED)
    response = post_action(
        rescheduler, "reschedule_jobs", [scheduled, failed], post="yes", run_at="2030-01-15T09:30"
    )
    assert message_texts(response) == [
        "Reschedule: 1 changed, 1 skipped. Only scheduled jobs can be rescheduled."
    ]
    # 09:30 in New York in January is 14:30 UTC.
    assert DelayedJob.objects.get(pk=scheduled.pk).run_at == FUTURE
    assert DelayedJob.objects.get(pk=failed.pk).run_at == failed.run_at
    [entry] = LogEntry.objects.all()
    assert entry.object_id == str(scheduled.pk)
    assert "to 2030-01-15T14:30:00+00:00" in entry.get_change_message()


def test_reschedule_keeps_ids_intact_with_thousand_separators(rescheduler, settings):
    """Ids are form values, not numbers to display: 1234 must not become "1,234"."""
    settings.USE_THOUSAND_SEPARATOR = True
    job = make_job(delay=timedelta(hours=1))
    DelayedJob.objects.filter(pk=job.pk).update(id=1234)
    job = DelayedJob.objects.get(pk=1234)

    page = post_action(rescheduler, "reschedule_jobs", [job]).content.decode()
    assert 'name="_selected_action" value="1234"' in page
    response = post_action(
        rescheduler, "reschedule_jobs", [job], post="yes", run_at="2030-01-15T14:30"
    )
    assert response.status_code == 200
    assert DelayedJob.objects.get(pk=1234).run_at == FUTURE


def test_reschedule_to_now_is_accepted(rescheduler):
    job = make_job(delay=timedelta(hours=1))
    # What a datetime-local input with minute precision sends for "now".
    now = timezone.localtime().replace(second=0, microsecond=0)
    post_action(rescheduler, "reschedule_jobs", [job], post="yes", run_at=local_input(now))
    assert DelayedJob.objects.get(pk=job.pk).run_at == now


# Pauses and consumers ----------------------------------------------------------------

PAUSE_ADD = "admin:delayjobs_pause_add"


def test_pausing_a_queue_from_the_admin_records_who_and_shows_its_jobs_paused(client):
    job = make_job(job_type="tests.noop")
    staff = staff_client(client, "view_delayedjob", "view_pause", "add_pause", username="ops")
    response = staff.post(reverse(PAUSE_ADD), {"kind": "queue", "name": "other"}, follow=True)
    assert response.status_code == 200
    [pause] = Pause.objects.all()
    assert (pause.kind, pause.name, pause.paused_by) == (PauseKind.QUEUE, "other", "ops")
    assert pauses.paused().covers("other")
    assert ">paused</span>" in row_html(staff.get(changelist_url()), job)
    [entry] = LogEntry.objects.filter(object_id=str(pause.pk))
    assert entry.user.username == "ops"


@pytest.mark.parametrize(
    ("kind", "name", "error"),
    [
        ("job_type", "tests.nonexistent", "Unknown job type 'tests.nonexistent'"),
        ("queue", "bad queue!", "queue must be 1-100 characters"),
        ("job_type", "tests.noop", "is paused already"),
    ],
    ids=["unknown-job-type", "bad-queue", "already-paused"],
)
def test_a_bad_pause_is_refused_in_the_form(admin_client, kind: str, name: str, error: str):
    pauses.pause(job_type="tests.noop", by="earlier")
    before = list(Pause.objects.values())
    response = admin_client.post(reverse(PAUSE_ADD), {"kind": kind, "name": name})
    assert response.status_code == 200  # the form again, not a redirect
    [message] = response.context["adminform"].form.errors["name"]
    assert error in message
    assert list(Pause.objects.values()) == before


def test_deleting_a_pause_resumes(client):
    pauses.pause(job_type="tests.noop")
    pause = Pause.objects.get()
    staff = staff_client(client, "view_pause", "delete_pause")
    url = reverse("admin:delayjobs_pause_delete", args=[pause.pk])
    assert staff.post(url, {"post": "yes"}, follow=True).status_code == 200
    assert not pauses.paused()


def test_pausing_and_resuming_need_add_and_delete_permissions(client):
    pauses.pause(queue="other")
    pause = Pause.objects.get()
    staff = staff_client(client, "view_pause")
    assert staff.get(reverse("admin:delayjobs_pause_changelist")).status_code == 200
    assert staff.post(reverse(PAUSE_ADD), {"kind": "queue", "name": "x"}).status_code == 403
    url = reverse("admin:delayjobs_pause_delete", args=[pause.pk])
    assert staff.post(url, {"post": "yes"}).status_code == 403
    assert pauses.paused().queues == {"other"}
    assert not Pause.objects.filter(name="x").exists()


def test_consumers_are_listed_read_only(admin_client):
    Consumer.objects.create(
        worker_id="host:1:abc", hostname="host", pid=1, queues=["default"], concurrency=10
    )
    response = admin_client.get(reverse("admin:delayjobs_consumer_changelist"))
    assert response.status_code == 200
    assert "host:1:abc" in response.content.decode()
    assert response.context["has_add_permission"] is False
    assert response.context["action_form"] is None
    assert admin_client.get(reverse("admin:delayjobs_consumer_add")).status_code == 403


# Jobs on their objects ---------------------------------------------------------------


def new_meeting(title: str) -> Meeting:
    room, _created = Room.objects.get_or_create(name="Blue")
    starts = timezone.now() + timedelta(days=1)
    return Meeting.objects.create(
        title=title, room=room, starts_at=starts, ends_at=starts + timedelta(hours=1)
    )


def meeting_url(meeting: Meeting) -> str:
    return reverse("admin:meetings_meeting_change", args=[meeting.pk])


def inline_jobs(response: Any) -> list[int]:
    [formset] = [
        inline.formset
        for inline in response.context["inline_admin_formsets"]
        if inline.formset.model is DelayedJob
    ]
    return [form.instance.pk for form in formset.forms]


def test_the_meeting_admin_page_shows_the_meetings_jobs_newest_first(admin_client):
    meeting, other = new_meeting("Standup"), new_meeting("Retro")
    ours = [
        make_job(obj=meeting, key="standup:extra", payload={"n": 1}),
        make_job(JobStatus.FAILED, obj=meeting),
    ]
    make_job(obj=other)

    response = admin_client.get(meeting_url(meeting))

    assert response.status_code == 200
    shown = inline_jobs(response)
    # The meeting's own jobs (those its signals linked, and ours), newest first.
    assert shown == list(
        DelayedJob.objects.for_object(meeting)
        .order_by("-created_at", "-id")
        .values_list("pk", flat=True)
    )
    assert set(shown) >= {job.pk for job in ours}
    assert not set(shown) & set(DelayedJob.objects.for_object(other).values_list("pk", flat=True))
    content = response.content.decode()
    for job in ours:
        assert f'<a href="{change_url(job)}">#{job.pk}</a>' in content
    assert "standup:extra" in content


def test_the_jobs_inline_needs_the_view_permission_on_jobs(client):
    meeting = new_meeting("Standup")
    make_job(obj=meeting)
    staff = staff_client(client, "view_meeting", "change_meeting")
    response = staff.get(meeting_url(meeting))
    assert response.status_code == 200
    assert not any(
        inline.formset.model is DelayedJob for inline in response.context["inline_admin_formsets"]
    )


def test_the_jobs_inline_queries_are_the_same_for_3_and_30_jobs(admin_client):
    meeting = new_meeting("Standup")
    pauses.pause(job_type="tests.noop")

    def add_jobs(count: int) -> None:
        for n in range(count):
            make_job(
                JobStatus.values[n % 5],
                job_type=("tests.scripted", "tests.noop")[n % 2],
                obj=meeting,
            )

    add_jobs(3)
    admin_client.get(meeting_url(meeting))
    few = count_queries(admin_client, meeting_url(meeting))
    add_jobs(27)
    assert count_queries(admin_client, meeting_url(meeting)) == few


def test_a_meeting_with_jobs_inline_can_still_be_saved(admin_client):
    meeting = new_meeting("Standup")
    job = make_job(obj=meeting)
    before = rows()[job.pk]
    page = admin_client.get(meeting_url(meeting))
    data: dict[str, Any] = {
        "title": "Standup, renamed",
        "room": meeting.room_id,
        "starts_at_0": timezone.localtime(meeting.starts_at).strftime("%Y-%m-%d"),
        "starts_at_1": timezone.localtime(meeting.starts_at).strftime("%H:%M:%S"),
        "ends_at_0": timezone.localtime(meeting.ends_at).strftime("%Y-%m-%d"),
        "ends_at_1": timezone.localtime(meeting.ends_at).strftime("%H:%M:%S"),
        "remind_minutes": meeting.remind_minutes,
        "status": meeting.status,
        "_save": "Save",
    }
    for inline in page.context["inline_admin_formsets"]:
        management = inline.formset.management_form
        data.update(
            {management.add_prefix(name): value for name, value in management.initial.items()}
        )
        for form in inline.formset.initial_forms:
            data[form.add_prefix("id")] = form.instance.pk
    response = admin_client.post(meeting_url(meeting), data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    meeting.refresh_from_db()
    assert meeting.title == "Standup, renamed"
    assert rows()[job.pk] == before
