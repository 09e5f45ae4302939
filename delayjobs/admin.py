"""Admin: every job and every attempt, read-only, with a permission-gated Retry action."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from delayjobs import api
from delayjobs.exceptions import DelayJobsError
from delayjobs.models import RETRYABLE_STATUSES, DelayedJob, JobAttempt


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
    ordering = ("-started_at", "-id")
    fields = (
        "number",
        "outcome",
        "started_at",
        "finished_at",
        "lateness",
        "worker_id",
        "error",
        "formatted_traceback",
    )
    readonly_fields = fields

    @admin.display(description=_("traceback"))
    def formatted_traceback(self, attempt: JobAttempt) -> str:
        if not attempt.traceback:
            return "-"
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', attempt.traceback)


@admin.register(DelayedJob)
class DelayedJobAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("id", "job_type", "queue", "status", "run_at", "attempts", "key", "finished_at")
    list_filter = ("status", "job_type", "queue")
    search_fields = ("=key",)
    ordering = ("-run_at", "-id")
    date_hierarchy = "run_at"
    inlines = (JobAttemptInline,)
    actions = ("retry_jobs",)
    exclude = ("payload",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.fields if f.name != "payload"] + [
            "formatted_payload"
        ]

    @admin.display(description=_("payload"))
    def formatted_payload(self, job: DelayedJob) -> str:
        return format_html("<pre>{}</pre>", json.dumps(job.payload, indent=2, sort_keys=True))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[DelayedJob], search_term: str
    ) -> tuple[QuerySet[DelayedJob], bool]:
        """Search by exact key, and by id when the term is a number."""
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip().lstrip("#")
        if term.isdigit():
            results |= queryset.filter(pk=int(term))
        return results, may_have_duplicates

    def has_retry_permission(self, request: HttpRequest) -> bool:
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.retry_{opts.model_name}")

    @admin.action(description=_("Retry selected jobs now"), permissions=["retry"])
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[DelayedJob]) -> None:
        retried = skipped = 0
        problems: list[str] = []
        for job in queryset.order_by("pk"):
            if job.status not in RETRYABLE_STATUSES:
                skipped += 1
                continue
            try:
                api.retry(job)
            except DelayJobsError as exc:
                skipped += 1
                problems.append(f"#{job.pk}: {exc}")
            else:
                retried += 1
        self.message_user(
            request,
            ngettext("%d job scheduled to run again.", "%d jobs scheduled to run again.", retried)
            % retried,
            messages.SUCCESS,
        )
        if skipped:
            detail = f" {'; '.join(problems)}" if problems else ""
            self.message_user(
                request,
                ngettext(
                    "%d job skipped: only failed, cancelled or succeeded jobs can be retried.",
                    "%d jobs skipped: only failed, cancelled or succeeded jobs can be retried.",
                    skipped,
                )
                % skipped
                + detail,
                messages.WARNING,
            )
