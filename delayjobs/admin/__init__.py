"""Admin: every job and every attempt, read-only; actions behind their own permissions;
pauses, consumers, and the jobs of any object on that object's own admin page."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.contrib.contenttypes.admin import GenericTabularInline
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import BooleanField, Case, Model, Q, QuerySet, TextField, Value, When
from django.db.models.functions import Cast
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.text import capfirst, smart_split, unescape_string_literal
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from delayjobs import api, pauses
from delayjobs.admin_lookups import NulRefusingChangeList, RefusesNulInLists
from delayjobs.db import verbose_name
from delayjobs.display import format_duration, format_precise_time, format_time
from delayjobs.exceptions import DelayJobsError, InvalidJob
from delayjobs.jobtypes import registry
from delayjobs.models import (
    RETRYABLE_STATUSES,
    Consumer,
    DelayedJob,
    JobAttempt,
    JobStatus,
    Pause,
    PauseKind,
)

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
#: "#42" searches ids only; plain digits search ids, keys and payloads.
ID_TERM = re.compile(r"#?(\d+)")
#: Ids above this cannot exist (a 64-bit primary key); the lookup would overflow.
MAX_ID = 2**63 - 1
#: A datetime-local input has minute precision in most browsers, so "now" typed into it
#: is up to a minute ago: that much of the past still counts as now.
PAST_GRACE = timedelta(minutes=1)
#: The reschedule page lists this many of the selected jobs (all of them are moved).
RESCHEDULE_LISTED = 50


def status_badge(status: str, *, paused: bool = False) -> str:
    """A coloured badge of ``status``, and a "paused" one after it if ``paused``."""
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


class ReadOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class JobAttemptInline(ReadOnlyMixin, admin.TabularInline):
    model = JobAttempt
    extra = 0
    can_delete = False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A job's history is part of the job: whoever may view jobs sees their attempts,
        # without a separate view_jobattempt permission.
        return request.user.has_perm("delayjobs.view_delayedjob") or super().has_view_permission(
            request, obj
        )

    ordering = ("-started_at", "-id")
    fields = (
        "number",
        "outcome",
        "started",
        "finished",
        "lateness_shown",
        "worker_id",
        "error",
        "formatted_traceback",
    )
    readonly_fields = fields
    started = moment_column(JobAttempt, "started_at", precise=True)
    finished = moment_column(JobAttempt, "finished_at", precise=True)

    @admin.display(description=_("lateness"))
    def lateness_shown(self, attempt: JobAttempt) -> str:
        return format_duration(attempt.lateness)

    @admin.display(description=_("traceback"))
    def formatted_traceback(self, attempt: JobAttempt) -> str:
        if not attempt.traceback:
            return "-"
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', attempt.traceback)


class RunAtFilter(admin.SimpleListFilter):
    """The moments operators ask about, relative to now (the date hierarchy does dates)."""

    title = _("due")
    parameter_name = "due"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("overdue", _("overdue (scheduled, past due)")),
            ("next_hour", _("in the next hour")),
            ("last_24h", _("in the last 24 hours")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        now = timezone.now()
        match self.value():
            case "overdue":
                return queryset.filter(status=JobStatus.SCHEDULED, run_at__lt=now)
            case "next_hour":
                return queryset.filter(run_at__gte=now, run_at__lt=now + timedelta(hours=1))
            case "last_24h":
                return queryset.filter(run_at__gte=now - timedelta(hours=24), run_at__lt=now)
        return queryset


class JobChangeList(NulRefusingChangeList):
    """The changelist page fetches each row's linked object in one query per model, and
    refuses a NUL character in its query (``delayjobs.admin_lookups``)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        attach_objects(self.result_list)


def attach_objects(jobs: Iterable[DelayedJob]) -> None:
    """Fetch the jobs' linked objects with one query per model, as ``prefetch_related("obj")``
    would, except that a content type whose model is gone (its app was removed) is skipped
    instead of failing the whole page."""
    field = DelayedJob._meta.get_field("obj")
    by_type: dict[int, list[DelayedJob]] = defaultdict(list)
    for job in jobs:
        if job.content_type_id is not None:
            by_type[job.content_type_id].append(job)
    for linked in by_type.values():
        content_type = linked[0].content_type
        assert content_type is not None  # only jobs with a content_type_id are here
        model = content_type.model_class()
        keys: dict[DelayedJob, Any] = {}
        for job in linked:
            try:
                keys[job] = model._meta.pk.to_python(job.object_id) if model else None
            except ValidationError:  # an id that cannot be this model's: no object
                keys[job] = None
        wanted = {key for key in keys.values() if key is not None}
        found = model._base_manager.in_bulk(wanted) if model and wanted else {}
        for job, key in keys.items():
            field.set_cached_value(job, found.get(key))


