from __future__ import annotations

from argparse import ArgumentParser
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, OutputWrapper
from django.db import connections, transaction
from django.db.models import Count, QuerySet
from django.utils import timezone

from delayjobs.core.display import format_time
from delayjobs.management import base
from delayjobs.management.base import checked, flag
from delayjobs.models import DelayedJob, JobAttempt, jobs_database

DEFAULT_BATCH_SIZE = 1000
BAR_WIDTH = 30


class Progress:
    """Progress of the deletes on stderr: a bar redrawn in place on a terminal, otherwise
    a plain line at each tenth of the way (so a log gets a few lines, not one per batch)."""

    def __init__(self, stream: OutputWrapper, total: int, enabled: bool) -> None:
        self.stream = stream
        self.total = total
        self.enabled = enabled and total > 0
        self.tty = stream.isatty()
        self.tenths = 0

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        # The total was counted before the deletes; rows retried meanwhile are skipped,
        # so the count done may stay below it, never above.
        fraction = min(done / self.total, 1.0)
        if self.tty:
            filled = round(fraction * BAR_WIDTH)
            bar = "#" * filled + "-" * (BAR_WIDTH - filled)
            self.stream.write(f"\r[{bar}] {fraction:4.0%} {done}/{self.total}", ending="")
            self.stream.flush()
        elif int(fraction * 10) > self.tenths:
            self.tenths = int(fraction * 10)
            self.stream.write(f"Deleted {done}/{self.total} jobs ({fraction:.0%}).")

    def finish(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("")  # end the bar's line


class Command(BaseCommand):
    help = (
        "Delete finished jobs (succeeded, failed, cancelled, skipped, expired) that finished "
        "longer ago than --older-than, with their attempts, in batches of short "
        "transactions. Scheduled and running jobs are never deleted, so it is safe while "
        "consumers work."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--older-than",
            required=True,
            type=base.duration,
            metavar="AGE",
            help="Delete jobs finished longer ago than this: 90s, 30m, 12h, 14d...",
        )
        parser.add_argument(
            "--status",
            action="append",
            dest="statuses",
            type=base.finished_status,
            metavar="STATUS",
            help=(
                "succeeded, failed, cancelled, skipped or expired; repeat for several "
                "(default: all of them)."
            ),
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )
        parser.add_argument(
            "--batch-size",
            type=base.batch_size,
            default=DEFAULT_BATCH_SIZE,
            metavar="N",
            help=f"Jobs deleted per transaction, 1 to {base.MAX_BATCH_SIZE} "
            f"(default {DEFAULT_BATCH_SIZE}).",
        )

    def handle(
        self,
        *,
        verbosity: int,
        older_than: timedelta,
        statuses: list[str] | None,
        dry_run: bool,
        batch_size: int,
        **options: Any,
    ) -> None:
        # Checked here too: call_command passes keyword options (but for required
        # ones) to handle() unparsed.
        if statuses is not None and (not isinstance(statuses, list | tuple) or not statuses):
            raise CommandError(
                f"--status: give a list of statuses, got {base.shown(statuses)}; leave it out "
                f"for all of {', '.join(base.FINISHED_STATUSES)}."
            )
        chosen = sorted(
            {checked("--status", base.finished_status, status) for status in statuses}
            if statuses
            else set(base.FINISHED_STATUSES)
        )
        dry_run = flag("--dry-run", dry_run)
        batch_size = checked("--batch-size", base.batch_size, batch_size)
        older_than = checked("--older-than", base.duration, older_than)
        cutoff = timezone.now() - older_than
        prunable = DelayedJob.objects.filter(status__in=chosen, finished_at__lt=cutoff)
        per_status = dict(
            prunable.order_by().values_list("status").annotate(n=Count("id")).order_by("status")
        )
        total = sum(per_status.values())
        what = ", ".join(f"{status} {per_status.get(status, 0)}" for status in chosen)
        if dry_run:
            attempts = JobAttempt.objects.filter(job__in=prunable).count()
            if verbosity:
                self.stdout.write(
                    f"Would delete {total} jobs ({what}) finished before {format_time(cutoff)}, "
                    f"and their {attempts} attempts. Nothing was deleted (--dry-run)."
                )
            return
        progress = Progress(self.stderr, total, enabled=bool(verbosity))
        jobs = attempts = batches = 0
        last_pk = 0
        while True:
            # Keyset pages by primary key: a row skipped below (retried meanwhile) is not
            # looked at again, so the loop ends even while rows change under it.
            ids = list(
                prunable.filter(pk__gt=last_pk)
                .order_by("pk")
                .values_list("pk", flat=True)[:batch_size]
            )
            if not ids:
                break
            last_pk = ids[-1]
            deleted_jobs, deleted_attempts = delete_batch(prunable.filter(pk__in=ids))
            jobs += deleted_jobs
            attempts += deleted_attempts
            batches += 1
            progress.update(jobs)
        progress.finish()
        if verbosity:
            self.stdout.write(
                f"Deleted {jobs} jobs and their {attempts} attempts, finished before "
                f"{format_time(cutoff)} ({', '.join(chosen)}), in {batches} batches."
            )


def delete_batch(doomed: QuerySet[DelayedJob]) -> tuple[int, int]:
    """Delete ``doomed`` and its attempts in one short transaction; (jobs, attempts).

    ``doomed`` carries the status and finished_at conditions, so every statement
    re-checks them: a job retried since the page was read is active again, and stays,
    with its history.
    """
    using = jobs_database()
    with transaction.atomic(using=using):
        if connections[using].features.has_select_for_update:
            # PostgreSQL: lock the rows first, so that a retry() of one of them waits for
            # this commit (then finds the job gone) rather than changing it between the
            # deletes below.
            list(doomed.select_for_update().order_by("pk").values_list("pk", flat=True))
        # On SQLite this write comes first, so the transaction holds the database's write
        # lock from its first statement: nothing can change between the two deletes.
        attempts, _ = JobAttempt.objects.filter(job__in=doomed).delete()
        _, per_model = doomed.delete()
    return per_model.get(DelayedJob._meta.label, 0), attempts
