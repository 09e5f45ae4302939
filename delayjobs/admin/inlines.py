"""The jobs of any object on that object's own admin page (``DelayedJobInline``, a
documented path through ``delayjobs.admin``)."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.contenttypes.admin import GenericTabularInline
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from delayjobs.admin.columns import (
    job_lateness,
    job_link,
    moment_column,
    paused_now,
    status_badge,
    with_paused_flag,
)
from delayjobs.admin.jobs import ReadOnlyMixin
from delayjobs.models import DelayedJob


class DelayedJobInline(ReadOnlyMixin, GenericTabularInline):
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
