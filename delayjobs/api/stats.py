"""The operational figures of delayjobs, for the admin dashboard and ``delayjobs_status``.

``collect()`` reads everything in a fixed number of queries (``QUERIES``), whatever the
number of jobs, job types or consumers, so the dashboard costs the same on a busy day.
The result is made of dataclasses; ``Stats.as_dict()`` gives plain JSON-ready values
(datetimes as ISO 8601 strings, durations as seconds).

Paused work is counted in the status tables but left out of "oldest overdue" and "due in
the next hour": it waits on purpose, and the figures answer "is work running late?".
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count
from django.db.models.functions import TruncMinute
from django.utils import timezone

from delayjobs.api.limits import LimitUsage, limit_usage
from delayjobs.conf import settings
from delayjobs.models import (
    AttemptOutcome,
    Consumer,
    DelayedJob,
    JobAttempt,
    JobStatus,
    Pause,
    PauseKind,
)
from delayjobs.pauses import Paused

#: A consumer is live if its heartbeat is this recent: three of its longest heartbeat
#: interval (30 s), so one late or lost heartbeat does not make it look dead.
LIVE_WITHIN = timedelta(seconds=90)
#: Attempt outcomes that count as failures: each is an execution that did not succeed.
FAILURE_OUTCOMES = (
    AttemptOutcome.FAILED,
    AttemptOutcome.RETRYING,
    AttemptOutcome.TIMED_OUT,
    AttemptOutcome.LEASE_EXPIRED,
)
FAILURES_SINCE = timedelta(hours=24)
LATEST_FAILURES = 10
#: Longest error text kept per listed failure; the full one is on the job's admin page.
ERROR_CHARS = 300
LATENESS_SINCE = timedelta(hours=1)
#: Percentiles are computed in Python from at most this many of the hour's latest
#: attempts: a few hundred kilobytes, however busy the hour was.
LATENESS_SAMPLE = 10_000
PERCENTILES = (50, 95, 99)
DUE_MINUTES = 60
#: Running jobs listed at most (they are bounded by the consumers' concurrency anyway).
RUNNING_LIMIT = 1000
#: Queries ``collect()`` makes, always (the tests hold it to this).
QUERIES = 9


@dataclass(frozen=True)
class OverdueJob:
    id: int
    job_type: str
    queue: str
    run_at: datetime
    late: timedelta


@dataclass(frozen=True)
class Failure:
    job_id: int
    job_type: str
    attempt: int
    outcome: str
    finished_at: datetime | None
    worker_id: str
    error: str


@dataclass(frozen=True)
class Lateness:
    """Start minus ``run_at`` of attempts started in the last hour (nearest-rank)."""

    count: int
    #: True when more attempts started in the hour than LATENESS_SAMPLE: the figures are
    #: those of the latest LATENESS_SAMPLE.
    sampled: bool
    p50: timedelta | None
    p95: timedelta | None
    p99: timedelta | None
    max: timedelta | None

    def figures(self) -> list[tuple[str, timedelta | None]]:
        return [("p50", self.p50), ("p95", self.p95), ("p99", self.p99), ("max", self.max)]


@dataclass(frozen=True)
class RunningJob:
    id: int
    job_type: str
    queue: str
    worker_id: str
    started_at: datetime | None
    lease_expires_at: datetime | None


@dataclass(frozen=True)
class LiveConsumer:
    worker_id: str
    hostname: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    last_seen: datetime
    processed: int
    database_mode: bool
    clock_offset: float | None
    running: list[RunningJob]

    @property
    def clock_skewed(self) -> bool:
        """Its host's clock is off by more than CLOCK_OFFSET_WARNING: broken time sync."""
        limit = settings.CLOCK_OFFSET_WARNING.total_seconds()
        return self.clock_offset is not None and abs(self.clock_offset) > limit


@dataclass(frozen=True)
class PausedTarget:
    kind: str
    name: str
    paused_at: datetime
    paused_by: str


