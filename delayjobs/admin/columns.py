"""The admin's columns: status badges, lateness, moments, linked objects, and what is paused
(read once per request)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import BooleanField, Case, Model, Q, QuerySet, Value, When
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.text import capfirst
from django.utils.translation import get_language, gettext

from delayjobs import pauses
from delayjobs.core.db import verbose_name
from delayjobs.core.display import format_duration, format_precise_time, format_time
from delayjobs.models import DelayedJob, JobStatus

#: Badge colours (background) of each status; white text reads on all of them.
STATUS_COLOURS: dict[str, str] = {
    JobStatus.SCHEDULED: "#417690",
    JobStatus.RUNNING: "#b06d00",
    JobStatus.SUCCEEDED: "#2e7d32",
    JobStatus.FAILED: "#c62828",
    JobStatus.CANCELLED: "#6c757d",
    JobStatus.SKIPPED: "#5d6d7e",
    JobStatus.EXPIRED: "#8d6e63",
}
PAUSED_COLOUR = "#6a1b9a"
BADGE_STYLE = (
    "display: inline-block; padding: 1px 6px; border-radius: 8px; color: #fff; "
    "font-size: 0.85em; white-space: nowrap; background: {}"
)
#: Statuses whose started_at (the execution start, written with the outcome) belongs to
#: the current run_at: a scheduled job's is its previous attempt's, before a retry moved
#: run_at, and a running job's is written when the run ends.
FINISHED_STARTED_STATUSES = (
    JobStatus.SUCCEEDED,
    JobStatus.FAILED,
    JobStatus.SKIPPED,
    JobStatus.EXPIRED,
)


def status_badge(status: str, *, paused: bool = False) -> str:
    """A coloured badge of ``status``, and a "paused" one after it if ``paused``."""
    return _badge(status, paused, get_language())


@functools.lru_cache(maxsize=256)
def _badge(status: str, paused: bool, language: str | None) -> str:
    # Cached: a list shows the same few badges a hundred times; the language is part of
    # the key because the labels are translated.
    badge = format_html(
        '<span style="{}">{}</span>',
        BADGE_STYLE.format(STATUS_COLOURS.get(status, "#444")),
        JobStatus(status).label if status in JobStatus.values else status,
    )
    if paused:
        badge += format_html(
            ' <span style="{}" title="{}">{}</span>',
            BADGE_STYLE.format(PAUSED_COLOUR),
            gettext("Its queue or job type is paused: no consumer claims it until resumed."),
            gettext("paused"),
        )
    return badge


def job_lateness(job: DelayedJob, now: datetime) -> str:
    """Execution start - run_at of a job that ran; how overdue a scheduled job is; else "-".

    A running job started at its run_at or, if claimed late, at its claim: a consumer
    claims a job up to CLAIM_AHEAD early and starts it at its run_at, never before.
    """
    if job.status in FINISHED_STARTED_STATUSES and job.started_at is not None:
        return format_duration(job.started_at - job.run_at)
    if job.status == JobStatus.RUNNING and job.claimed_at is not None:
        return format_duration(max(job.claimed_at - job.run_at, timedelta(0)))
    if job.status == JobStatus.SCHEDULED and job.run_at < now:
        return gettext("due %(duration)s ago") % {"duration": format_duration(now - job.run_at)}
    return "-"


def moment_column(
    model: type[Model], field: str, *, precise: bool = False
) -> Callable[[Any, Any], str]:
    """An admin column (or read-only field) showing a moment field in the current time zone:
    to the second in lists, to the millisecond (``precise``) on one job's page."""
    show = format_precise_time if precise else format_time

    @admin.display(description=verbose_name(model, field), ordering=field)
    def column(model_admin: Any, obj: Any) -> str:
        return show(getattr(obj, field))

    return column


def utc_iso(moment: datetime) -> str:
    """``moment`` in UTC, as log entries write times (the database's own time zone)."""
    return moment.astimezone(UTC).isoformat()


def paused_now(request: HttpRequest) -> pauses.Paused:
    """What is paused, read once per request whatever asks for it."""
    cached: pauses.Paused | None = getattr(request, "_delayjobs_paused", None)
    if cached is None:
        cached = pauses.paused()
        request._delayjobs_paused = cached  # type: ignore[attr-defined]
    return cached


def with_paused_flag(jobs: QuerySet[DelayedJob], paused: pauses.Paused) -> QuerySet[DelayedJob]:
    """``jobs`` annotated with ``is_paused``: scheduled and in a paused queue or job type."""
    if not paused:
        return jobs.annotate(is_paused=Value(False, output_field=BooleanField()))
    covered = Q(queue__in=paused.queues) | Q(job_type__in=paused.job_types)
    return jobs.annotate(
        is_paused=Case(
            When(Q(status=JobStatus.SCHEDULED) & covered, then=Value(True)),
            default=Value(False),
            output_field=BooleanField(),
        )
    )


def object_link(job: DelayedJob, admin_site: admin.AdminSite) -> str:
    """The job's linked object, as a link to its admin page when it has one."""
    if job.content_type_id is None:
        return "-"
    content_type = job.content_type
    model = content_type.model_class() if content_type else None
    if model is None:
        return f"{content_type} {job.object_id}"
    label = capfirst(model._meta.verbose_name)
    target = job.obj
    if target is None:
        return gettext("%(model)s %(id)s (deleted)") % {"model": label, "id": job.object_id}
    text = f"{label}: {target}"
    if not admin_site.is_registered(model):
        return text
    try:
        url = reverse(
            f"{admin_site.name}:{model._meta.app_label}_{model._meta.model_name}_change",
            args=[quote(target.pk)],
        )
    except NoReverseMatch:
        return text
    return format_html('<a href="{}">{}</a>', url, text)


def job_link(job: DelayedJob, admin_site: admin.AdminSite) -> str:
    url = reverse(f"{admin_site.name}:delayjobs_delayedjob_change", args=[job.pk])
    return format_html('<a href="{}">#{}</a>', url, job.pk)
