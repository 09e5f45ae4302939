"""The admin of delayed jobs: every job and its attempts, read-only; a search by id, key
or payload text; the dashboard's URL. State changes go through the actions
(``delayjobs.admin.actions``), each behind its own permission."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from datetime import timedelta
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import smart_split, unescape_string_literal
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
from delayjobs.admin.lookups import NulRefusingChangeList
from delayjobs.core.display import format_duration
from delayjobs.models import DelayedJob, JobAttempt, JobStatus

#: "#42" searches ids only; plain digits search ids, keys and payloads.
ID_TERM = re.compile(r"#?(\d+)")
#: Ids above this cannot exist (a 64-bit primary key); the lookup would overflow.
MAX_ID = 2**63 - 1


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
    refuses a NUL character in its query (``delayjobs.admin.lookups``)."""

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