@dataclass(frozen=True)
class Stats:
    now: datetime
    by_status: dict[str, int]
    #: job type -> status -> count, every status present (0 when none).
    by_job_type: dict[str, dict[str, int]]
    pauses: list[PausedTarget]
    oldest_overdue: OverdueJob | None
    #: Start of the first of the DUE_MINUTES one-minute buckets: the current minute.
    due_from: datetime
    due_per_minute: list[int]
    failures: int
    failures_by_outcome: dict[str, int]
    latest_failures: list[Failure]
    lateness: Lateness
    consumers: list[LiveConsumer]
    #: Running jobs whose worker has no live heartbeat (a consumer that died, or one
    #: older than heartbeats): their lease brings them back if it is dead.
    running_elsewhere: list[RunningJob] = field(default_factory=list)
    #: Statuses whose counts are estimates (the admin dashboard on a large table).
    estimated: tuple[str, ...] = ()
    #: The fleet-wide limits at work, per group and key (``delayjobs.api.limits``).
    limits: list[LimitUsage] = field(default_factory=list)

    @property
    def paused(self) -> Paused:
        return paused_of(self.pauses)

    @property
    def due_next_hour(self) -> int:
        return sum(self.due_per_minute)

    def minute(self, index: int) -> datetime:
        """Start of the ``index``-th minute of ``due_per_minute``."""
        return self.due_from + timedelta(minutes=index)

    def as_dict(self) -> dict[str, Any]:
        """Every figure as JSON-serialisable values."""
        data = jsonable(asdict(self))
        data["due_next_hour"] = self.due_next_hour
        for consumer, figures in zip(self.consumers, data["consumers"], strict=True):
            figures["clock_skewed"] = consumer.clock_skewed
        paused = self.paused
        data["paused_queues"] = sorted(paused.queues)
        data["paused_job_types"] = sorted(paused.job_types)
        return data