class RescheduleForm(forms.Form):
    run_at = forms.DateTimeField(
        label=_("New time"),
        # A naive value (what datetime-local sends) is read in the current time zone.
        widget=forms.DateTimeInput(
            attrs={"type": "datetime-local", "step": "1"}, format="%Y-%m-%dT%H:%M:%S"
        ),
    )

    def clean_run_at(self) -> datetime:
        value: datetime = self.cleaned_data["run_at"]
        now = timezone.now()
        if timezone.is_naive(value):
            # Only without USE_TZ, which delayjobs requires.
            raise ValidationError(_("Give the time with its time zone (USE_TZ must be True)."))
        try:
            value = api.resolve_run_at(value, None, now)
        except InvalidJob as exc:
            raise ValidationError(str(exc)) from None
        if value < now - PAST_GRACE:
            raise ValidationError(
                _("%(time)s is in the past: choose now or a later time."),
                params={"time": timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")},
            )
        return value


@admin.register(DelayedJob)
class DelayedJobAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "status_display",
        "job_type",
        "queue",
        "due",
        "lateness",
        "attempts",
        "key",
        "linked_object",
    )
    list_filter = ("status", "job_type", "queue", RunAtFilter)
    # No COUNT(*) of the whole table on every filtered page: it grows with the history.
    show_full_result_count = False
    # get_search_results does the searching; this turns the search box on.
    search_fields = ("=key",)
    search_help_text = _(
        "An id (#42 for ids only), an exact key, or text in the payload. "
        "Several words: jobs matching all of them."
    )
    list_select_related = ("content_type",)
    ordering = ("-run_at", "-id")
    date_hierarchy = "run_at"
    inlines = (JobAttemptInline,)
    actions = ("retry_jobs", "run_jobs_now", "cancel_jobs", "reschedule_jobs")
    fieldsets = (
        (
            None,
            {"fields": ("job_type", "queue", "status_display", "due_at", "key", "linked_object")},
        ),
        (
            _("Execution"),
            {
                "fields": (
                    "attempts",
                    "max_attempts",
                    "claimed",
                    "started",
                    "finished",
                    "lateness",
                    "worker_id",
                    "lease_expires",
                    "last_error",
                )
            },
        ),
        (_("Payload"), {"fields": ("formatted_payload",)}),
        (_("Tracing"), {"fields": ("created", "trace_id")}),
    )
    # Everything is shown, nothing is edited: state changes go through the actions.
    readonly_fields = tuple(
        cast(str, name) for _title, options in fieldsets for name in options["fields"]
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[DelayedJob]:
        return with_paused_flag(super().get_queryset(request), paused_now(request))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        paused = paused_now(request)
        context = {
            "paused_queues": sorted(paused.queues),
            "paused_job_types": sorted(paused.job_types),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=context)

    # Columns -----------------------------------------------------------------------

    due = moment_column(DelayedJob, "run_at")
    due_at = moment_column(DelayedJob, "run_at", precise=True)
    claimed = moment_column(DelayedJob, "claimed_at", precise=True)
    started = moment_column(DelayedJob, "started_at", precise=True)
    finished = moment_column(DelayedJob, "finished_at", precise=True)
    lease_expires = moment_column(DelayedJob, "lease_expires_at", precise=True)
    created = moment_column(DelayedJob, "created_at", precise=True)

    @admin.display(description=_("status"), ordering="status")
    def status_display(self, job: DelayedJob) -> str:
        return status_badge(job.status, paused=getattr(job, "is_paused", False))

    @admin.display(description=_("lateness"))
    def lateness(self, job: DelayedJob) -> str:
        return job_lateness(job, timezone.now())

    @admin.display(description=_("object"))
    def linked_object(self, job: DelayedJob) -> str:
        return object_link(job, self.admin_site)

    @admin.display(description=_("payload"))
    def formatted_payload(self, job: DelayedJob) -> str:
        text = json.dumps(job.payload, indent=2, sort_keys=True, ensure_ascii=False)
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', text)

    # Search ------------------------------------------------------------------------

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[DelayedJob], search_term: str
    ) -> tuple[QuerySet[DelayedJob], bool]:
        """Each word must match: an exact id, an exact key, or text in the payload."""
        terms = [
            unescape_string_literal(bit) if bit[:1] in "\"'" and bit[-1:] == bit[:1] else bit
            for bit in smart_split(search_term)
        ]
        terms = [term for term in terms if term]
        if not terms:
            return queryset, False
        # The payload's JSON as text: jsonb::text on PostgreSQL, the stored text on SQLite.
        # alias, not annotate: it is filtered on, never selected.
        results = queryset.alias(payload_text=Cast("payload", TextField()))
        for term in terms:
            results = results.filter(self._search_condition(term))
        return results, False

    @staticmethod
    def _search_condition(term: str) -> Q:
        id_match = ID_TERM.fullmatch(term)
        if id_match:
            pk = int(id_match.group(1))
            by_id = Q(pk=pk) if pk <= MAX_ID else Q(pk__in=[])
            if term.startswith("#"):
                return by_id
        else:
            by_id = Q(pk__in=[])
        condition = by_id | Q(key=term) | Q(payload_text__icontains=term)
        # SQLite keeps the JSON as Django wrote it, with non-ASCII characters, quotes and
        # backslashes escaped: look for that spelling too.
        escaped = json.dumps(term)[1:-1]
        if escaped != term:
            condition |= Q(payload_text__icontains=escaped)
        return condition

    # The dashboard -----------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        dashboard = path(
            "dashboard/",
            self.admin_site.admin_view(self.dashboard),
            name=f"{opts.app_label}_{opts.model_name}_dashboard",
        )
        # Before the default URLs: "<path:object_id>/" would take "dashboard/".
        return [dashboard, *super().get_urls()]

    def dashboard(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        # Imported here: the dashboard builds on this admin, not the other way round.
        from delayjobs.dashboard import dashboard_view

        return dashboard_view(request, self)

    # Actions -----------------------------------------------------------------------

    def _has_job_permission(self, request: HttpRequest, action: str) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.{action}_{self.opts.model_name}")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self._has_job_permission(request, "retry")

    def has_run_now_permission(self, request: HttpRequest) -> bool:
        return self._has_job_permission(request, "run_now")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self._has_job_permission(request, "cancel")

    def has_reschedule_permission(self, request: HttpRequest) -> bool:
        return self._has_job_permission(request, "reschedule")

    @admin.action(description=_("Retry selected jobs now"), permissions=["retry"])
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[DelayedJob]) -> None:
        self._apply(
            request,
            queryset,
            title=gettext("Retry"),
            statuses=RETRYABLE_STATUSES,
            rule=gettext("only finished jobs (not scheduled or running) can be retried"),
            change=api.retry,
            log=lambda job, was: (
                gettext("Retried with the admin action (was %(status)s).") % {"status": was}
            ),
        )

    @admin.action(description=_("Run selected scheduled jobs now"), permissions=["run_now"])
    def run_jobs_now(self, request: HttpRequest, queryset: QuerySet[DelayedJob]) -> None:
        self._apply(
            request,
            queryset,
            title=gettext("Run now"),
            statuses=(JobStatus.SCHEDULED,),
            rule=gettext("only scheduled jobs can be run now"),
            change=lambda job: api.reschedule(job, run_at=timezone.now()),
            log=lambda job, was: (
                gettext("Run now with the admin action (was due %(run_at)s).")
                % {"run_at": utc_iso(job.run_at)}
            ),
        )

    @admin.action(description=_("Cancel selected scheduled jobs"), permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[DelayedJob]) -> None:
        self._apply(
            request,
            queryset,
            title=gettext("Cancel"),
            statuses=(JobStatus.SCHEDULED,),
            rule=gettext("only scheduled jobs can be cancelled"),
            # 0: no longer scheduled (claimed or cancelled meanwhile).
            change=lambda job: api.cancel(job) == 1,
            log=lambda job, was: gettext("Cancelled with the admin action."),
        )

    @admin.action(description=_("Reschedule selected scheduled jobs…"), permissions=["reschedule"])
    def reschedule_jobs(
        self, request: HttpRequest, queryset: QuerySet[DelayedJob]
    ) -> HttpResponse | None:
        """An intermediate page asks for the new time, then posts back here to apply it."""
        confirmed = request.POST.get("post") == "yes"
        form = RescheduleForm(request.POST if confirmed else None)
        if confirmed and form.is_valid():
            run_at = form.cleaned_data["run_at"]
            self._apply(
                request,
                queryset,
                title=gettext("Reschedule"),
                statuses=(JobStatus.SCHEDULED,),
                rule=gettext("only scheduled jobs can be rescheduled"),
                change=lambda job: api.reschedule(job, run_at=run_at),
                log=lambda job, was: (
                    gettext("Rescheduled with the admin action from %(old)s to %(new)s.")
                    % {"old": utc_iso(job.run_at), "new": utc_iso(run_at)}
                ),
            )
            return None
        if not confirmed:
            form.initial = {"run_at": timezone.localtime().replace(microsecond=0)}
        return self._reschedule_page(request, queryset, form)

    def _reschedule_page(
        self, request: HttpRequest, queryset: QuerySet[DelayedJob], form: RescheduleForm
    ) -> TemplateResponse:
        ids = list(queryset.order_by("pk").values_list("pk", flat=True))
        listed = list(queryset.order_by("run_at", "pk")[:RESCHEDULE_LISTED])
        applicable = queryset.filter(status=JobStatus.SCHEDULED).count()
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Reschedule delayed jobs"),
            "opts": self.opts,
            "form": form,
            "jobs": [(job, status_badge(job.status)) for job in listed],
            "unlisted": len(ids) - len(listed),
            "selected": len(ids),
            "applicable": applicable,
            "ids": ids,
            "action": "reschedule_jobs",
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "time_zone": timezone.get_current_timezone_name(),
            "cancel_url": request.get_full_path(),
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/delayjobs/delayedjob/reschedule_selected.html", context
        )

    def _apply(
        self,
        request: HttpRequest,
        queryset: QuerySet[DelayedJob],
        *,
        title: str,
        statuses: Iterable[str],
        rule: str,
        change: Callable[[DelayedJob], Any],
        log: Callable[[DelayedJob, str], str],
    ) -> None:
        """Apply ``change`` to the selected jobs in one of ``statuses``, one job at a time.

        The status read here may be stale: ``change`` goes through the API, whose
        conditional updates refuse a job that moved on meanwhile (raising, or returning
        something false); such a job counts as skipped, with the reason. Each job changed
        gets an admin log entry naming the action and the user.
        """
        statuses = set(statuses)
        changed = skipped = 0
        problems: list[str] = []
        for job in queryset.order_by("pk"):
            if job.status not in statuses:
                skipped += 1
                continue
            was = job.status
            try:
                done = change(job)
            except DelayJobsError as exc:
                done, reason = False, str(exc)
            else:
                reason = gettext("it is no longer %(status)s") % {"status": was}
            if not done:
                skipped += 1
                problems.append(f"#{job.pk}: {reason}")
                continue
            changed += 1
            self.log_change(request, job, log(job, was))
        text = gettext("%(title)s: %(changed)d changed, %(skipped)d skipped.") % {
            "title": title,
            "changed": changed,
            "skipped": skipped,
        }
        if skipped > len(problems):
            text += " " + capfirst(rule) + "."
        if problems:
            text += " " + "; ".join(problems)
        self.message_user(request, text, messages.WARNING if skipped else messages.SUCCESS)


