"""The meetings app's job types, and the bindings that keep them in step with each meeting's
times (``delayjobs.bind``): saving a meeting schedules, moves or cancels its jobs. Each job
type re-reads the current state before acting, because delivery is at-least-once: a job may
run twice, or after its meeting changed."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

import delayjobs
from sampleproject.meetings.models import Meeting, Reminder

if TYPE_CHECKING:
    from delayjobs.bindings import Binding
    from delayjobs.models import DelayedJob

log = logging.getLogger(__name__)
Status = Meeting.Status
#: How long before its meeting a reminder may be: the planner looks this far ahead.
MAX_REMIND_MINUTES = 24 * 60


class MeetingJob(delayjobs.JobType):
    """What the three meeting job types share: the binding to one of the meeting's times,
    and the check that the meeting still exists, still has the time the job was scheduled
    for, and still wants the job. A job for which it does not ends "skipped"."""

    #: The meeting time the job is bound to; if it changed, the job is stale.
    time_field: ClassVar[str] = "starts_at"
    #: Meeting statuses in which the job is wanted (the binding's ``when``).
    statuses: ClassVar[frozenset[str]]
    binding: ClassVar[Binding]

    @classmethod
    def offset(cls, meeting: Meeting) -> timedelta:
        """How long after ``time_field`` the job is due."""
        return timedelta(0)

    @classmethod
    def wanted(cls, meeting: Meeting) -> bool:
        return meeting.status in cls.statuses

    @classmethod
    def payload(cls, meeting: Meeting) -> dict[str, Any]:
        # The time too: a job that finds its meeting at another time knows it is stale.
        time = getattr(meeting, cls.time_field)
        return {"meeting_id": meeting.pk, cls.time_field: time.isoformat()}

    @classmethod
    def bind(cls) -> None:
        cls.binding = delayjobs.bind(
            Meeting,
            cls.time_field,
            job_type=cls,
            offset=cls.offset,
            when=cls.wanted,
            payload=cls.payload,
        )

    def plan(self, start: datetime, end: datetime) -> Iterator[dict[str, Any]]:
        """The pre-loader's safety net, every pass: this type's job for each meeting due in
        [start, end) that still wants one. The binding schedules and moves jobs when a
        meeting is saved; this catches the one case it cannot: a meeting moved while its job
        was running (a running job cannot be moved). Keys make planning twice add nothing."""
        # A reminder runs before its meeting: look that far ahead on the meeting's time.
        horizon = end + timedelta(minutes=MAX_REMIND_MINUTES)
        candidates = Meeting.objects.filter(
            **{f"{self.time_field}__gte": start, f"{self.time_field}__lt": horizon}
        )
        for meeting in candidates:
            run_at = self.binding.run_at_for(meeting)
            if run_at is not None and start <= run_at < end:
                yield {
                    "payload": self.payload(meeting),
                    "run_at": run_at,
                    "key": self.binding.key_for(meeting),
                    "obj": meeting,
                }

    def current_meeting(self, job: DelayedJob) -> Meeting | None:
        """The job's meeting, if the job still applies to it; else ``None``."""
        meeting = Meeting.objects.filter(pk=job.payload["meeting_id"]).first()
        if meeting is None:
            log.info("%s job %s: meeting %s is gone", self.name, job.id, job.payload["meeting_id"])
            return None
        # Moved while this job was already running: the job for the new time will act.
        if parse_datetime(job.payload[self.time_field]) != getattr(meeting, self.time_field):
            log.info("%s job %s: meeting %s has moved", self.name, job.id, meeting.pk)
            return None
        if not self.wanted(meeting) or not self.still_useful(meeting):
            log.info("%s job %s: meeting %s is %s", self.name, job.id, meeting.pk, meeting.status)
            return None
        return meeting

    def still_useful(self, meeting: Meeting) -> bool:
        return True

    def should_run(self, job: DelayedJob) -> bool:
        return self.current_meeting(job) is not None

    def execute(self, job: DelayedJob) -> None:
        meeting = self.current_meeting(job)
        if meeting is not None:  # else it changed since should_run() said yes
            self.handle(meeting, job)

    def handle(self, meeting: Meeting, job: DelayedJob) -> None:
        raise NotImplementedError


@delayjobs.register
class RemindAttendees(MeetingJob):
    name = "meetings.remind"
    # Other services may schedule reminders over the HTTP API (sampleproject/urls.py
    # mounts it); closing orders, say, stays private to this project's code.
    public = True
    statuses = frozenset({Status.SCHEDULED})

    @classmethod
    def offset(cls, meeting: Meeting) -> timedelta:
        return -timedelta(minutes=meeting.remind_minutes)

    def still_useful(self, meeting: Meeting) -> bool:
        # Late is fine (a meeting created or moved past its reminder time still gets one),
        # but once the meeting has started, a reminder is noise.
        return timezone.now() < meeting.starts_at

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
    statuses = frozenset({Status.SCHEDULED})

    def handle(self, meeting: Meeting, job: DelayedJob) -> None:
        if Meeting.transition(meeting.pk, {Status.SCHEDULED}, Status.IN_PROGRESS):
            log.info("Meeting %r is in progress", meeting.title)


@delayjobs.register
class EndMeeting(MeetingJob):
    name = "meetings.end"
    time_field = "ends_at"
    statuses = frozenset({Status.SCHEDULED, Status.IN_PROGRESS})

    def handle(self, meeting: Meeting, job: DelayedJob) -> None:
        if Meeting.transition(meeting.pk, {Status.SCHEDULED, Status.IN_PROGRESS}, Status.ENDED):
            log.info("Meeting %r has ended", meeting.title)


MEETING_JOB_TYPES: tuple[type[MeetingJob], ...] = (RemindAttendees, StartMeeting, EndMeeting)
for meeting_job_type in MEETING_JOB_TYPES:
    meeting_job_type.bind()
