"""The admin of pauses: adding one pauses a queue or a job type (``pauses.pause``),
deleting it resumes (``pauses.resume``)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from delayjobs import pauses
from delayjobs.admin.lookups import RefusesNulInLists
from delayjobs.exceptions import InvalidJob
from delayjobs.jobtypes import registry
from delayjobs.models import JobStatus, Pause, PauseKind


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