def jsonable(value: Any) -> Any:
    """``value`` with datetimes as ISO strings and timedeltas as seconds, recursively."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value


def paused_of(pauses: list[PausedTarget]) -> Paused:
    return Paused(
        frozenset(p.name for p in pauses if p.kind == PauseKind.QUEUE),
        frozenset(p.name for p in pauses if p.kind == PauseKind.JOB_TYPE),
    )


def percentile(ordered: list[timedelta], percent: float) -> timedelta | None:
    """Nearest-rank percentile of an ascending list: a value that occurred, never one
    interpolated between two (None for no values)."""
    if not ordered:
        return None
    rank = max(1, math.ceil(percent / 100 * len(ordered)))
    return ordered[rank - 1]


#: Counts by job type and status, by status, and which statuses are estimated.
JobCounts = tuple[dict[str, dict[str, int]], dict[str, int], tuple[str, ...]]


def collect(now: datetime | None = None, *, counts: Callable[[], JobCounts] | None = None) -> Stats:
    """The figures at ``now`` (default: the current time), in QUERIES queries; ``counts``
    replaces the exact counts of jobs (the dashboard estimates them on a large table)."""
    now = now or timezone.now()
    by_job_type, by_status, estimated = (counts or exact_counts)()
    pauses = [
        PausedTarget(**row)
        for row in Pause.objects.order_by("kind", "name").values(
            "kind", "name", "paused_at", "paused_by"
        )
    ]
    paused = paused_of(pauses)
    due_from = now.replace(second=0, microsecond=0)
    failures_by_outcome = _failures_by_outcome(now)
    consumers, running_elsewhere = _consumers(now)
    return Stats(
        now=now,
        by_status=by_status,
        by_job_type=by_job_type,
        pauses=pauses,
        oldest_overdue=_oldest_overdue(now, paused),
        due_from=due_from,
        due_per_minute=_due_per_minute(due_from, paused),
        failures=sum(failures_by_outcome.values()),
        failures_by_outcome=failures_by_outcome,
        latest_failures=_latest_failures(now),
        lateness=_lateness(now),
        consumers=consumers,
        running_elsewhere=running_elsewhere,
        estimated=estimated,
        limits=limit_usage(now),
    )


def exact_counts() -> JobCounts:
    """Counts by job type and status, and by status (summed here: one query for both)."""
    rows = DelayedJob.objects.order_by().values_list("job_type", "status").annotate(n=Count("id"))
    return (*tabulate((job_type, status, n) for job_type, status, n in rows), ())


def tabulate(rows: Any) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """(job type, status, count) rows as counts by job type and status, and by status."""
    by_status = dict.fromkeys(JobStatus.values, 0)
    by_job_type: dict[str, dict[str, int]] = {}
    for job_type, status, n in rows:
        counts = by_job_type.setdefault(job_type, dict.fromkeys(JobStatus.values, 0))
        counts[status] = counts.get(status, 0) + n
        by_status[status] = by_status.get(status, 0) + n
    return dict(sorted(by_job_type.items())), by_status


def _oldest_overdue(now: datetime, paused: Paused) -> OverdueJob | None:
    # Ordered by (run_at, id): the scheduled_due partial index serves it.
    row = (
        paused.exclude_from(DelayedJob.objects.due_before(now))
        .order_by("run_at", "id")
        .values("id", "job_type", "queue", "run_at")
        .first()
    )
    return None if row is None else OverdueJob(**row, late=now - row["run_at"])


def _due_per_minute(due_from: datetime, paused: Paused) -> list[int]:
    """Scheduled jobs due in each minute from ``due_from`` on: one GROUP BY query."""
    due_until = due_from + timedelta(minutes=DUE_MINUTES)
    rows = (
        paused.exclude_from(DelayedJob.objects.due_before(due_until))
        .filter(run_at__gte=due_from)
        .order_by()
        .values(minute=TruncMinute("run_at"))
        .annotate(n=Count("id"))
    )
    buckets = [0] * DUE_MINUTES
    for row in rows:
        # Whole minutes since due_from. Truncation happens in the current time zone; every
        # zone in use is offset by whole minutes from UTC, so the minutes are the same.
        index = int((row["minute"] - due_from).total_seconds() // 60)
        if 0 <= index < DUE_MINUTES:
            buckets[index] += row["n"]
    return buckets


def _recent_failures(now: datetime) -> Any:
    return JobAttempt.objects.filter(
        outcome__in=FAILURE_OUTCOMES, finished_at__gte=now - FAILURES_SINCE
    )


def _failures_by_outcome(now: datetime) -> dict[str, int]:
    counts = dict.fromkeys((str(outcome) for outcome in FAILURE_OUTCOMES), 0)
    for row in _recent_failures(now).order_by().values("outcome").annotate(n=Count("*")):
        counts[row["outcome"]] = row["n"]
    return counts


def _latest_failures(now: datetime) -> list[Failure]:
    rows = (
        _recent_failures(now)
        .order_by("-finished_at", "-id")
        .values_list(
            "job_id", "job__job_type", "number", "outcome", "finished_at", "worker_id", "error"
        )[:LATEST_FAILURES]
    )
    return [
        Failure(job_id, job_type, number, outcome, finished_at, worker, _short(error))
        for job_id, job_type, number, outcome, finished_at, worker, error in rows
    ]


def _short(error: str) -> str:
    return error if len(error) <= ERROR_CHARS else f"{error[: ERROR_CHARS - 1]}…"


def _lateness(now: datetime) -> Lateness:
    # One more than the sample tells whether the hour had more.
    values = list(
        JobAttempt.objects.filter(started_at__gte=now - LATENESS_SINCE)
        .order_by("-started_at", "-id")
        .values_list("lateness", flat=True)[: LATENESS_SAMPLE + 1]
    )
    sampled = len(values) > LATENESS_SAMPLE
    ordered = sorted(values[:LATENESS_SAMPLE])
    p50, p95, p99 = (percentile(ordered, percent) for percent in PERCENTILES)
    return Lateness(
        count=len(ordered),
        sampled=sampled,
        p50=p50,
        p95=p95,
        p99=p99,
        max=ordered[-1] if ordered else None,
    )


def _consumers(now: datetime) -> tuple[list[LiveConsumer], list[RunningJob]]:
    """Live consumers, each with the jobs it runs, and running jobs of no live consumer."""
    live = list(
        Consumer.objects.filter(last_seen__gte=now - LIVE_WITHIN)
        .order_by("worker_id")
        .values(
            "worker_id",
            "hostname",
            "pid",
            "queues",
            "concurrency",
            "started_at",
            "last_seen",
            "processed",
            "database_mode",
            "clock_offset",
        )
    )
    running: dict[str, list[RunningJob]] = defaultdict(list)
    rows = (
        DelayedJob.objects.filter(status=JobStatus.RUNNING)
        .order_by("claimed_at", "id")
        .values("id", "job_type", "queue", "worker_id", "claimed_at", "lease_expires_at")
    )
    for row in rows[:RUNNING_LIMIT]:
        # A running job's execution start is written with its outcome: its claim, a few
        # milliseconds earlier at most, tells since when it runs.
        running[row["worker_id"]].append(
            RunningJob(
                id=row["id"],
                job_type=row["job_type"],
                queue=row["queue"],
                worker_id=row["worker_id"],
                started_at=row["claimed_at"],
                lease_expires_at=row["lease_expires_at"],
            )
        )
    consumers = [
        LiveConsumer(**consumer, running=running.pop(consumer["worker_id"], []))
        for consumer in live
    ]
    elsewhere = sorted(
        (job for jobs in running.values() for job in jobs),
        key=lambda job: (job.started_at or now, job.id),
    )
    return consumers, elsewhere


def format_clock(moment: datetime) -> str:
    """The hour and minute of a moment in the current time zone: "14:05"."""
    return timezone.localtime(moment).strftime("%H:%M")