class DelayedJobInline(GenericTabularInline):
    """The jobs of an object (``schedule(..., obj=instance)``), newest first, read-only.

    Add it to any ModelAdmin: ``inlines = [DelayedJobInline]``. Shown to users who may
    view delayed jobs.
    """

    model = DelayedJob
    ct_field = "content_type"
    ct_fk_field = "object_id"
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ("-created_at", "-id")
    fields = ("job", "job_type", "status_display", "due", "lateness", "attempts", "key")
    readonly_fields = fields
    verbose_name = _("delayed job")
    due = moment_column(DelayedJob, "run_at")
    verbose_name_plural = _("delayed jobs")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[DelayedJob]:
        return with_paused_flag(super().get_queryset(request), paused_now(request))

    @admin.display(description=_("job"))
    def job(self, job: DelayedJob) -> str:
        return job_link(job, self.admin_site)

    @admin.display(description=_("status"))
    def status_display(self, job: DelayedJob) -> str:
        return status_badge(job.status, paused=getattr(job, "is_paused", False))

    @admin.display(description=_("lateness"))
    def lateness(self, job: DelayedJob) -> str:
        return job_lateness(job, timezone.now())


# Pauses and consumers ----------------------------------------------------------------


def pause_target(kind: str, name: str) -> dict[str, Any]:
    """The keyword arguments of pauses.pause/resume for a pause of ``kind``."""
    if kind == PauseKind.QUEUE:
        return {"queue": name, "job_type": None}
    return {"queue": None, "job_type": name}


