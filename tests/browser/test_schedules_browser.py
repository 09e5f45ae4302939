"""Browser tests of the schedules' admin: Debian's chromium, driven by Playwright, against a
live test server.

An operator lists the code and database schedules with their next ticks, pauses a code
schedule (its coming ticks' jobs are cancelled) and resumes it, then adds a schedule of
their own: refused with a bad cron expression, listed once it is fixed.

The recurring job types are registered here only, in this process, which the live server
shares: registered in tests/delay_jobs.py, every other test would get tick jobs. The
pre-loader's pass that makes ticks into jobs runs in the test's own process too
(``materialise_schedules``), for the same reason: a subprocess would not know the types.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from delayjobs.models import DelayedJob, JobStatus, Schedule, ScheduleSource
from delayjobs.recurring.definitions import add_schedule, next_ticks, sync_code_schedules
from delayjobs.recurring.ticks import materialise_schedules
from tests.browser.test_browser import log_in, staff_user
from tests.support import schedules as schedule_types
from tests.support.schedules import Nightly, Ticking

try:
    from playwright.sync_api import Locator, Page, expect
except ImportError as exc:  # a clear failure, never a skip
    raise ImportError(
        "The browser tests need Playwright for Python: pip install -e '.[test]'"
    ) from exc

#: The fixture that registers Nightly and Ticking for a test.
code_types = schedule_types.code_types

pytestmark = [pytest.mark.browser, pytest.mark.subprocess]

SCHEDULES = "/admin/delayjobs/schedule/"
ADD = "/admin/delayjobs/schedule/add/"
OPERATOR = (
    "view_schedule",
    "add_schedule",
    "change_schedule",
    "pause_schedule",
    "view_delayedjob",
)


def schedule_row(page: Page, name: str) -> Locator:
    """The list's row of the schedule called ``name``."""
    link = page.get_by_role("link", name=name, exact=True)
    return page.locator("#result_list tbody tr").filter(has=link)


def coming(name: str) -> list[DelayedJob]:
    """The jobs of the schedule's ticks still to run."""
    return list(
        DelayedJob.objects.filter(key__startswith=f"schedule:{name}@", status=JobStatus.SCHEDULED)
    )


def test_an_operator_lists_schedules_pauses_a_code_schedule_and_resumes_it(
    page: Page, code_types: None, screenshot: Callable[[str], Path]
) -> None:
    add_schedule(Schedule(name="reports.daily", job_type="tests.noop", interval=timedelta(days=1)))
    # A pre-loader pass over the next minute: the ticking schedule's coming ticks as jobs.
    sync_code_schedules()
    now = timezone.now()
    errors: list[str] = []
    materialise_schedules(now, now + timedelta(minutes=1), errors)
    assert errors == []
    assert len(coming(Ticking.name)) >= 5
    log_in(page, staff_user("operator", *OPERATOR))

    page.goto(SCHEDULES)
    nightly = schedule_row(page, Nightly.name)
    expect(nightly.locator("td.field-source")).to_have_text("code")
    expect(nightly.locator("td.field-when")).to_have_text("cron '0 8 * * MON-FRI' (Europe/Berlin)")
    first = next_ticks(Schedule.objects.get(name=Nightly.name), 1)[0]
    berlin = first.astimezone(ZoneInfo("Europe/Berlin"))
    expect(nightly.locator("td.field-coming_ticks")).to_contain_text(
        f"{berlin:%Y-%m-%d} 08:00 {berlin.tzname()}"
    )
    expect(nightly.locator("td.field-coming_ticks br")).to_have_count(4)  # five lines
    daily = schedule_row(page, "reports.daily")
    expect(daily.locator("td.field-source")).to_have_text("database")
    expect(daily.locator("td.field-when")).to_have_text("every 1d")
    expect(daily.locator("td.field-coming_ticks")).to_contain_text("00:00 UTC")
    ticking = schedule_row(page, Ticking.name)
    expect(ticking.locator("td.field-status")).to_have_text("enabled")
    screenshot("admin-schedules.png")

    # Paused with the list's action: no deploy, and its coming ticks' jobs are cancelled.
    ticking.locator('input[name="_selected_action"]').check()
    page.locator('select[name="action"]').select_option("pause_schedules")
    page.locator('button[name="index"]').click()
    expect(page.locator(".messagelist .success")).to_contain_text("1 schedule paused")
    ticking = schedule_row(page, Ticking.name)
    expect(ticking.locator("td.field-status")).to_contain_text(
        re.compile(r"paused since .* by operator")
    )
    expect(ticking.locator("td.field-coming_ticks")).to_have_text("none while paused")
    row = Schedule.objects.get(name=Ticking.name)
    assert (row.enabled, row.paused_by) == (False, "operator")
    assert coming(Ticking.name) == []
    made = DelayedJob.objects.filter(key__startswith=f"schedule:{Ticking.name}@")
    assert set(made.values_list("status", flat=True)) == {JobStatus.CANCELLED}

    # Resumed with the button on its page.
    ticking.get_by_role("link", name=Ticking.name, exact=True).click()
    expect(page.locator(".field-status .readonly")).to_contain_text("paused since")
    screenshot("admin-schedule-paused.png")
    page.get_by_role("button", name="Resume").click()
    expect(page.locator(".messagelist .success")).to_contain_text(
        f"The schedule {Ticking.name} is resumed"
    )
    expect(page.locator(".field-status .readonly")).to_have_text("enabled")
    expect(page.get_by_role("button", name="Pause")).to_be_visible()
    assert Schedule.objects.get(name=Ticking.name).enabled


def test_an_operator_adds_a_schedule_after_fixing_its_cron_expression(
    page: Page, code_types: None, screenshot: Callable[[str], Path]
) -> None:
    log_in(page, staff_user("operator", *OPERATOR))
    page.goto(SCHEDULES)
    page.locator(".object-tools a.addlink").click()
    expect(page).to_have_url(re.compile(re.escape(ADD) + "$"))

    page.locator("#id_name").fill("reports.morning")
    page.locator("#id_job_type").select_option("tests.noop")
    page.locator("#id_payload").fill('{"report": "sales"}')
    page.locator("#id_cron").fill("61 7 * * *")
    page.locator("#id_timezone").fill("Europe/Berlin")
    page.locator('input[name="_save"]').click()

    expect(page.locator(".errornote")).to_be_visible()
    expect(page.locator(".field-cron .errorlist")).to_contain_text(
        "'61 7 * * *' is not a valid cron expression"
    )
    assert not Schedule.objects.filter(name="reports.morning").exists()
    screenshot("admin-schedule-form-error.png")

    page.locator("#id_cron").fill("0 7 * * *")
    page.locator('input[name="_save"]').click()

    expect(page).to_have_url(re.compile(re.escape(SCHEDULES) + "$"))
    morning = schedule_row(page, "reports.morning")
    expect(morning.locator("td.field-source")).to_have_text("database")
    expect(morning.locator("td.field-when")).to_have_text("cron '0 7 * * *' (Europe/Berlin)")
    expect(morning.locator("td.field-time_zone")).to_have_text("Europe/Berlin")
    expect(morning.locator("td.field-coming_ticks")).to_contain_text(re.compile(r"07:00 CES?T"))
    expect(morning.locator("td.field-last_outcome")).to_have_text("-")
    schedule = Schedule.objects.get(name="reports.morning")
    assert (schedule.source, schedule.payload) == (ScheduleSource.DATABASE, {"report": "sales"})
    assert schedule.materialised_until is not None  # ticks from when it was added
