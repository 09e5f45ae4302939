"""A small server-rendered UI: meetings (list, create, move)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from sampleproject.meetings.forms import MeetingForm, MoveMeetingForm
from sampleproject.meetings.models import Attendee, Meeting


def _render_meetings(
    request: HttpRequest, form: MeetingForm | None = None, status: int = 200
) -> HttpResponse:
    meetings = Meeting.objects.select_related("room").prefetch_related("attendees")
    context = {"meetings": meetings, "form": form or MeetingForm(), "move_form": MoveMeetingForm()}
    return render(request, "meetings/meeting_list.html", context, status=status)


@require_GET
def meeting_list(request: HttpRequest) -> HttpResponse:
    return _render_meetings(request)


@require_POST
def meeting_create(request: HttpRequest) -> HttpResponse:
    form = MeetingForm(request.POST)
    if not form.is_valid():
        return _render_meetings(request, form, status=400)
    # The attendees are read when the reminder runs, so they may be added after the save
    # that scheduled it; one transaction still keeps a half-created meeting out of sight.
    with transaction.atomic():
        meeting = form.save()
        Attendee.objects.bulk_create(
            Attendee(meeting=meeting, name=name, email=email)
            for name, email in form.cleaned_data["attendees"]
        )
    messages.success(request, f"Meeting {meeting.title!r} scheduled, with its jobs.")
    return redirect("meetings:list")


@require_POST
def meeting_move(request: HttpRequest, pk: int) -> HttpResponse:
    meeting = get_object_or_404(Meeting, pk=pk)
    form = MoveMeetingForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give the number of minutes to move the meeting by.")
        return redirect("meetings:list")
    minutes = form.cleaned_data["minutes"]
    try:
        meeting.move(timedelta(minutes=minutes))
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Moved {meeting.title!r} by {minutes} min; its jobs moved too.")
    return redirect("meetings:list")