class PauseForm(forms.ModelForm):
    class Meta:
        model = Pause
        fields = ("kind", "name")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["name"].help_text = gettext(
            "Registered job types: %(types)s. Their queues: %(queues)s."
        ) % {"types": ", ".join(registry.names()) or "-", "queues": ", ".join(registry.queues())}

    def clean(self) -> dict[str, Any]:
        data = super().clean() or self.cleaned_data
        kind, name = data.get("kind"), data.get("name")
        if not kind or not name:
            return data
        try:
            # The very check pause() makes: a well-formed queue, a registered job type.
            pauses.check_target(**pause_target(kind, name))
        except InvalidJob as exc:
            # On "name", which also keeps the unique constraint from adding its own error.
            self.add_error("name", str(exc))
            return data
        if Pause.objects.filter(kind=kind, name=name).exists():
            self.add_error(
                "name",
                gettext("The %(kind)s %(name)s is paused already.")
                % {"kind": PauseKind(kind).label, "name": name},
            )
        return data


@admin.register(Pause)
class PauseAdmin(RefusesNulInLists, admin.ModelAdmin):
    """Adding a pause pauses (add_pause); deleting it resumes (delete_pause)."""

    form = PauseForm
    list_display = ("kind", "name", "paused_at", "paused_by", "held_jobs")
    list_filter = ("kind",)
    # Bulk deletion would bypass pauses.resume (and the actions' own permissions).
    actions = None

    def get_fields(self, request: HttpRequest, obj: Pause | None = None) -> tuple[str, ...]:
        if obj is None:
            return ("kind", "name")
        return ("kind", "name", "paused_at", "paused_by")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A pause is on or off: there is nothing to edit.
        return False

    @admin.display(description=_("scheduled jobs held"))
    def held_jobs(self, pause: Pause) -> str:
        field = "queue" if pause.kind == PauseKind.QUEUE else "job_type"
        query = urlencode({"status__exact": JobStatus.SCHEDULED, f"{field}__exact": pause.name})
        url = reverse(f"{self.admin_site.name}:delayjobs_delayedjob_changelist")
        return format_html('<a href="{}?{}">{}</a>', url, query, gettext("see them"))

    def save_model(self, request: HttpRequest, obj: Pause, form: Any, change: bool) -> None:
        # pauses.pause writes the row and tells the consumers once it commits.
        pauses.pause(**pause_target(obj.kind, obj.name), by=request.user.get_username())
        saved = Pause.objects.get(kind=obj.kind, name=obj.name)
        # The admin's message, log entry and redirect need the row pause() wrote.
        obj.pk, obj.paused_at, obj.paused_by = saved.pk, saved.paused_at, saved.paused_by

    def delete_model(self, request: HttpRequest, obj: Pause) -> None:
        pauses.resume(**pause_target(obj.kind, obj.name))


@admin.register(Consumer)
class ConsumerAdmin(RefusesNulInLists, ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "worker_id",
        "hostname",
        "pid",
        "queues",
        "concurrency",
        "started",
        "seen",
        "heartbeat_age",
        "processed",
        "database_mode",
    )
    list_filter = ("hostname", "database_mode")
    search_fields = ("worker_id", "hostname")
    actions = None
    started = moment_column(Consumer, "started_at")
    seen = moment_column(Consumer, "last_seen")

    @admin.display(description=_("last heartbeat"), ordering="last_seen")
    def heartbeat_age(self, consumer: Consumer) -> str:
        return gettext("%(duration)s ago") % {
            "duration": format_duration(timezone.now() - consumer.last_seen)
        }


# The HTTP API keys admin (delayjobs.http), registered with the rest.
import delayjobs.http.admin  # noqa: E402, F401
