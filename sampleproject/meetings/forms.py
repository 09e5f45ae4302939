"""Forms of the meetings UI."""

from __future__ import annotations

from email.utils import getaddresses

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from sampleproject.meetings.models import Meeting

# The browser's own picker; the value is read in the current time zone (UTC here).
DATETIME_WIDGET = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")


class MeetingForm(forms.ModelForm):
    attendees = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text='Comma or newline separated, "Name <email>" or just the email.',
    )

    class Meta:
        model = Meeting
        fields = ["title", "room", "starts_at", "ends_at", "remind_minutes"]
        widgets = {"starts_at": DATETIME_WIDGET, "ends_at": DATETIME_WIDGET}

    def clean_attendees(self) -> list[tuple[str, str]]:
        text = self.cleaned_data["attendees"].replace("\n", ",")
        people = [(name, email) for name, email in getaddresses([text]) if email]
        for _, email in people:
            try:
                validate_email(email)
            except ValidationError:
                raise ValidationError(f"{email!r} is not an email address.") from None
        return [(name or email.split("@")[0], email) for name, email in people]


class MoveMeetingForm(forms.Form):
    minutes = forms.IntegerField(help_text="Negative moves the meeting earlier.")
