"""The admin of delayed jobs: every job and its attempts, read-only; a search by id, key
or payload text; the dashboard's URL. State changes go through the actions
(``delayjobs.admin.actions``), each behind its own permission."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from delayjobs.admin import actions as job_actions
from delayjobs.admin.columns import (
    job_lateness,
    moment_column,
    object_link,
    paused_now,
    status_badge,
    with_paused_flag,
)
from delayjobs.admin.dashboard import dashboard_view
from delayjobs.admin.estimates import EstimatedCountPaginator
from delayjobs.admin.lookups import DistinctValuesFilter, NulRefusingChangeList
from delayjobs.admin.search import search
from delayjobs.core.display import format_duration
from delayjobs.models import DelayedJob, JobAttempt, JobStatus

#: Attempts a job's page shows at most, the latest (a job that retries forever has many).
HISTORY_LIMIT = 50


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


def latest_attempts(attempts: QuerySet[JobAttempt], job: DelayedJob) -> QuerySet[JobAttempt]:
    """The HISTORY_LIMIT latest of ``attempts`` of ``job`` (the (job, -started_at) index);
    a formset cannot take a sliced queryset, so by their ids."""
    latest = list(
        attempts.filter(job=job)
        .order_by("-started_at", "-id")
        .values_list("pk", flat=True)[:HISTORY_LIMIT]
    )
    return attempts.filter(pk__in=latest)


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
    refuses a NUL character in its query (``delayjobs.admin.lookups``)."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        refuse_impossible_dates(request)
        return super().get_queryset(request, exclude_parameters)

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        attach_objects(self.result_list)


def refuse_impossible_dates(request: HttpRequest) -> None:
    """``?run_at__year=``/``__month=``/``__day=`` (the date hierarchy's links, kept working
    without it) that name no date are a bad lookup, as the date hierarchy had them: the
    database would fail on year 0 or month 13."""
    parts = [request.GET.get(f"run_at__{part}") for part in ("year", "month", "day")]
    if not any(part is not None for part in parts):
        return
    year, month, day = (
        part if part is not None else default
        for part, default in zip(parts, ("2000", "1", "1"), strict=True)
    )
    try:
        datetime(int(year), int(month), int(day))
    except (ValueError, OverflowError) as error:
        raise IncorrectLookupParameters(error) from error


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
    # The job type's and queue's values by an index probe each, not a DISTINCT of the table.
    list_filter = (
        "status",
        ("job_type", DistinctValuesFilter),
        ("queue", DistinctValuesFilter),
        RunAtFilter,
    )
    # No COUNT(*) of the whole table on a page load: it grows with the history. The list's
    # own count is the planner's estimate past estimate_above rows (get_paginator), and
    # the filters show no counts (facets count every row of every choice).
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    #: Rows above which the list's count is the planner's estimate (PostgreSQL); None:
    #: DELAYJOBS["ADMIN_ESTIMATE_ABOVE"] (or its default).
    estimate_above: int | None = None
    # get_search_results does the searching; this turns the search box on.
    search_fields = ("=key",)
    search_help_text = _(
        "An id (#42 for ids only), an exact key, or a key prefix ending in * (order:4*). "
        '"payload: text" searches the payload (slow on a large table: filter first). '
        "Several words: jobs matching all of them."
    )
    list_select_related = ("content_type",)
    # (run_at, id) and (status, run_at, id) indexes serve this order, filtered or not.
    ordering = ("-run_at", "-id")
    # No date_hierarchy: its SELECT DISTINCT of the truncated dates reads the whole table.
    # The "due" filter and ?run_at__year=/__month=/__day= (or __gte/__lt) filter by date.
    inlines = (JobAttemptInline,)
    actions = ("retry_jobs", "run_jobs_now", "cancel_jobs", "reschedule_jobs")
    # The actions' bodies live in delayjobs.admin.actions; Django calls each as
    # action(model_admin, request, queryset), which is how a method is called too.
    retry_jobs = job_actions.retry_jobs
    run_jobs_now = job_actions.run_jobs_now
    cancel_jobs = job_actions.cancel_jobs
    reschedule_jobs = job_actions.reschedule_jobs
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

    def get_formset_kwargs(
        self, request: HttpRequest, obj: Any, inline: Any, prefix: str
    ) -> dict[str, Any]:
        kwargs = super().get_formset_kwargs(request, obj, inline, prefix)
        if isinstance(inline, JobAttemptInline) and obj is not None:
            kwargs["queryset"] = latest_attempts(kwargs["queryset"], obj)
        return kwargs

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

    def action_checkbox(self, obj: Any) -> SafeString:
        """Django's own checkbox, the same HTML, without a form widget's template per row
        (a third of the list's rendering time at 100 rows)."""
        label = format_html(gettext("Select this object for an action - {}"), str(obj))
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            helpers.ACTION_CHECKBOX_NAME,
            str(obj.pk),
            label,
        )

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
        """Ids and keys through their indexes; ``payload: words`` in the payload's text
        (``delayjobs.admin.search``)."""
        return search(queryset, search_term), False

    # Counting ----------------------------------------------------------------------

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: Any,
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> EstimatedCountPaginator:
        paginator = EstimatedCountPaginator(queryset, per_page, orphans, allow_empty_first_page)
        paginator.threshold = self.estimate_above
        return paginator

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
        return dashboard_view(request, self)

    # Actions -----------------------------------------------------------------------

    # Each action's own permission (Meta.permissions); the actions' bodies are in
    # delayjobs.admin.actions.

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
