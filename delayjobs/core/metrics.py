"""Prometheus metrics, with the ``metrics`` extra (``prometheus_client``); without it every
function here does nothing.

What is counted where it happens, in the process where it happens: jobs scheduled (the
process that scheduled them), started and finished with their lateness and duration (the
consumer, or the Celery worker that ran them), in flight, pre-loader passes, consumer
liveness. What the database knows (jobs due now, and due within the pre-load window) is
read at each scrape by ``BacklogCollector``.

Exposed by ``run_delay_consumer --metrics-port`` (``serve``) and by ``metrics_view`` for
your URLconf. With several processes on a host (gunicorn, several consumers, or the
consumer processes of one ``run_delay_consumer --processes N``), set
``PROMETHEUS_MULTIPROC_DIR`` for all of them, as prometheus_client's multiprocess mode
asks: each process then writes its figures there, and either endpoint reports the sum.
A supervisor serves ``--metrics-port`` from its first consumer process, and only in that
mode: its figures alone would be a fraction of the host's.
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import os
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from delayjobs.conf import settings
from delayjobs.models import DelayedJob, JobStatus

ENABLED = importlib.util.find_spec("prometheus_client") is not None
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Lateness is what delayjobs is about: buckets from a millisecond to a minute.
LATENESS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 15, 60)
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

if ENABLED:
    from prometheus_client import Counter, Gauge, Histogram

    SCHEDULED = Counter(
        "delayjobs_jobs_scheduled", "Jobs scheduled (committed), by job type.", ["job_type"]
    )
    STARTED = Counter(
        "delayjobs_jobs_started", "Attempts whose execute() began, by job type.", ["job_type"]
    )
    FINISHED = Counter(
        "delayjobs_jobs_finished",
        "Attempts ended, by job type and outcome (the attempt rows' outcomes).",
        ["job_type", "outcome"],
    )
    LATENESS = Histogram(
        "delayjobs_job_lateness_seconds",
        "How long after its run_at an attempt began, by job type.",
        ["job_type"],
        buckets=LATENESS_BUCKETS,
    )
    DURATION = Histogram(
        "delayjobs_job_duration_seconds",
        "How long an attempt ran, by job type.",
        ["job_type"],
        buckets=DURATION_BUCKETS,
    )
    IN_FLIGHT = Gauge(
        "delayjobs_jobs_in_flight",
        "Jobs a consumer has claimed and not finished (or handed to Celery).",
        multiprocess_mode="livesum",
    )
    PRELOAD_PASS = Histogram("delayjobs_preload_pass_seconds", "How long a pre-loader pass took.")
    CONSUMERS = Gauge(
        "delayjobs_consumers", "Consumer processes running.", multiprocess_mode="livesum"
    )
    HEARTBEAT = Gauge(
        "delayjobs_consumer_heartbeat_timestamp_seconds",
        "When a consumer last beat (Unix time): a stale one is stuck.",
        multiprocess_mode="livemax",
    )
    LIMIT_WAIT = Histogram(
        "delayjobs_limit_wait_seconds",
        "How long a job of a type with fleet-wide limits was due but held by them before "
        "its claim admitted it, by job type.",
        ["job_type"],
        buckets=LATENESS_BUCKETS,
    )
    CLOCK_OFFSET = Gauge(
        "delayjobs_clock_offset_seconds",
        "How far a consumer host's clock is behind the database server's (negative: ahead); "
        "due times and leases use the server's clock.",
        multiprocess_mode="liveall",
    )


def jobs_scheduled(jobs: Iterable[DelayedJob]) -> None:
    if ENABLED:
        # One increment per job type (a bulk schedule is mostly of one).
        for job_type, count in collections.Counter(job.job_type for job in jobs).items():
            _scheduled(job_type).inc(count)


def job_started(job: DelayedJob, lateness: float) -> None:
    if ENABLED:
        started, lateness_seconds, _ = _of_type(job.job_type)
        started.inc()
        lateness_seconds.observe(max(lateness, 0.0))


def limit_wait(job_type: str, wait: timedelta | None) -> None:
    """A limited claim admitted a job after ``wait`` held (None: not a limited job)."""
    if ENABLED and wait is not None:
        _limit_wait(job_type).observe(wait.total_seconds())


@functools.cache
def _limit_wait(job_type: str) -> Any:
    return LIMIT_WAIT.labels(job_type)


def job_finished(job_type: str, outcome: str, duration: float) -> None:
    """An attempt ended: its outcome (an ``AttemptOutcome`` value) and how long it ran, in
    seconds. Plain values, so that the foundation needs no type of the state machine."""
    if ENABLED:
        _finished(job_type, outcome).inc()
        _of_type(job_type)[2].observe(max(duration, 0.0))


def job_ended_unwatched(job_type: str, outcome: str) -> None:
    """An attempt ended without an execution to time (its lease expired)."""
    if ENABLED:
        _finished(job_type, outcome).inc()


# A job type's children, looked up once: labels() costs a microsecond a call, which is
# several percent of a consumer's time per job in a backlog.
@functools.cache
def _of_type(job_type: str) -> tuple[Any, Any, Any]:
    return STARTED.labels(job_type), LATENESS.labels(job_type), DURATION.labels(job_type)


@functools.cache
def _scheduled(job_type: str) -> Any:
    return SCHEDULED.labels(job_type)


@functools.cache
def _finished(job_type: str, outcome: str) -> Any:
    return FINISHED.labels(job_type, outcome)


def preload_pass(seconds: float) -> None:
    if ENABLED:
        PRELOAD_PASS.observe(seconds)


def consumer_beat(in_flight: int) -> None:
    """A consumer's heartbeat: it is alive, with this many jobs in flight."""
    if ENABLED:
        IN_FLIGHT.set(in_flight)
        HEARTBEAT.set(time.time())


