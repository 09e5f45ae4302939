"""Create the demo's data: everything it schedules fires within about a minute."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from delayjobs.models import DelayedJob
from sampleproject.meetings.models import Attendee, Meeting, Room
from sampleproject.orders.models import Order

# (title, starts in, ends in, reminder lead): seconds from now. The earliest job is a few
# seconds out, so the consumer, started right after this command, is up in time.
MEETINGS = [
    ("Stand-up", 20, 35, 15),
    ("Design review", 30, 45, 15),
    ("Retro", 25, 45, 15),  # then moved 10 s later, to show that its jobs move with it
]
ATTENDEES = [("Ada", "ada@example.com"), ("Grace", "grace@example.com")]
MOVE_RETRO_BY = timedelta(seconds=10)


class Command(BaseCommand):
    help = "Seed the demo: 3 meetings and 2 orders whose jobs fire within a minute."

    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        room, _ = Room.objects.get_or_create(name="Demo room")
        meetings = [self._meeting(room, now, *spec) for spec in MEETINGS]
        retro = meetings[-1]
        retro.move(MOVE_RETRO_BY)
        self.stdout.write(f"Moved {retro.title!r} by {MOVE_RETRO_BY.seconds} s: its jobs moved.")

        Order.objects.create(customer="Erin", total=Decimal("42.00"))
        paid = Order.objects.create(customer="Frank", total=Decimal("17.50"))
        # Paid after its close job was handed to Redis: the consumer may pop it, but the
        # cancelled row cannot be claimed, so the order stays paid.
        paid.pay()
        self.stdout.write(f"Placed 2 orders; paid order {paid.pk}, which cancelled its close job.")
        self._print_plan(now)

    def _meeting(
        self, room: Room, now: datetime, title: str, start: int, end: int, lead: int
    ) -> Meeting:
        meeting = Meeting.objects.create(
            title=title,
            room=room,
            starts_at=now + timedelta(seconds=start),
            ends_at=now + timedelta(seconds=end),
            remind_minutes=lead / 60,
        )
        Attendee.objects.bulk_create(
            Attendee(meeting=meeting, name=name, email=email) for name, email in ATTENDEES
        )
        return meeting

    def _print_plan(self, now: datetime) -> None:
        self.stdout.write("\nWhat will fire when:")
        self.stdout.write(
            f"  {'in':>7}  {'at (UTC)':<12}  {'job':<6}  {'type':<24}  {'key':<46}  status"
        )
        for job in DelayedJob.objects.order_by("run_at", "id"):
            seconds = (job.run_at - now).total_seconds()
            at = f"{job.run_at:%H:%M:%S.%f}"[:12]  # milliseconds, like the log lines
            self.stdout.write(
                f"  {seconds:>6.1f}s  {at:<12}  {job.pk:<6}  {job.job_type:<24}  "
                f"{job.key or '':<46}  {job.status}"
            )
