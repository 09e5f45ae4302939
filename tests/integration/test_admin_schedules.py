"""The admin of recurring schedules: the list of code and database schedules with their
next ticks and last outcome, pause and resume (actions and buttons) behind their own
permission, the form of an operator's schedule and its errors, edits that restart the
ticks, and code schedules that are read-only and cannot be deleted while their type recurs.

The recurring job types are registered by fixtures here only: registered in
tests/delay_jobs.py, every other test would get tick jobs.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

import delayjobs
from delayjobs.admin.schedule_columns import format_ticks
from delayjobs.jobtypes import registry
from delayjobs.models import DelayedJob, JobStatus, Schedule, ScheduleSource, jobs_database
from delayjobs.recurring.definitions import (
    add_schedule,
    next_ticks,
    recurrence_of,
    sync_code_schedules,
    tick_key,
)
from delayjobs.recurring.ticks import materialise_schedules
from tests.integration.test_admin import Containing, message_texts, staff_client
from tests.support import schedules as schedule_types
from tests.support.schedules import Nightly, Ticking

#: The fixture that registers Nightly and Ticking for a test.
code_types = schedule_types.code_types

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:delayjobs_schedule_changelist"
ADD = "admin:delayjobs_schedule_add"
#: What an operator of schedules is given.
OPERATOR = (
    "view_schedule",
    "add_schedule",
    "change_schedule",
    "delete_schedule",
    "pause_schedule",
    "view_delayedjob",
)


@pytest.fixture
def operator(client: Any) -> Any:
    return staff_client(client, *OPERATOR, username="ops")


def changelist_url() -> str:
    return reverse(CHANGELIST)


def change_url(schedule: Schedule) -> str:
    return reverse("admin:delayjobs_schedule_change", args=[schedule.pk])


def toggle_url(schedule: Schedule, verb: str) -> str:
    return reverse(f"admin:delayjobs_schedule_{verb}", args=[schedule.pk])


def delete_url(schedule: Schedule) -> str:
    return reverse("admin:delayjobs_schedule_delete", args=[schedule.pk])


def database_schedule(name: str = "reports.daily", **fields: Any) -> Schedule:
    fields = {"job_type": "tests.noop", "interval": timedelta(days=1), **fields}
    return add_schedule(Schedule(name=name, **fields))


def code_schedule(name: str) -> Schedule:
    """The row of a registered recurring type, as the admin's list makes it."""
    sync_code_schedules()
    return Schedule.objects.get(name=name)


def make_ticks() -> None:
    """A pre-loader pass over the next minute: every enabled schedule's ticks as jobs."""
    errors: list[str] = []
    now = timezone.now()
    materialise_schedules(now, now + timedelta(minutes=1), errors)
    assert errors == []


def coming(name: str) -> list[DelayedJob]:
    return list(
        DelayedJob.objects.filter(key__startswith=f"schedule:{name}@", status=JobStatus.SCHEDULED)
    )


def tick_jobs(name: str) -> list[DelayedJob]:
    return list(DelayedJob.objects.filter(key__startswith=f"schedule:{name}@").order_by("run_at"))


def row_html(response: Any, name: str) -> str:
    """The list's row of the schedule called ``name``."""
    assert response.status_code == 200
    html = response.content.decode()
    rows = re.findall(r"<tr[^>]*>.*?</tr>", html, re.DOTALL)
    [row] = [row for row in rows if f">{name}</a>" in row]
    return row


def rows() -> list[dict[str, Any]]:
    return list(Schedule.objects.order_by("pk").values())


def post_action(client: Any, action: str, *schedules: Schedule) -> Any:
    data = {"action": action, "_selected_action": [str(s.pk) for s in schedules]}
    return client.post(changelist_url(), data, follow=True)


# The list ------------------------------------------------------------------------------