def clock_offset(offset: float | None) -> None:
    """How far this host's clock is behind the database server's (see delayjobs.core.clock)."""
    if ENABLED and offset is not None:
        CLOCK_OFFSET.set(offset)


def consumer_running(running: bool) -> None:
    if ENABLED:
        CONSUMERS.set(1 if running else 0)
        if not running:
            IN_FLIGHT.set(0)
            # Its live gauges leave the sums; its counters stay in them, as they should.
            process_gone(os.getpid())


def multiprocess() -> bool:
    """Whether this process writes its figures for prometheus_client's multiprocess mode."""
    return bool(os.environ.get(MULTIPROCESS_ENV))


def process_gone(pid: int) -> None:
    """A consumer process ``pid`` exited (seen by its supervisor): its live gauges leave the
    sums, even when it was killed before it could say so itself (``consumer_running``)."""
    if ENABLED and multiprocess():
        from prometheus_client import multiprocess as prometheus_multiprocess

        prometheus_multiprocess.mark_process_dead(pid)


class BacklogCollector:
    """Scheduled jobs due now, and due within the pre-load window, by queue, read from the
    database at each scrape (one indexed count of scheduled rows)."""

    def __init__(self, *, close_connections: bool = False) -> None:
        # A scrape served by prometheus_client's own server runs in a thread of its own:
        # its database connection must not outlive it.
        self._close_connections = close_connections

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        now = timezone.now()
        due = GaugeMetricFamily(
            "delayjobs_jobs_due", "Scheduled jobs due now (late if not running).", labels=["queue"]
        )
        window = GaugeMetricFamily(
            "delayjobs_jobs_due_in_window",
            "Scheduled jobs due within the pre-load window (PRELOAD_WINDOW).",
            labels=["queue"],
        )
        try:
            rows = (
                DelayedJob.objects.filter(
                    status=JobStatus.SCHEDULED, run_at__lte=now + settings.PRELOAD_WINDOW
                )
                .values("queue")
                .annotate(due=Count("pk", filter=Q(run_at__lte=now)), window=Count("pk"))
                .order_by()
            )
            for row in rows:
                due.add_metric([row["queue"]], row["due"])
                window.add_metric([row["queue"]], row["window"])
            limited = _limit_gauges(now)
        finally:
            if self._close_connections:
                connections.close_all()
        yield due
        yield window
        yield from limited


#: Separates a limit group's name from a key in ``DelayedJob.limit_key`` (as
#: ``delayjobs.limits.KEY_SEPARATOR``, which this foundation module cannot import).
_LIMIT_KEY_SEPARATOR = "/"


def _limit_gauges(now: Any) -> list[Any]:
    """Jobs running and jobs due but waiting under fleet-wide limits, by limit group (not
    by key: a tenant per key would be a series per tenant). One query on the rows with a
    limit key (a partial index), empty for a project without limits."""
    from prometheus_client.core import GaugeMetricFamily

    running = GaugeMetricFamily(
        "delayjobs_limit_running",
        "Jobs running under a fleet-wide limit (global_concurrency), by limit group.",
        labels=["limit_group"],
    )
    waiting = GaugeMetricFamily(
        "delayjobs_limit_waiting",
        "Jobs due but not running under a fleet-wide limit, by limit group.",
        labels=["limit_group"],
    )
    totals: dict[tuple[str, str], int] = collections.Counter()
    rows = (
        DelayedJob.objects.filter(limit_key__isnull=False)
        .filter(Q(status=JobStatus.RUNNING) | Q(status=JobStatus.SCHEDULED, run_at__lte=now))
        .values_list("limit_key", "status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for key, status, n in rows:
        totals[((key or "").partition(_LIMIT_KEY_SEPARATOR)[0], status)] += n
    for (group, status), n in sorted(totals.items()):
        (running if status == JobStatus.RUNNING else waiting).add_metric([group], n)
    return [running, waiting]


def registry() -> Any:
    """What an endpoint reports: this process's metrics, or, in multiprocess mode, those
    of every process writing to PROMETHEUS_MULTIPROC_DIR; and the backlog."""
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    if not multiprocess():
        return REGISTRY
    collected = CollectorRegistry()
    MultiProcessCollector(collected)
    return collected


def serve(port: int, address: str) -> None:
    """Serve the metrics from a consumer, in a thread of prometheus_client's. Raises
    ImproperlyConfigured without prometheus_client, OSError if it cannot listen."""
    if not ENABLED:
        raise ImproperlyConfigured(
            "--metrics-port needs prometheus_client: pip install 'django-delayjobs[metrics]'."
        )
    from prometheus_client import CollectorRegistry, start_http_server

    combined = CollectorRegistry(auto_describe=False)
    combined.register(_Union(registry(), BacklogCollector(close_connections=True)))
    start_http_server(port, addr=address, registry=combined)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics as Prometheus scrapes them. Mount it where only Prometheus reaches it:
    ``path("metrics/", delayjobs.core.metrics.metrics_view)``."""
    if not ENABLED:
        return HttpResponse(
            "Prometheus metrics need prometheus_client: pip install 'django-delayjobs[metrics]'.",
            status=501,
            content_type="text/plain; charset=utf-8",
        )
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    combined = CollectorRegistry(auto_describe=False)
    combined.register(_Union(registry(), BacklogCollector()))
    return HttpResponse(generate_latest(combined), content_type=CONTENT_TYPE_LATEST)


class _Union:
    """One collector for a registry's metrics and the backlog's."""

    def __init__(self, registry: Any, backlog: BacklogCollector) -> None:
        self._registry = registry
        self._backlog = backlog

    def collect(self) -> Iterator[Any]:
        yield from self._registry.collect()
        yield from self._backlog.collect()
