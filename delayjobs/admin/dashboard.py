"""The admin dashboard: the figures of ``delayjobs.api.stats`` on one server-rendered page.

No JavaScript and no external assets: the chart of the next hour is an inline SVG whose
bars are positioned here, in Python, so the page works offline and under a strict
Content-Security-Policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.admin import ModelAdmin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from delayjobs.admin import estimates
from delayjobs.api import stats
from delayjobs.core import display
from delayjobs.models import DelayedJob, JobStatus

TEMPLATE = "delayjobs/dashboard.html"

# The chart's coordinate system (the SVG scales to the page width through its viewBox).
BAR_WIDTH = 10
BAR_GAP = 2
PLOT_HEIGHT = 120
LEFT = 36  # room for the y-axis label
BOTTOM = 18  # room for the time labels
RIGHT = 20  # room for half of the last time label
TICK_EVERY = 10  # minutes between time labels


@dataclass(frozen=True)
class Bar:
    minute: datetime
    count: int
    x: float
    y: float
    width: float
    height: float
    title: str


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class DueChart:
    """The SVG chart of jobs due per minute: one bar per minute that has jobs."""

    width: int
    height: int
    plot_top: int
    plot_bottom: int
    left: int
    right: int
    peak: int
    total: int
    bars: list[Bar]
    ticks: list[Tick]
    label: str


def due_chart(figures: stats.Stats) -> DueChart:
    counts = figures.due_per_minute
    peak = max(counts, default=0)
    bars = []
    for index, count in enumerate(counts):
        if not count:
            continue  # an empty minute is the absence of a bar
        minute = figures.minute(index)
        # At least one unit tall: a minute with one job among thousands stays visible.
        height = max(1.0, round(count / peak * PLOT_HEIGHT, 1))
        bars.append(
            Bar(
                minute=minute,
                count=count,
                x=LEFT + index * BAR_WIDTH + BAR_GAP / 2,
                y=PLOT_HEIGHT - height,
                width=BAR_WIDTH - BAR_GAP,
                height=height,
                title=ngettext("%(time)s: %(count)d job due", "%(time)s: %(count)d jobs due", count)
                % {"time": stats.format_clock(minute), "count": count},
            )
        )
    ticks = [
        Tick(x=LEFT + index * BAR_WIDTH, label=stats.format_clock(figures.minute(index)))
        for index in range(0, len(counts) + 1, TICK_EVERY)
    ]
    total = sum(counts)
    label = ngettext(
        "%(total)d job due in the next hour, by minute from %(start)s; at most %(peak)d in "
        "one minute.",
        "%(total)d jobs due in the next hour, by minute from %(start)s; at most %(peak)d in "
        "one minute.",
        total,
    ) % {"total": total, "start": stats.format_clock(figures.due_from), "peak": peak}
    right = LEFT + len(counts) * BAR_WIDTH
    return DueChart(
        width=right + RIGHT,
        height=PLOT_HEIGHT + BOTTOM,
        plot_top=0,
        plot_bottom=PLOT_HEIGHT,
        left=LEFT,
        right=right,
        peak=peak,
        total=total,
        bars=bars,
        ticks=ticks,
        label=label,
    )


@dataclass(frozen=True)
class JobTypeRow:
    job_type: str
    counts: list[int | str]
    paused: bool


def job_counts() -> stats.JobCounts:
    """The counts of jobs by job type and status, without a ``COUNT(*)`` of a large table.

    On PostgreSQL past ``estimates.estimate_above()`` rows (the planner's figure), a page
    sample of the table (``TABLESAMPLE``) estimates the large statuses; the statuses it
    finds small are counted exactly, through the (status, run_at, id) index. Elsewhere, or
    on a smaller table, every count is exact.
    """
    jobs = DelayedJob.objects.all()
    limit = estimates.estimate_above()
    if limit <= 0 or not estimates.can_estimate(jobs):
        return stats.exact_counts()
    total = estimates.table_rows(DelayedJob, jobs.db)
    if total <= limit:
        return stats.exact_counts()
    sampled = estimates.sampled_counts(jobs, ("job_type", "status"), total)
    per_status = dict.fromkeys(JobStatus.values, 0)
    for (_job_type, status), n in sampled.items():
        per_status[status] = per_status.get(status, 0) + n
    small = [status for status, n in per_status.items() if n <= limit]
    exact = estimates.exact_counts(jobs, ("job_type", "status"), {"status__in": small})
    rows = {key: n for key, n in sampled.items() if key[1] not in small} | exact
    by_job_type, by_status = stats.tabulate((a, b, n) for (a, b), n in rows.items())
    estimated = tuple(status for status in per_status if status not in small)
    return by_job_type, by_status, estimated


def shown(count: int, estimated: bool) -> int | str:
    """A count as the page shows it: "≈" before an estimate, rounded to three digits."""
    if not estimated:
        return count
    digits = max(0, len(str(count)) - 3)
    return f"≈{round(count, -digits):,}"


#: Limit keys the dashboard lists, the busiest first.
LIMIT_ROWS = 50


def dashboard_view(request: HttpRequest, model_admin: ModelAdmin[Any]) -> TemplateResponse:
    """The dashboard page. Wrap it in ``admin_site.admin_view`` (staff login); it also
    needs the view permission on delayed jobs, as their change list does."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    request.current_app = model_admin.admin_site.name  # links stay on a custom AdminSite
    figures = stats.collect(counts=job_counts)
    paused = figures.paused
    statuses = JobStatus.values
    estimated = [status in figures.estimated for status in statuses]
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Delayed jobs dashboard"),
        "opts": model_admin.opts,
        "figures": figures,
        "chart": due_chart(figures),
        "statuses": [
            (label, shown(figures.by_status.get(status, 0), guess))
            for status, label, guess in zip(statuses, JobStatus.labels, estimated, strict=True)
        ],
        "job_types": [
            JobTypeRow(
                job_type=name,
                counts=[
                    shown(counts.get(status, 0), guess)
                    for status, guess in zip(statuses, estimated, strict=True)
                ],
                paused=name in paused.job_types,
            )
            for name, counts in figures.by_job_type.items()
        ],
        "lateness": [
            (label, display.format_duration(value)) for label, value in figures.lateness.figures()
        ],
        "overdue_late": display.format_duration(
            figures.oldest_overdue.late if figures.oldest_overdue else None
        ),
        "live_within": display.format_duration(stats.LIVE_WITHIN),
        "estimated": figures.estimated,
        "limits": figures.limits[:LIMIT_ROWS],
        "limits_more": max(len(figures.limits) - LIMIT_ROWS, 0),
    }
    return TemplateResponse(request, TEMPLATE, context)