def test_the_list_shows_code_and_database_schedules_with_next_ticks_and_last_outcome(
    operator: Any, code_types: None
) -> None:
    assert not Schedule.objects.exists()  # the list makes the code schedules' rows
    daily = database_schedule(payload={"report": 7})
    # The job of its latest tick so far, run: the schedule's last outcome.
    last_tick = recurrence_of(daily).last_at_or_before(timezone.now())
    assert last_tick is not None
    ran = delayjobs.schedule("tests.noop", run_at=last_tick, key=tick_key(daily.name, last_tick))
    DelayedJob.objects.filter(pk=ran.pk).update(status=JobStatus.SUCCEEDED)

    response = operator.get(changelist_url())

    nightly = Schedule.objects.get(name=Nightly.name)
    assert nightly.source == ScheduleSource.CODE
    row = row_html(response, Nightly.name)
    assert '"field-source">code<' in row and '"field-time_zone">Europe/Berlin<' in row
    assert "cron &#x27;0 8 * * MON-FRI&#x27; (Europe/Berlin)" in row
    ticks = next_ticks(nightly, 5)
    assert len(ticks) == 5
    for tick in ticks:  # at 08:00 in Berlin, and in UTC after it
        berlin = tick.astimezone(ZoneInfo("Europe/Berlin"))
        utc = tick.astimezone(UTC).strftime("%H:%M")
        assert f"{berlin:%Y-%m-%d} 08:00 {berlin.tzname()} ({utc} UTC)" in row
    assert "enabled" in row
    assert 'class="field-last_outcome">-</td>' in row  # no tick has run yet

    row = row_html(response, "reports.daily")
    assert '"field-source">database<' in row and '"field-when">every 1d<' in row
    assert '"field-job_type">tests.noop<' in row and '"field-time_zone">-<' in row
    for tick in next_ticks(daily, 5):  # midnight UTC, every day
        assert f"{tick:%Y-%m-%d} 00:00 UTC<" in row
    assert f'href="{reverse("admin:delayjobs_delayedjob_change", args=[ran.pk])}"' in row
    assert ">succeeded</span>" in row
    assert '>once<br><span style="white-space: nowrap">grace 1 min</span>' in row


def connection_of_jobs() -> Any:
    return connections[jobs_database()]


def test_the_list_reads_a_bounded_number_of_queries_per_schedule(operator: Any) -> None:
    database_schedule("reports.one")
    with CaptureQueriesContext(connection_of_jobs()) as one:
        assert operator.get(changelist_url()).status_code == 200
    for n in range(2, 7):
        database_schedule(f"reports.{n}")
    with CaptureQueriesContext(connection_of_jobs()) as six:
        assert operator.get(changelist_url()).status_code == 200
    # The latest ticks' jobs, by their keys: one query per schedule, nothing else.
    assert len(six) - len(one) <= 5


def test_a_paused_schedule_is_listed_paused_since_when_by_whom(
    operator: Any, code_types: None
) -> None:
    sync_code_schedules()
    delayjobs.pause_schedule(Nightly.name, by="night-shift")
    row = row_html(operator.get(changelist_url()), Nightly.name)
    assert ">paused</span> since " in row and " by night-shift" in row
    assert "none while paused" in row


def test_an_operators_schedule_in_the_way_of_a_code_schedule_is_reported(operator: Any) -> None:
    # Made before the type got its recurrence: the code's schedule cannot have the name.
    database_schedule(Ticking.name)
    registry.add(Ticking)
    try:
        response = operator.get(changelist_url())
    finally:
        registry.remove(Ticking.name)
    [message] = message_texts(response)
    assert f"the schedule named {Ticking.name!r} was made in the admin" in message
    assert Schedule.objects.get(name=Ticking.name).source == ScheduleSource.DATABASE


def test_a_schedule_that_cannot_tick_says_why_in_red(operator: Any) -> None:
    database_schedule("reports.orphan", job_type="tests.gone_from_the_code")
    row = row_html(operator.get(changelist_url()), "reports.orphan")
    assert "Unknown job type &#x27;tests.gone_from_the_code&#x27;" in row
    assert "color: #ba2121" in row


