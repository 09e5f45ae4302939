"""The meetings app's job types. Each one re-reads the current state before acting, because
delivery is at-least-once: a job may run twice, or after the meeting changed."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from django.core.mail import send_mail
from django.db import transaction
from django.utils.dateparse import parse_datetime

import delayjobs
from sampleproject.meetings.models import Meeting, Reminder, RoomRequest

if TYPE_CHECKING:
    from delayjobs.models import DelayedJob

log = logging.getLogger(__name__)
Status = Meeting.Status
#: How long before its meeting a reminder may be: the planner looks this far ahead.
MAX_REMIND_MINUTES = 24 * 60


class MeetingJob(delayjobs.JobType):
    """What the three meeting job types share: when they run, their payload, and the check
    that the meeting still exists and still has the time the job was scheduled for."""

    #: Suffix of the job's key, ``meeting:<pk>:<kind>``.
    kind: ClassVar[str]
    #: The meeting time the job belongs to; if it changed, the job is stale.
    time_field: ClassVar[str] = "starts_at"

    @classmethod
    def meeting_time(cls, meeting: Meeting) -> datetime:
        return getattr(meeting, cls.time_field)

    @classmethod
    def run_at(cls, meeting: Meeting) -> datetime:
        return cls.meeting_time(meeting)

    @classmethod
    def wanted(cls, meeting: Meeting, now: datetime) -> bool:
        """Whether a meeting in this state still needs this job."""
        raise NotImplementedError

    @classmethod
    def payload(cls, meeting: Meeting) -> dict[str, Any]:
        return {"meeting_id": meeting.pk, cls.time_field: cls.meeting_time(meeting).isoformat()}

    def plan(self, start: datetime, end: datetime) -> Iterator[dict[str, Any]]:
        """The pre-loader's safety net, every pass: this type's job for each meeting due in
        [start, end) that still wants one. Saving a meeting schedules its jobs already;
        this catches the one case saving cannot: a meeting moved while its job was
        running (a running job cannot be moved). Keys make planning twice add nothing."""
        # A reminder runs before its meeting: look that far ahead on the meeting's time.
        horizon = end + timedelta(minutes=MAX_REMIND_MINUTES)
        candidates = Meeting.objects.filter(
            **{f"{self.time_field}__gte": start, f"{self.time_field}__lt": horizon}
        )
        for meeting in candidates:
            run_at = self.run_at(meeting)
            if start <= run_at < end and self.wanted(meeting, start):
                yield {
                    "payload": self.payload(meeting),
                    "run_at": run_at,
                    "key": meeting.job_key(self.kind),
                }

    def execute(self, job: DelayedJob) -> None:
        meeting = Meeting.objects.filter(pk=job.payload["meeting_id"]).first()
        if meeting is None:
            log.info("%s job %s: meeting %s is gone", self.name, job.id, job.payload["meeting_id"])
            return
        # A meeting moved while this job was already running: its replacement job will act.
        if parse_datetime(job.payload[self.time_field]) != self.meeting_time(meeting):
            log.info("%s job %s: meeting %s has moved, skipped", self.name, job.id, meeting.pk)
            return
        self.handle(meeting, job)

    def handle(self, meeting: Meeting, job: DelayedJob) -> None:
        raise NotImplementedError


@delayjobs.register
class RemindAttendees(MeetingJob):
    name = "meetings.remind"
    kind = "remind"

    @classmethod
    def run_at(cls, meeting: Meeting) -> datetime:
        return meeting.remind_at

    @classmethod
    def wanted(cls, meeting: Meeting, now: datetime) -> bool:
        # A reminder after its time (a meeting created at the last minute) is noise.
        return meeting.status == Status.SCHEDULED and meeting.remind_at > now

    def handle(self, meeting: Meeting, job: DelayedJob) -> None:
        for attendee in meeting.attendees.all():
            # One transaction per attendee: if sending fails, the Reminder row rolls back
            # and the retry reminds exactly those not reminded yet.
            with transaction.atomic():
                _, created = Reminder.objects.get_or_create(
                    meeting=meeting, attendee=attendee, meeting_starts_at=meeting.starts_at
                )
                if created:
                    send_mail(
                        f"Reminder: {meeting.title} at {meeting.starts_at:%H:%M}",
                        f"{meeting.title} starts at {meeting.starts_at:%Y-%m-%d %H:%M %Z} "
                        f"in {meeting.room}.",
                        None,
                        [attendee.email],
                    )
                    log.info("Reminded %s of meeting %r", attendee.email, meeting.title)


@delayjobs.register
class StartMeeting(MeetingJob):
    name = "meetings.start"
    kind = "start"

    @classmethod
    def wanted(cls, meeting: Meeting, now: datetime) -> bool:
        return meeting.status == Status.SCHEDULED

    def handle(self, meeting: Meeting, job: DelayedJob) -> None:
        if Meeting.transition(meeting.pk, {Status.SCHEDULED}, Status.IN_PROGRESS):
            log.info("Meeting %r is in progress", meeting.title)


@delayjobs.register
class EndMeeting(MeetingJob):
    name = "meetings.end"
    kind = "end"
    time_field = "ends_at"

    @classmethod
    def wanted(cls, meeting: Meeting, now: datetime) -> bool:
        return meeting.status in {Status.SCHEDULED, Status.IN_PROGRESS}

    def handle(self, meeting: Meeting, job: DelayedJob) -> None:
        if Meeting.transition(meeting.pk, {Status.SCHEDULED, Status.IN_PROGRESS}, Status.ENDED):
            log.info("Meeting %r has ended", meeting.title)


MEETING_JOB_TYPES: tuple[type[MeetingJob], ...] = (RemindAttendees, StartMeeting, EndMeeting)


@delayjobs.register
class ExpireRoomRequest(delayjobs.JobType):
    name = "meetings.expire_request"

    def execute(self, job: DelayedJob) -> None:
        request = RoomRequest.objects.filter(pk=job.payload["room_request_id"]).first()
        if request is not None and request.expire():
            log.info("Room request %s expired unapproved: rejected", request.pk)
