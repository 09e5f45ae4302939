"""The admin of recurring schedules: every schedule, code and database, with its next ticks
and its latest tick's outcome; pause and resume; an operator's schedules edited here.

A code schedule (a job type's ``recurrence``) is the code's: its page is read-only, and
only pausing and resuming it is the admin's, no deploy needed. An operator's schedule
(``source = database``) is made and edited with ``ScheduleForm``, whose checks are the
pre-loader's own. Pausing and resuming go through ``delayjobs.recurring.definitions`` (which also
cancels the jobs of coming ticks), behind their own permission, ``pause_schedule``, as
POSTs only: the list's actions and the buttons on a schedule's page.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from delayjobs.admin import schedule_columns as columns
from delayjobs.admin.columns import moment_column
from delayjobs.admin.lookups import RefusesNulInLists
from delayjobs.admin.schedule_form import ScheduleForm
from delayjobs.models import Schedule
from delayjobs.models.schedules import ScheduleSource
from delayjobs.recurring.definitions import (
    TIMING_FIELDS,
    add_schedule,
    definition_problem,
    next_ticks,
    pause_schedule,
    restart_ticks,
    resume_schedule,
    sync_code_schedules,
)

#: Ticks listed per schedule.
NEXT_TICKS = 5
#: On a schedule's page, below its definition: what it is doing.
STATE_FIELDS = (
    "when",
    "status",
    "coming_ticks",
    "last_outcome",
    "materialised",
    "updated",
)


def ticks_from_code(schedule: Schedule | None) -> bool:
    """Whether ``schedule`` is a code schedule whose job type still recurs: the code
    recreates its row, so it is only paused, never edited or deleted here."""
    return (
        schedule is not None
        and schedule.source == ScheduleSource.CODE
        and not definition_problem(schedule)
    )


@admin.register(Schedule)
class ScheduleAdmin(RefusesNulInLists, admin.ModelAdmin):
    form = ScheduleForm
    list_display = (
        "name",
        "source",
        "job_type",
        "when",
        "time_zone",
        "misfire_shown",
        "status",
        "coming_ticks",
        "last_outcome",
    )
    # No filters: schedules are few, and the table needs the page's width.
    search_fields = ("name", "job_type")
    actions = ("pause_schedules", "resume_schedules")

    # Pages ---------------------------------------------------------------------------

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # A code schedule is listed, and can be paused, before the first pre-loader pass.
        for problem in sync_code_schedules():
            self.message_user(request, problem, messages.WARNING)
        return super().changelist_view(request, extra_context)

    def get_fieldsets(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        definition = (None, {"fields": ("name", "defined_in", "job_type", "payload")})
        timing = (
            _("When"),
            {"fields": ("cron", "interval", "timezone", "misfire", "misfire_grace")},
        )
        if obj is None:
            return [
                (None, {"fields": ("name", "job_type", "payload")}),
                timing,
                (_("State"), {"fields": ("enabled",)}),
            ]
        return [definition, timing, (_("State"), {"fields": STATE_FIELDS})]

    def get_readonly_fields(
        self, request: HttpRequest, obj: Schedule | None = None
    ) -> tuple[str, ...]:
        if obj is None:
            return ()
        # A schedule's name is in the keys of its jobs: renamed, it would lose them.
        return ("name", "defined_in", *STATE_FIELDS)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Schedule | None = None,
    ) -> HttpResponse:
        if obj is not None and self.has_pause_permission(request):
            verb = "resume" if not obj.enabled else "pause"
            context["schedule_toggle"] = {
                "url": reverse(self._url_name(verb), args=[quote(obj.pk)]),
                "name": verb,
                "label": gettext("Resume") if verb == "resume" else gettext("Pause"),
            }
        return super().render_change_form(request, context, add, change, form_url, obj)

    # Permissions ---------------------------------------------------------------------

    def has_change_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        # A code schedule's definition is the code's, even once its type is gone from the
        # code (such a row is deleted, not edited): its page is a view.
        if obj is not None and obj.source == ScheduleSource.CODE:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return not ticks_from_code(obj) and super().has_delete_permission(request, obj)

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.pause_{self.opts.model_name}")

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        # Deleting in bulk would skip delete_view's refusal and delete_model's pause.
        actions.pop("delete_selected", None)
        return actions

    # Saving and deleting -------------------------------------------------------------

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        if not change:
            paused = not obj.enabled
            obj.enabled = True
            add_schedule(obj)  # ticks from now on
            if paused:  # made paused: with when and by whom, as pausing it says
                saved = pause_schedule(obj, by=request.user.get_username())
                obj.enabled, obj.paused_at, obj.paused_by = False, saved.paused_at, saved.paused_by
            return
        # Only what the form changed: the cursor and the pause are the pre-loader's and
        # the pause buttons', and may have moved since the page was read.
        changed = [name for name in form.changed_data if name in form.fields]
        obj.save(update_fields=[*changed, "updated_at"])
        if TIMING_FIELDS.intersection(changed):
            # The jobs already made for coming ticks follow the old definition.
            restart_ticks(obj)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        obj = self.get_object(request, unquote(object_id))
        if ticks_from_code(obj) and super().has_delete_permission(request, obj):
            assert obj is not None  # ticks_from_code says so
            self.message_user(
                request,
                gettext(
                    "The schedule %(name)s is defined in code (job type %(name)s has a "
                    "recurrence): deleted, it would be made again at once. Pause it here, "
                    "or remove the recurrence from the code."
                )
                % {"name": obj.name},
                messages.ERROR,
            )
            return HttpResponseRedirect(reverse(self._url_name("change"), args=[quote(obj.pk)]))
        return super().delete_view(request, object_id, extra_context)

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        # Its coming ticks' jobs are cancelled first: a deleted schedule runs nothing more.
        pause_schedule(obj, by=request.user.get_username())
        super().delete_model(request, obj)

    # Pause and resume ----------------------------------------------------------------

    @admin.action(description=_("Pause selected schedules"), permissions=["pause"])
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        by = request.user.get_username()
        selected = list(queryset.order_by("name"))
        # A schedule read as paused is left alone: its pause says who, and since when.
        paused = [schedule for schedule in selected if schedule.enabled]
        for schedule in paused:
            pause_schedule(schedule, by=by)
            self.log_change(request, schedule, gettext("Paused with the admin action."))
        text = ngettext(
            "%(count)d schedule paused; the jobs of its coming ticks are cancelled.",
            "%(count)d schedules paused; the jobs of their coming ticks are cancelled.",
            len(paused),
        )
        self._report(request, text, len(paused), gettext("%(count)d already paused."), selected)

    @admin.action(description=_("Resume selected schedules"), permissions=["pause"])
    def resume_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        selected = list(queryset.order_by("name"))
        resumed = [schedule for schedule in selected if not schedule.enabled]
        for schedule in resumed:
            resume_schedule(schedule)
            self.log_change(request, schedule, gettext("Resumed with the admin action."))
        text = ngettext(
            "%(count)d schedule resumed: it ticks again from its next tick.",
            "%(count)d schedules resumed: they tick again from their next tick.",
            len(resumed),
        )
        self._report(request, text, len(resumed), gettext("%(count)d not paused."), selected)

    def _report(
        self, request: HttpRequest, text: str, done: int, left: str, selected: list[Schedule]
    ) -> None:
        """``text`` about the ``done`` schedules, then ``left`` about those that were
        already as asked."""
        parts = [text % {"count": done}] if done else []
        if len(selected) > done:
            parts.append(left % {"count": len(selected) - done})
        self.message_user(request, " ".join(parts), messages.SUCCESS)

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        views = [
            path(
                f"<path:object_id>/{verb}/",
                self.admin_site.admin_view(view),
                name=f"{opts.app_label}_{opts.model_name}_{verb}",
            )
            for verb, view in (("pause", self.pause_view), ("resume", self.resume_view))
        ]
        # Before the default URLs: "<path:object_id>/" would take ".../pause/".
        return [*views, *super().get_urls()]

    def pause_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._toggle(request, object_id, pause=True)

    def resume_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._toggle(request, object_id, pause=False)

    def _toggle(self, request: HttpRequest, object_id: str, *, pause: bool) -> HttpResponse:
        """The Pause or Resume button of a schedule's page: a POST, with the permission."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_pause_permission(request):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404(gettext("No schedule with the id %(id)s.") % {"id": object_id})
        if pause:
            obj = pause_schedule(obj, by=request.user.get_username())
            text = gettext(
                "The schedule %(name)s is paused; the jobs of its coming ticks are cancelled."
            )
            self.log_change(request, obj, gettext("Paused with the button."))
        else:
            obj = resume_schedule(obj)
            text = gettext("The schedule %(name)s is resumed: it ticks again from its next tick.")
            self.log_change(request, obj, gettext("Resumed with the button."))
        self.message_user(request, text % {"name": obj.name}, messages.SUCCESS)
        return HttpResponseRedirect(reverse(self._url_name("change"), args=[quote(obj.pk)]))

    def _url_name(self, view: str) -> str:
        return f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_{view}"

    # Columns -------------------------------------------------------------------------

    materialised = moment_column(Schedule, "materialised_until", precise=True)
    updated = moment_column(Schedule, "updated_at", precise=True)

    @admin.display(description=_("defined in"))
    def defined_in(self, schedule: Schedule) -> str:
        return columns.defined_in(schedule)

    @admin.display(description=_("when"))
    def when(self, schedule: Schedule) -> str:
        return columns.describe(schedule)

    @admin.display(description=_("time zone"), ordering="timezone")
    def time_zone(self, schedule: Schedule) -> str:
        return columns.time_zone(schedule)

    @admin.display(description=_("misfire"), ordering="misfire")
    def misfire_shown(self, schedule: Schedule) -> str:
        return columns.misfire(schedule)

    @admin.display(description=_("status"), ordering="enabled")
    def status(self, schedule: Schedule) -> str:
        return columns.status(schedule)

    @admin.display(description=_("next ticks"))
    def coming_ticks(self, schedule: Schedule) -> str:
        if not schedule.enabled:
            return gettext("none while paused")
        ticks = next_ticks(schedule, NEXT_TICKS)
        return columns.format_ticks(ticks, columns.zone_of(schedule))

    @admin.display(description=_("last outcome"))
    def last_outcome(self, schedule: Schedule) -> str:
        return columns.last_outcome(schedule, self.admin_site)