# Pause and resume ----------------------------------------------------------------------


def test_the_actions_pause_a_code_schedule_cancelling_its_coming_ticks_and_resume_it(
    operator: Any, code_types: None
) -> None:
    ticking = code_schedule(Ticking.name)
    make_ticks()
    made = coming(Ticking.name)
    assert len(made) >= 5

    response = post_action(operator, "pause_schedules", ticking)
    assert message_texts(response) == [
        "1 schedule paused; the jobs of its coming ticks are cancelled."
    ]
    ticking.refresh_from_db()
    assert (ticking.enabled, ticking.paused_by) == (False, "ops")
    assert ticking.paused_at is not None
    assert coming(Ticking.name) == []
    assert {job.status for job in tick_jobs(Ticking.name)} == {JobStatus.CANCELLED}
    make_ticks()
    assert coming(Ticking.name) == []  # paused: no tick becomes a job
    [entry] = LogEntry.objects.filter(object_id=str(ticking.pk))
    assert (entry.user.username, entry.change_message) == ("ops", "Paused with the admin action.")

    before_resume = timezone.now()
    response = post_action(operator, "resume_schedules", ticking)
    assert message_texts(response) == ["1 schedule resumed: it ticks again from its next tick."]
    ticking.refresh_from_db()
    assert (ticking.enabled, ticking.paused_at, ticking.paused_by) == (True, None, "")
    assert ticking.materialised_until is not None
    assert ticking.materialised_until >= before_resume - timedelta(seconds=1)
    make_ticks()
    assert coming(Ticking.name)  # ticking again, from now on


def test_the_actions_count_schedules_already_in_that_state(operator: Any) -> None:
    running = database_schedule("reports.running")
    paused = database_schedule("reports.paused")
    delayjobs.pause_schedule(paused, by="earlier")
    response = post_action(operator, "pause_schedules", running, paused)
    assert message_texts(response) == [
        "1 schedule paused; the jobs of its coming ticks are cancelled. 1 already paused."
    ]
    assert Schedule.objects.get(name="reports.paused").paused_by == "earlier"  # unchanged
    response = post_action(operator, "pause_schedules", running, paused)
    assert message_texts(response) == ["2 already paused."]
    response = post_action(operator, "resume_schedules", running)
    assert message_texts(response) == ["1 schedule resumed: it ticks again from its next tick."]
    response = post_action(operator, "resume_schedules", running)
    assert message_texts(response) == ["1 not paused."]


def test_the_buttons_on_a_schedules_page_pause_and_resume_it(
    operator: Any, code_types: None
) -> None:
    ticking = code_schedule(Ticking.name)
    make_ticks()
    page = operator.get(change_url(ticking))
    assert page.status_code == 200
    html = page.content.decode()
    assert f'action="{toggle_url(ticking, "pause")}"' in html
    assert 'name="pause"' in html and 'name="resume"' not in html

    assert operator.get(toggle_url(ticking, "pause")).status_code == 405  # POST only
    assert Schedule.objects.get(pk=ticking.pk).enabled

    response = operator.post(toggle_url(ticking, "pause"), follow=True)
    assert response.redirect_chain == [(change_url(ticking), 302)]
    assert message_texts(response) == [
        f"The schedule {Ticking.name} is paused; the jobs of its coming ticks are cancelled."
    ]
    assert coming(Ticking.name) == []
    html = response.content.decode()
    assert f'action="{toggle_url(ticking, "resume")}"' in html
    assert " by ops" in html

    response = operator.post(toggle_url(ticking, "resume"), follow=True)
    assert message_texts(response) == [
        f"The schedule {Ticking.name} is resumed: it ticks again from its next tick."
    ]
    assert Schedule.objects.get(pk=ticking.pk).enabled
    # An operator's schedule has them too, outside its form.
    daily = database_schedule()
    html = operator.get(change_url(daily)).content.decode()
    assert html.index(f'action="{toggle_url(daily, "pause")}"') < html.index('id="schedule_form"')


