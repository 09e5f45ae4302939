"""The form of an operator's schedule (``source = database``) in the admin.

Every field is checked by the very functions that decide whether a schedule can tick
(``delayjobs.recurring.rules``, the payload's limits, the registry), so a schedule the
form accepts is one the pre-loader can make jobs of; each refusal is a field error saying
what to type instead.
"""

from __future__ import annotations

import functools
import zoneinfo
from datetime import timedelta
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from delayjobs.admin.api_keys import JobTypesField
from delayjobs.exceptions import InvalidJob, UnknownJobType
from delayjobs.jobtypes import MAX_LATENESS, MIN_LATENESS, registry
from delayjobs.models import Schedule
from delayjobs.names import is_name
from delayjobs.payload import normalize_payload
from delayjobs.recurring.rules import (
    cron_problem,
    format_interval,
    interval_problem,
    misfire_problem,
    timezone_problem,
)

#: What an operator's form edits; the rest of the row is the pre-loader's and pause's.
FORM_FIELDS = (
    "name",
    "job_type",
    "payload",
    "cron",
    "interval",
    "timezone",
    "misfire",
    "misfire_grace",
    "enabled",
)


class PayloadField(JobTypesField):
    """A JSON payload: text ``json`` refuses in any way is a form error, never a server
    error (the API key form's field, with its own message)."""

    default_error_messages = {"invalid": _('Enter the payload as JSON, e.g. {"report": 7}.')}


@functools.cache
def time_zone_names() -> tuple[str, ...]:
    # Read once per process: the tz database is hundreds of files.
    return tuple(sorted(zoneinfo.available_timezones()))


class TimeZoneInput(forms.TextInput):
    """A text input that suggests the IANA names (a datalist) and accepts any text, which
    the form then checks: the list is a help, not the validation."""

    list_id = "delayjobs-time-zones"

    def __init__(self) -> None:
        super().__init__(attrs={"list": self.list_id, "autocomplete": "off"})

    def render(
        self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None
    ) -> SafeString:
        options = format_html_join(
            "", '<option value="{}">', ((zone,) for zone in time_zone_names())
        )
        datalist = format_html('<datalist id="{}">{}</datalist>', self.list_id, options)
        return format_html("{}{}", super().render(name, value, attrs, renderer), datalist)


def recurring_type(name: str) -> bool:
    """Whether ``name`` is a registered job type with a recurrence (a code schedule's)."""
    try:
        return registry.get(name).recurrence is not None
    except UnknownJobType:
        return False


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = FORM_FIELDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        fields = self.fields
        if "job_type" in fields:
            choices = [(name, name) for name in registry.names()]
            current = self.instance.job_type
            if not current:  # a new schedule: no type chosen for the operator
                choices.insert(0, ("", "---------"))
            elif current not in registry:
                # Shown as it is, so that a save never silently swaps it for the first
                # choice; clean_job_type refuses it until a registered one is chosen.
                choices.insert(
                    0, (current, gettext("%(name)s (not registered)") % {"name": current})
                )
            fields["job_type"] = forms.ChoiceField(
                label=fields["job_type"].label,
                choices=choices,
                error_messages={
                    "invalid_choice": _(
                        "Unknown job type %(value)s: choose one registered in this code."
                    )
                },
            )
        if "payload" in fields:
            fields["payload"] = PayloadField(
                label=fields["payload"].label,
                required=False,
                initial=dict,
                help_text=_("JSON, given to every tick's job as its payload."),
            )
        if "timezone" in fields:
            fields["timezone"].widget = TimeZoneInput()
        if "interval" in fields:
            fields["interval"].help_text = _(
                "[DD] HH:MM:SS, e.g. 00:05:00 for every 5 minutes, 1 00:00:00 for every day; "
                "at least 1 second. Ticks are aligned to the epoch (:00, :05 ...). Or a cron."
            )
        if "misfire_grace" in fields:
            fields["misfire_grace"].help_text = _(
                "HH:MM:SS; a tick's job starting later than this is missed. Empty: the "
                "MISFIRE_GRACE setting."
            )

    # One field at a time --------------------------------------------------------------

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        if not is_name(name):
            raise ValidationError(
                _(
                    "A name is 1-200 letters, digits and '_.:-' (it is part of the key of "
                    "each of its jobs)."
                )
            )
        if recurring_type(name):
            raise ValidationError(
                _(
                    "%(name)s is the name of a job type with a recurrence: it belongs to "
                    "that type's schedule, defined in code. Choose another name."
                ),
                params={"name": name},
            )
        return name

    def clean_job_type(self) -> str:
        name: str = self.cleaned_data["job_type"]
        if name not in registry:
            raise ValidationError(
                _("Unknown job type %(value)s: choose one registered in this code."),
                params={"value": name},
            )
        return name

    def clean_payload(self) -> Any:
        try:
            return normalize_payload(self.cleaned_data.get("payload"))
        except InvalidJob as exc:
            raise ValidationError(str(exc)) from None

    def clean_timezone(self) -> str:
        zone = self.cleaned_data["timezone"].strip()
        if problem := timezone_problem(zone):
            raise ValidationError(problem)
        return zone

    def clean_interval(self) -> timedelta | None:
        interval: timedelta | None = self.cleaned_data.get("interval")
        if interval is not None and (problem := interval_problem(interval)):
            raise ValidationError(problem)
        return interval

    def clean_misfire(self) -> str:
        misfire: str = self.cleaned_data["misfire"]
        if problem := misfire_problem(misfire):
            raise ValidationError(problem)
        return misfire

    def clean_misfire_grace(self) -> timedelta | None:
        grace: timedelta | None = self.cleaned_data.get("misfire_grace")
        # A tick's job gets the grace as its max_lateness, which schedule() bounds.
        if grace is not None and not MIN_LATENESS <= grace <= MAX_LATENESS:
            raise ValidationError(
                _("The grace must be from %(low)s to %(high)s, or empty; got %(value)s."),
                params={
                    "low": format_interval(MIN_LATENESS),
                    "high": format_interval(MAX_LATENESS),
                    "value": format_interval(grace),
                },
            )
        return grace

    # The fields together -------------------------------------------------------------

    def clean(self) -> dict[str, Any]:
        data = super().clean() or self.cleaned_data
        if "cron" not in self.fields:
            return data
        cron = (data.get("cron") or "").strip()
        data["cron"] = cron
        interval = data.get("interval")
        if "interval" in self.errors:
            return data  # a bad interval was given: "both" or "neither" would mislead
        if cron and interval is not None:
            self.add_error(
                "cron", gettext("Give either a cron expression or an interval, not both.")
            )
        elif not cron and interval is None:
            self.add_error(
                "cron",
                gettext("Give either a cron expression or an interval, not neither."),
            )
        elif cron:
            zone = data.get("timezone")
            # The zone's own error is on its field; the expression is checked in UTC then.
            valid_zone = zone if zone and not timezone_problem(zone) else "UTC"
            if problem := cron_problem(cron, valid_zone):
                self.add_error("cron", problem)
        return data
