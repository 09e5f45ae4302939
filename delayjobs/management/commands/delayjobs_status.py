from __future__ import annotations

import json
from argparse import ArgumentParser
from collections.abc import Iterator
from typing import Any

from django.core.management.base import BaseCommand

from delayjobs.api import stats
from delayjobs.core import display
from delayjobs.management.base import flag
from delayjobs.models import JobStatus


class Command(BaseCommand):
    help = (
        "Show jobs by status and job type, paused queues and job types, the oldest overdue "
        "job, jobs due in the next hour, recent failures, lateness, live consumers and the "
        "fleet-wide limits at work. "
        "--json prints the same figures as one JSON document."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON, for machines.")

    def handle(self, *, json: bool, **options: Any) -> None:
        as_json = flag("--json", json)
        figures = stats.collect()
        if as_json:
            self.stdout.write(_dumps(figures.as_dict()))
        else:
            self.stdout.write("\n".join(report(figures)))


def _dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)


def report(figures: stats.Stats) -> Iterator[str]:
    """The figures as lines for people."""
    when, at = display.format_duration, display.format_time
    yield f"delayjobs status at {at(figures.now)}"
    yield ""
    yield "Jobs: " + " · ".join(
        f"{figures.by_status.get(status, 0)} {status}" for status in JobStatus.values
    )
    if figures.by_job_type:
        yield from _table(
            ["job type", *JobStatus.values],
            [
                [name + (" (paused)" if name in figures.paused.job_types else "")]
                + [str(counts.get(status, 0)) for status in JobStatus.values]
                for name, counts in figures.by_job_type.items()
            ],
        )
    paused = [
        f"{p.kind.replace('_', ' ')} {p.name} (since {at(p.paused_at)}"
        + (f", by {p.paused_by})" if p.paused_by else ")")
        for p in figures.pauses
    ]
    yield "Paused: " + ("; ".join(paused) if paused else "nothing")
    overdue = figures.oldest_overdue
    if overdue:
        yield (
            f"Oldest overdue job: #{overdue.id} {overdue.job_type} (queue {overdue.queue}), "
            f"due {at(overdue.run_at)}, {when(overdue.late)} late"
        )
    else:
        yield "Oldest overdue job: none"
    due = f"Due in the next hour: {figures.due_next_hour} jobs"
    if figures.due_next_hour:
        counts = figures.due_per_minute
        busiest = counts.index(max(counts))
        due += (
            f"; busiest minute {stats.format_clock(figures.minute(busiest))} with {counts[busiest]}"
        )
    yield due
    failures = f"Failed attempts in the last 24 h: {figures.failures}"
    if figures.failures:
        outcomes = " · ".join(
            f"{outcome} {n}" for outcome, n in figures.failures_by_outcome.items()
        )
        failures += f" ({outcomes})"
    yield failures
    for failure in figures.latest_failures:
        first_line = failure.error.splitlines()[0] if failure.error else "-"
        yield (
            f"  #{failure.job_id} {failure.job_type}, attempt {failure.attempt} "
            f"{failure.outcome} at {at(failure.finished_at)}: {first_line}"
        )
    lateness = figures.lateness
    yield (
        f"Lateness, last hour ({lateness.count} attempts"
        + (", the latest only" if lateness.sampled else "")
        + "): "
        + " · ".join(f"{label} {when(value)}" for label, value in lateness.figures())
    )
    yield f"Live consumers: {len(figures.consumers)}"
    for consumer in figures.consumers:
        mode = ", Redis-down mode" if consumer.database_mode else ""
        if consumer.clock_offset is not None:
            mode += f"; clock offset {consumer.clock_offset:+.3f} s"
            if consumer.clock_skewed:
                mode += " (WARNING: this host's clock is off; fix its time sync)"
        yield (
            f"  {consumer.worker_id} on {consumer.hostname} (pid {consumer.pid}), queues "
            f"{', '.join(consumer.queues) or '-'}; running {len(consumer.running)}/"
            f"{consumer.concurrency}; processed {consumer.processed}; last heartbeat "
            f"{when(figures.now - consumer.last_seen)} ago{mode}"
        )
        for job in consumer.running:
            yield f"    #{job.id} {job.job_type} since {at(job.started_at)}"
    yield from _limits(figures)
    if figures.running_elsewhere:
        yield "Running jobs of workers without a live heartbeat:"
        for job in figures.running_elsewhere:
            yield f"  #{job.id} {job.job_type} on {job.worker_id or '-'}"


#: Limit keys listed by the status; the busiest first.
LIMIT_ROWS = 50


def _limits(figures: stats.Stats) -> Iterator[str]:
    """The fleet-wide limits at work: per group and key, running / allowed, the starts in
    the rate's window / allowed, and the jobs due but waiting."""
    if not figures.limits:
        return
    yield f"Fleet-wide limits ({len(figures.limits)} key(s) busy):"
    rows = []
    for usage in figures.limits[:LIMIT_ROWS]:
        rows.append([usage.label, usage.shown_running, usage.shown_starts, str(usage.waiting)])
    yield from _table(["limit key", "running", "starts in window", "waiting"], rows)
    if len(figures.limits) > LIMIT_ROWS:
        yield f"  ... and {len(figures.limits) - LIMIT_ROWS} more"


def _table(header: list[str], rows: list[list[str]]) -> Iterator[str]:
    """An aligned table: the first column left-aligned, the numbers right-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)
        ]
        yield "  " + "  ".join(cells).rstrip()