@pytest.mark.parametrize(
    "granted",
    [
        ("view_schedule",),
        ("view_schedule", "add_schedule", "change_schedule", "delete_schedule"),
    ],
    ids=["view-only", "all-but-pause"],
)
def test_without_the_pause_permission_nothing_is_offered_and_a_forged_post_is_refused(
    client: Any, code_types: None, granted: tuple[str, ...]
) -> None:
    ticking = code_schedule(Ticking.name)
    daily = database_schedule()
    make_ticks()
    staff = staff_client(client, *granted)
    response = staff.get(changelist_url())
    assert response.status_code == 200
    assert response.context["action_form"] is None  # no action, no checkboxes
    assert 'name="_selected_action"' not in response.content.decode()
    for schedule in (ticking, daily):
        page = staff.get(change_url(schedule))
        assert page.status_code == 200
        assert "schedule_toggle" not in page.context
        assert "/pause/" not in page.content.decode()
    before, jobs_before = rows(), tick_jobs(Ticking.name)

    post_action(staff, "pause_schedules", ticking, daily)
    assert staff.post(toggle_url(ticking, "pause")).status_code == 403
    assert staff.post(toggle_url(daily, "pause")).status_code == 403
    assert rows() == before
    assert [(j.pk, j.status) for j in tick_jobs(Ticking.name)] == [
        (j.pk, j.status) for j in jobs_before
    ]

    delayjobs.pause_schedule(daily)
    before = rows()
    post_action(staff, "resume_schedules", daily)
    assert staff.post(toggle_url(daily, "resume")).status_code == 403
    assert rows() == before


# An operator's schedule: the form ------------------------------------------------------


def form_data(**fields: str | None) -> dict[str, str]:
    """The add form's fields, as the browser posts them; None leaves a field out (an
    unticked box)."""
    data: dict[str, str | None] = {
        "name": "reports.hourly",
        "job_type": "tests.noop",
        "payload": '{"report": 7}',
        "cron": "",
        "interval": "01:00:00",
        "timezone": "UTC",
        "misfire": "once",
        "misfire_grace": "",
        "enabled": "on",
        **fields,
    }
    return {name: value for name, value in data.items() if value is not None}


def test_a_valid_schedule_is_added_and_ticks_from_now_on(operator: Any) -> None:
    before = timezone.now()
    response = operator.post(reverse(ADD), form_data(), follow=True)
    assert response.status_code == 200
    schedule = Schedule.objects.get(name="reports.hourly")
    assert schedule.source == ScheduleSource.DATABASE
    assert (schedule.job_type, schedule.payload) == ("tests.noop", {"report": 7})
    assert (schedule.interval, schedule.cron, schedule.enabled) == (timedelta(hours=1), "", True)
    assert schedule.materialised_until is not None
    assert before - timedelta(seconds=1) <= schedule.materialised_until <= timezone.now()
    assert "reports.hourly" in row_html(response, "reports.hourly")


def test_a_cron_schedule_in_a_time_zone_is_added(operator: Any) -> None:
    data = form_data(cron=" 30 6 * * * ", interval="", timezone="America/New_York")
    operator.post(reverse(ADD), data)
    schedule = Schedule.objects.get(name="reports.hourly")
    assert (schedule.cron, schedule.interval, schedule.timezone) == (
        "30 6 * * *",
        None,
        "America/New_York",
    )
    ticks = next_ticks(schedule, 2)
    assert [tick.astimezone(ZoneInfo("America/New_York")).hour for tick in ticks] == [6, 6]


def test_a_schedule_added_unticked_is_paused_by_its_author(operator: Any) -> None:
    operator.post(reverse(ADD), form_data(enabled=None))
    schedule = Schedule.objects.get(name="reports.hourly")
    assert (schedule.enabled, schedule.paused_by) == (False, "ops")
    assert schedule.paused_at is not None


