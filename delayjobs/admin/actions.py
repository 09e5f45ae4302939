"""The actions on selected jobs: retry, run now, cancel, reschedule (with its page asking
for the new time). Each goes through ``delayjobs.api``, one job at a time, and needs its
own permission (``DelayedJobAdmin.has_<name>_permission``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import ModelAdmin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.text import capfirst
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from delayjobs import api
from delayjobs.admin.columns import status_badge, utc_iso
from delayjobs.exceptions import DelayJobsError, InvalidJob
from delayjobs.models import RETRYABLE_STATUSES, DelayedJob, JobStatus
from delayjobs.validation import resolve_run_at

#: A datetime-local input has minute precision in most browsers, so "now" typed into it
#: is up to a minute ago: that much of the past still counts as now.
PAST_GRACE = timedelta(minutes=1)
#: The reschedule page lists this many of the selected jobs (all of them are moved).
RESCHEDULE_LISTED = 50


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
            value = resolve_run_at(value, None, now)
        except InvalidJob as exc:
            raise ValidationError(str(exc)) from None
        if value < now - PAST_GRACE:
            raise ValidationError(
                _("%(time)s is in the past: choose now or a later time."),
                params={"time": timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")},
            )
        return value


#: The jobs selected in the list.
Jobs = QuerySet[DelayedJob]


@admin.action(description=_("Retry selected jobs now"), permissions=["retry"])
def retry_jobs(model_admin: ModelAdmin[Any], request: HttpRequest, queryset: Jobs) -> None:
    Selection(model_admin, request, queryset).apply(
        title=gettext("Retry"),
        statuses=RETRYABLE_STATUSES,
        rule=gettext("only finished jobs (not scheduled or running) can be retried"),
        change=api.retry,
        log=lambda job, was: (
            gettext("Retried with the admin action (was %(status)s).") % {"status": was}
        ),
    )


@admin.action(description=_("Run selected scheduled jobs now"), permissions=["run_now"])
def run_jobs_now(model_admin: ModelAdmin[Any], request: HttpRequest, queryset: Jobs) -> None:
    Selection(model_admin, request, queryset).apply(
        title=gettext("Run now"),
        rule=gettext("only scheduled jobs can be run now"),
        change=lambda job: api.reschedule(job, run_at=timezone.now()),
        log=lambda job, was: (
            gettext("Run now with the admin action (was due %(run_at)s).")
            % {"run_at": utc_iso(job.run_at)}
        ),
    )


@admin.action(description=_("Cancel selected scheduled jobs"), permissions=["cancel"])
def cancel_jobs(model_admin: ModelAdmin[Any], request: HttpRequest, queryset: Jobs) -> None:
    Selection(model_admin, request, queryset).apply(
        title=gettext("Cancel"),
        rule=gettext("only scheduled jobs can be cancelled"),
        # 0: no longer scheduled (claimed or cancelled meanwhile).
        change=lambda job: api.cancel(job) == 1,
        log=lambda job, was: gettext("Cancelled with the admin action."),
    )


@admin.action(description=_("Reschedule selected scheduled jobs…"), permissions=["reschedule"])
def reschedule_jobs(
    model_admin: ModelAdmin[Any], request: HttpRequest, queryset: Jobs
) -> HttpResponse | None:
    """An intermediate page asks for the new time, then posts back here to apply it."""
    confirmed = request.POST.get("post") == "yes"
    form = RescheduleForm(request.POST if confirmed else None)
    if confirmed and form.is_valid():
        run_at = form.cleaned_data["run_at"]
        Selection(model_admin, request, queryset).apply(
            title=gettext("Reschedule"),
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
    return reschedule_page(model_admin, request, queryset, form)


def reschedule_page(
    model_admin: ModelAdmin[Any],
    request: HttpRequest,
    queryset: QuerySet[DelayedJob],
    form: RescheduleForm,
) -> TemplateResponse:
    ids = list(queryset.order_by("pk").values_list("pk", flat=True))
    listed = list(queryset.order_by("run_at", "pk")[:RESCHEDULE_LISTED])
    applicable = queryset.filter(status=JobStatus.SCHEDULED).count()
    context = {
        **model_admin.admin_site.each_context(request),
        "title": gettext("Reschedule delayed jobs"),
        "opts": model_admin.opts,
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
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/delayjobs/delayedjob/reschedule_selected.html", context)


@dataclass(frozen=True)
class Selection:
    """The jobs a user selected in the list, who they are, and the admin they act in."""

    model_admin: ModelAdmin[Any]
    request: HttpRequest
    queryset: QuerySet[DelayedJob]

    def apply(
        self,
        *,
        title: str,
        rule: str,
        change: Callable[[DelayedJob], Any],
        log: Callable[[DelayedJob, str], str],
        statuses: Iterable[str] = (JobStatus.SCHEDULED,),
    ) -> None:
        """Apply ``change`` to the selected jobs in one of ``statuses`` (by default the
        scheduled ones), one job at a time.

        The status read here may be stale: ``change`` goes through the API, whose
        conditional updates refuse a job that moved on meanwhile (raising, or returning
        something false); such a job counts as skipped, with the reason. Each job changed
        gets an admin log entry naming the action and the user.
        """
        statuses = set(statuses)
        changed = skipped = 0
        problems: list[str] = []
        for job in self.queryset.order_by("pk"):
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
            self.model_admin.log_change(self.request, job, log(job, was))
        text = gettext("%(title)s: %(changed)d changed, %(skipped)d skipped.") % {
            "title": title,
            "changed": changed,
            "skipped": skipped,
        }
        if skipped > len(problems):
            text += " " + capfirst(rule) + "."
        if problems:
            text += " " + "; ".join(problems)
        self.model_admin.message_user(
            self.request, text, messages.WARNING if skipped else messages.SUCCESS
        )
