"""What the schedules' admin shows of a schedule: when it ticks, its next ticks, whether it
is paused, and how its latest tick's job ended."""

from __future__ import annotations

import zoneinfo
from collections.abc import Sequence
from datetime import UTC, date, datetime, tzinfo

from django.contrib import admin
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext

from delayjobs.admin.columns import BADGE_STYLE, PAUSED_COLOUR, job_link, status_badge
from delayjobs.core.display import format_duration, format_time
from delayjobs.models import Schedule
from delayjobs.models.schedules import ScheduleSource
from delayjobs.recurring.definitions import definition_problem, grace_of, recent_jobs, recurrence_of

ENABLED_COLOUR = "#2e7d32"
PROBLEM_STYLE = "color: #ba2121"


def describe(schedule: Schedule) -> str:
    """When it ticks ("every 5m", "cron '0 8 * * *' (Europe/Berlin)"), or in red why it
    cannot tick."""
    if problem := definition_problem(schedule):
        return format_html('<span style="{}">{}</span>', PROBLEM_STYLE, problem)
    return recurrence_of(schedule).describe()


def zone_of(schedule: Schedule) -> tzinfo:
    """The wall clock its ticks read in: a cron's zone; UTC for an interval, whose ticks
    are aligned to the epoch whatever the zone."""
    if schedule.interval is None and schedule.cron:
        try:
            return zoneinfo.ZoneInfo(schedule.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            pass  # such a schedule has no ticks to show anyway
    return UTC


def time_zone(schedule: Schedule) -> str:
    return schedule.timezone if schedule.interval is None else "-"


def format_ticks(ticks: Sequence[datetime], zone: tzinfo) -> str:
    """Ticks one a line, in ``zone`` and, if that is not UTC, in UTC after it. Compact for
    a list: a date only where it changes, to the minute when every tick is on a whole
    minute (a cron's), else to the second or the millisecond."""
    if not ticks:
        return "-"
    if any(tick.microsecond for tick in ticks):
        clock = "%H:%M:%S.%f"
    elif any(tick.second for tick in ticks):
        clock = "%H:%M:%S"
    else:
        clock = "%H:%M"

    def shown(moment: datetime, with_date: bool) -> str:
        text = moment.strftime(f"%Y-%m-%d {clock}" if with_date else clock)
        return text[:-3] if clock.endswith("%f") else text  # microseconds as milliseconds

    lines = []
    previous: date | None = None
    for tick in ticks:
        local = tick.astimezone(zone)
        text = f"{shown(local, local.date() != previous)} {local.tzname()}"
        previous = local.date()
        if local.utcoffset():
            utc = tick.astimezone(UTC)
            text += f" ({shown(utc, utc.date() != local.date())} UTC)"
        lines.append((text,))
    return format_html_join(mark_safe("<br>"), '<span style="white-space: nowrap">{}</span>', lines)


def status(schedule: Schedule) -> str:
    """Enabled, or paused since when and by whom."""
    if schedule.enabled:
        return format_html(
            '<span style="{}">{}</span>', BADGE_STYLE.format(ENABLED_COLOUR), gettext("enabled")
        )
    badge = format_html(
        '<span style="{}">{}</span>', BADGE_STYLE.format(PAUSED_COLOUR), gettext("paused")
    )
    if schedule.paused_by:
        since = gettext("since %(time)s by %(user)s") % {
            "time": format_time(schedule.paused_at),
            "user": schedule.paused_by,
        }
    else:
        since = gettext("since %(time)s") % {"time": format_time(schedule.paused_at)}
    return format_html("{} {}", badge, since)


def last_outcome(schedule: Schedule, admin_site: admin.AdminSite) -> str:
    """The status of the job of its latest tick so far, linked to that job; "-" if none.

    ``recent_jobs`` looks the jobs up by their keys: one query, whatever the history."""
    jobs = recent_jobs(schedule)  # newest first; its latest ticks may have no job yet
    if not jobs:
        return "-"
    job = jobs[0]
    return format_html(
        '{} {} <span class="quiet">{}</span>',
        status_badge(job.status),
        job_link(job, admin_site),
        format_time(job.run_at),
    )


def misfire(schedule: Schedule) -> str:
    """The policy, and the grace past which a tick is missed."""
    title = schedule.get_misfire_display()
    if schedule.misfire_grace is None:
        title += " " + gettext("(grace: the MISFIRE_GRACE setting)")
    return format_html(
        '<span title="{}">{}<br><span style="white-space: nowrap">{}</span></span>',
        title,
        schedule.misfire,
        gettext("grace %(grace)s") % {"grace": format_duration(grace_of(schedule))},
    )


def defined_in(schedule: Schedule) -> str:
    """Where the definition lives, and so where it is changed."""
    if schedule.source == ScheduleSource.CODE:
        return gettext(
            "code: job type %(name)s's recurrence. Change it in the code and deploy; pause "
            "and resume it here."
        ) % {"name": schedule.name}
    return gettext("database: this form")