@pytest.mark.parametrize(
    ("fields", "field", "error"),
    [
        ({"cron": "61 * * * *", "interval": ""}, "cron", "is not a valid cron expression"),
        ({"timezone": "Mars/Olympus_Mons"}, "timezone", "Unknown time zone 'Mars/Olympus_Mons'"),
        ({"interval": "0.5"}, "interval", "An interval must be from 1 second"),
        ({"interval": "00:00:00"}, "interval", "An interval must be from 1 second"),
        ({"cron": "0 * * * *"}, "cron", "Give either a cron expression or an interval, not both"),
        ({"interval": ""}, "cron", "Give either a cron expression or an interval, not neither"),
        ({"job_type": "tests.nonexistent"}, "job_type", "Unknown job type tests.nonexistent"),
        ({"job_type": ""}, "job_type", "This field is required"),
        ({"name": Ticking.name}, "name", "is the name of a job type with a recurrence"),
        ({"name": "bad name!"}, "name", "A name is 1-200 letters, digits"),
        ({"payload": "{not json"}, "payload", "Enter the payload as JSON"),
        ({"payload": '"' + "x" * 70_000 + '"'}, "payload", "over the limit of"),
        ({"payload": "[" * 100 + "]" * 100}, "payload", "nests lists and dicts more than"),
        ({"misfire_grace": "00:00:00"}, "misfire_grace", "The grace must be from"),
        ({"misfire_grace": "400 00:00:00"}, "misfire_grace", "The grace must be from"),
        ({"misfire": "sometimes"}, "misfire", "Select a valid choice"),
    ],
    ids=[
        "bad-cron",
        "unknown-time-zone",
        "interval-half-a-second",
        "interval-zero",
        "cron-and-interval",
        "neither",
        "unknown-job-type",
        "no-job-type",
        "name-of-a-code-type",
        "bad-name",
        "payload-not-json",
        "payload-too-big",
        "payload-too-deep",
        "grace-zero",
        "grace-too-long",
        "unknown-misfire",
    ],
)
def test_a_bad_schedule_is_refused_with_a_field_error(
    operator: Any, code_types: None, fields: dict[str, str], field: str, error: str
) -> None:
    code_schedule(Ticking.name)
    before = rows()
    response = operator.post(reverse(ADD), form_data(**fields))
    assert response.status_code == 200  # the form again, not a redirect
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field], errors
    [message] = errors[field]
    assert error in message
    assert error.replace("'", "&#x27;") in response.content.decode()
    assert rows() == before


def test_a_name_taken_by_another_schedule_is_refused(operator: Any) -> None:
    database_schedule("reports.hourly")
    response = operator.post(reverse(ADD), form_data())
    assert response.status_code == 200
    assert "already exists" in response.context["adminform"].form.errors["name"][0]


def test_the_form_offers_the_registered_job_types_and_suggests_time_zones(operator: Any) -> None:
    html = operator.get(reverse(ADD)).content.decode()
    assert '<option value="" selected>---------</option>' in html  # none chosen for you
    assert '<option value="tests.noop"' in html
    assert '<datalist id="delayjobs-time-zones"><option value="Africa/Abidjan">' in html
    assert 'list="delayjobs-time-zones"' in html


# An operator's schedule: edits and deletion -------------------------------------------


def change_data(schedule: Schedule, **fields: str) -> dict[str, str]:
    """The change form of ``schedule`` as posted back, with ``fields`` changed."""
    interval = schedule.interval
    data = {
        "job_type": schedule.job_type,
        "payload": json.dumps(schedule.payload),
        "cron": schedule.cron,
        "interval": "" if interval is None else str(interval.total_seconds()),
        "timezone": schedule.timezone,
        "misfire": schedule.misfire,
        "misfire_grace": "",
    }
    return {**data, **fields}


