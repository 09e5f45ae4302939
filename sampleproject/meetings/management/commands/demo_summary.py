"""Print what happened in the demo: jobs by status, each job's lateness, the business state."""

from __future__ import annotations

import statistics
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Count
from django.utils import timezone

from delayjobs.models import DelayedJob, JobAttempt, JobStatus
from sampleproject.meetings.models import Meeting, Reminder
from sampleproject.orders.models import Order

#: --check: a job started this late or later did not run "on time" (the demo's jobs start
#: within a few milliseconds; a whole second means something waited for a poll or a pass).
ON_TIME = timedelta(seconds=1)
#: --check judges jobs due at least this long before the summary: a job due in the last
#: moments before the consumer stopped may rightly be unfinished.
SETTLED = timedelta(seconds=2)
#: --check: the end states of the demo's jobs (the paid order's close job is cancelled).
EXPECTED_END_STATES = {JobStatus.SUCCEEDED, JobStatus.CANCELLED}


def ms(delta: timedelta) -> float:
    return delta.total_seconds() * 1000


class Command(BaseCommand):
    help = "Summarize the demo from the database: jobs, attempts and their lateness, outcomes."

    def add_arguments(self, parser: CommandParser) -> None:
        help = f"fail unless every job due ended as expected, less than {ON_TIME} late"
        parser.add_argument("--check", action="store_true", help=help)

    def handle(self, *args: Any, **options: Any) -> None:
        self._jobs()
        self._business_state()
        if options["check"]:
            self._check()

    def _check(self) -> None:
        """Raise CommandError naming each job that did not end as expected, on time."""
        due = DelayedJob.objects.filter(run_at__lte=timezone.now() - SETTLED).order_by("pk")
        problems = [
            f"job {job.pk} ({job.job_type}) ended {job.status}"
            for job in due
            if job.status not in EXPECTED_END_STATES
        ]
        attempts = JobAttempt.objects.filter(job__in=due).order_by("pk")
        problems += [
            f"job {a.job_id} attempt {a.number} started {ms(a.lateness):.1f} ms after its due time"
            for a in attempts
            if not timedelta(0) <= a.lateness < ON_TIME
        ]
        succeeded = due.filter(status=JobStatus.SUCCEEDED).count()
        if not succeeded:
            problems.append("no job succeeded")
        if problems:
            raise CommandError("Demo check failed: " + "; ".join(problems))
        self.stdout.write(f"\nDemo check passed: {succeeded} jobs succeeded on time.")

    def _jobs(self) -> None:
        counts = DelayedJob.objects.values_list("status").annotate(n=Count("id")).order_by("status")
        by_status = ", ".join(f"{status} {n}" for status, n in counts) or "none"
        self.stdout.write(f"\nJobs by status: {by_status}")

        self.stdout.write(
            f"  {'job':<5} {'type':<24} {'key':<46} {'status':<10} lateness of each attempt"
        )
        first_lateness: list[float] = []
        for job in DelayedJob.objects.order_by("run_at", "id").prefetch_related("history"):
            history = sorted(job.history.all(), key=lambda attempt: attempt.number)
            if history:
                first_lateness.append(ms(history[0].lateness))
            lateness = ", ".join(f"{ms(a.lateness):.1f} ms ({a.outcome})" for a in history) or "-"
            self.stdout.write(
                f"  {job.pk:<5} {job.job_type:<24} {job.key or '':<46} {job.status:<10} {lateness}"
            )
        if first_lateness:
            self.stdout.write(
                f"Lateness of first attempts: median {statistics.median(first_lateness):.1f} ms, "
                f"max {max(first_lateness):.1f} ms over {len(first_lateness)} jobs."
            )

    def _business_state(self) -> None:
        self.stdout.write("\nMeetings:")
        for meeting in Meeting.objects.all():
            sent = Reminder.objects.filter(meeting=meeting).count()
            self.stdout.write(
                f"  {meeting.title:<16} {meeting.get_status_display():<12} reminders sent: {sent}"
            )
        self.stdout.write("Orders:")
        for order in Order.objects.order_by("pk"):
            self.stdout.write(f"  #{order.pk} of {order.customer}: {order.status}")
