"""Rooms, meetings, attendees, and the reminders sent to them."""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from sampleproject.common import SavedWithJobs


class Room(models.Model):
    name = models.CharField(max_length=100, unique=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Meeting(SavedWithJobs):
    """A meeting: its reminder, start and end jobs are bound to its times (``delay_jobs.py``)."""

    class Status(models.TextChoices):
        SCHEDULED = "scheduled", "Scheduled"
        IN_PROGRESS = "in_progress", "In progress"
        ENDED = "ended", "Ended"
        CANCELLED = "cancelled", "Cancelled"

    title = models.CharField(max_length=200)
    room = models.ForeignKey(Room, on_delete=models.PROTECT, related_name="meetings")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    # A float so that the demo can remind 15 seconds (0.25 min) before a meeting.
    remind_minutes = models.FloatField(default=15, validators=[MinValueValidator(0)])
    status = models.CharField(max_length=20, choices=Status, default=Status.SCHEDULED)

    class Meta:
        ordering = ["starts_at", "pk"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(ends_at__gt=models.F("starts_at")),
                name="meeting_ends_after_start",
            ),
        ]

    def __str__(self) -> str:
        return self.title

    def clean(self) -> None:
        if self.starts_at and self.ends_at and self.ends_at <= self.starts_at:
            raise ValidationError({"ends_at": "A meeting must end after it starts."})

    def move(self, by: timedelta) -> None:
        """Shift start and end; saving moves the meeting's jobs to the new times."""
        if self.status != self.Status.SCHEDULED:
            raise ValidationError(
                f"Only a scheduled meeting can be moved; this one is {self.status}."
            )
        self.starts_at += by
        self.ends_at += by
        self.save(update_fields=["starts_at", "ends_at"])

    @classmethod
    def transition(cls, pk: int, from_: set[str], to: str) -> bool:
        """Move a meeting to ``to`` if it is in one of ``from_``; report whether it moved.

        A conditional UPDATE, not save(): two runs of the same job (at-least-once) or a job
        racing an edit cannot both win, and the jobs' bindings have nothing to change (the
        job doing it is running; the others check the status when they run).
        """
        return bool(cls.objects.filter(pk=pk, status__in=from_).update(status=to))


class Attendee(models.Model):
    meeting = models.ForeignKey(Meeting, on_delete=models.CASCADE, related_name="attendees")
    name = models.CharField(max_length=100)
    email = models.EmailField()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["meeting", "email"], name="one_attendee_per_email"),
        ]

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"


class Reminder(models.Model):
    """A reminder that was sent: the proof, for tests and the demo, that the job ran."""

    meeting = models.ForeignKey(Meeting, on_delete=models.CASCADE, related_name="reminders")
    attendee = models.ForeignKey(Attendee, on_delete=models.CASCADE, related_name="reminders")
    # The start the reminder announced: a moved meeting deserves a new reminder, a job
    # that runs twice for the same start does not.
    meeting_starts_at = models.DateTimeField()
    sent_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["sent_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["meeting", "attendee", "meeting_starts_at"],
                name="one_reminder_per_attendee_and_start",
            ),
        ]

    def __str__(self) -> str:
        return f"Reminder of {self.meeting} to {self.attendee}"