def test_an_edit_of_the_timing_cancels_the_coming_ticks_and_ticks_anew(operator: Any) -> None:
    schedule = database_schedule("reports.often", interval=timedelta(seconds=10))
    make_ticks()
    old = coming("reports.often")
    assert len(old) >= 5
    before = timezone.now()

    response = operator.post(change_url(schedule), change_data(schedule, interval="00:00:20"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    schedule.refresh_from_db()
    assert schedule.interval == timedelta(seconds=20)
    assert schedule.materialised_until is not None
    assert schedule.materialised_until >= before - timedelta(seconds=1)
    assert (
        DelayedJob.objects.filter(pk__in=[j.pk for j in old])
        .exclude(status=JobStatus.CANCELLED)
        .count()
        == 0
    )
    make_ticks()
    new = coming("reports.often")
    assert new and all(job.run_at.timestamp() % 20 == 0 for job in new)


@pytest.mark.parametrize(
    "fields",
    [{"payload": '{"report": 8}'}, {"job_type": "tests.scripted"}, {"timezone": "Asia/Tokyo"}],
    ids=["payload", "job-type", "time-zone"],
)
def test_an_edit_of_what_the_jobs_are_restarts_the_ticks_too(
    operator: Any, fields: dict[str, str]
) -> None:
    schedule = database_schedule("reports.often", interval=timedelta(seconds=10))
    make_ticks()
    assert coming("reports.often")
    response = operator.post(change_url(schedule), change_data(schedule, **fields))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert coming("reports.often") == []


def test_an_edit_of_the_misfire_policy_leaves_the_coming_ticks(operator: Any) -> None:
    schedule = database_schedule("reports.often", interval=timedelta(seconds=10))
    make_ticks()
    made = {job.pk for job in coming("reports.often")}
    cursor = Schedule.objects.get(pk=schedule.pk).materialised_until
    response = operator.post(
        change_url(schedule), change_data(schedule, misfire="all", misfire_grace="00:05:00")
    )
    assert response.status_code == 302
    schedule.refresh_from_db()
    assert (schedule.misfire, schedule.misfire_grace) == ("all", timedelta(minutes=5))
    assert {job.pk for job in coming("reports.often")} == made
    assert schedule.materialised_until == cursor


def test_an_edit_leaves_the_name_and_the_pause_alone(operator: Any) -> None:
    schedule = database_schedule("reports.often")
    page = operator.get(change_url(schedule))
    assert "name" not in page.context["adminform"].form.fields  # in the keys of its jobs
    assert "enabled" not in page.context["adminform"].form.fields  # the buttons' job
    # Paused after the page was read: the save does not undo it.
    delayjobs.pause_schedule(schedule, by="other")
    data = change_data(schedule, name="reports.renamed", enabled="on", misfire="skip")
    assert operator.post(change_url(schedule), data).status_code == 302
    schedule.refresh_from_db()
    assert (schedule.name, schedule.enabled, schedule.paused_by) == (
        "reports.often",
        False,
        "other",
    )
    assert schedule.misfire == "skip"


def test_a_job_type_gone_from_the_code_is_shown_as_it_is_and_must_be_replaced(
    operator: Any,
) -> None:
    schedule = database_schedule("reports.orphan", job_type="tests.gone_from_the_code")
    html = operator.get(change_url(schedule)).content.decode()
    # Not silently swapped for the first registered type on the next save.
    assert re.search(r'<option value="tests.gone_from_the_code" selected>[^<]*not registered', html)
    response = operator.post(change_url(schedule), change_data(schedule, misfire="skip"))
    assert response.status_code == 200
    [message] = response.context["adminform"].form.errors["job_type"]
    assert "Unknown job type tests.gone_from_the_code" in message
    assert (
        operator.post(
            change_url(schedule), change_data(schedule, job_type="tests.noop")
        ).status_code
        == 302
    )
    assert Schedule.objects.get(pk=schedule.pk).job_type == "tests.noop"


def test_deleting_a_database_schedule_cancels_its_coming_ticks(operator: Any) -> None:
    schedule = database_schedule("reports.often", interval=timedelta(seconds=10))
    make_ticks()
    assert coming("reports.often")
    response = operator.post(delete_url(schedule), {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert not Schedule.objects.filter(pk=schedule.pk).exists()
    assert coming("reports.often") == []


# Code schedules ------------------------------------------------------------------------


def test_a_code_schedules_page_is_read_only(operator: Any, code_types: None) -> None:
    nightly = code_schedule(Nightly.name)
    page = operator.get(change_url(nightly))
    assert page.status_code == 200
    assert page.context["has_change_permission"] is False
    assert page.context["has_delete_permission"] is False
    html = page.content.decode()
    assert "job type tests.admin_nightly&#x27;s recurrence" in html
    form = html.split('id="schedule_form"')[1].split("</form>")[0]
    assert 'name="_save"' not in form
    assert re.findall(r"<(?:input|select|textarea)\b[^>]*", form) == [
        Containing('type="hidden" name="csrfmiddlewaretoken"')
    ]
    before = rows()
    forged = {"job_type": "tests.noop", "cron": "* * * * *", "timezone": "UTC"}
    assert operator.post(change_url(nightly), forged).status_code == 403
    assert rows() == before


def test_a_code_schedule_whose_type_recurs_is_not_deleted(operator: Any, code_types: None) -> None:
    nightly = code_schedule(Nightly.name)
    for response in (
        operator.get(delete_url(nightly), follow=True),
        operator.post(delete_url(nightly), {"post": "yes"}, follow=True),
    ):
        assert response.redirect_chain == [(change_url(nightly), 302)]
        [message] = message_texts(response)
        assert "is defined in code" in message and "Pause it here" in message
    assert Schedule.objects.filter(pk=nightly.pk).exists()
    # Nor in bulk: the list offers no delete action, and a forged one is not run.
    assert message_texts(post_action(operator, "delete_selected", nightly)) == [
        "No action selected."
    ]
    assert Schedule.objects.filter(pk=nightly.pk).exists()


def test_a_code_schedule_whose_type_no_longer_recurs_can_be_deleted(
    operator: Any, code_types: None
) -> None:
    nightly = code_schedule(Nightly.name)
    registry.remove(Nightly.name)  # the recurrence is gone from the code
    row = row_html(operator.get(changelist_url()), Nightly.name)
    assert "has no recurrence in this code (any more)" in row
    assert operator.get(delete_url(nightly)).status_code == 200  # the confirmation
    operator.post(delete_url(nightly), {"post": "yes"})
    assert not Schedule.objects.filter(pk=nightly.pk).exists()


def test_no_site_wide_action_is_offered(operator: Any) -> None:
    database_schedule()
    response = operator.get(changelist_url())
    choices = {value for value, _label in response.context["action_form"].fields["action"].choices}
    assert choices == {"", "pause_schedules", "resume_schedules"}


def test_ticks_are_listed_in_their_zone_and_in_utc_each_date_once() -> None:
    tick = datetime(2026, 11, 27, 23, 30, tzinfo=UTC)
    lines = format_ticks([tick, tick + timedelta(hours=1)], ZoneInfo("Asia/Tokyo")).split("<br>")
    shown = [re.sub("<[^>]+>", "", line) for line in lines]
    assert shown == ["2026-11-28 08:30 JST (2026-11-27 23:30 UTC)", "09:30 JST (00:30 UTC)"]
    seconds = [tick + timedelta(seconds=n) for n in (5, 15)]
    assert format_ticks(seconds, UTC).count("2026-11-27") == 1  # the date where it changes
    assert "23:30:05 UTC" in format_ticks(seconds, UTC)
    assert "23:30:00.500 UTC" in format_ticks([tick + timedelta(milliseconds=500)], UTC)
