"""Compatibility path: the code lives in delayjobs.core.metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from delayjobs.core import metrics as _core
from delayjobs.core.metrics import (
    DURATION_BUCKETS,
    ENABLED,
    LATENESS_BUCKETS,
    MULTIPROCESS_ENV,
    BacklogCollector,
    clock_offset,
    consumer_beat,
    consumer_running,
    job_ended_unwatched,
    job_started,
    jobs_scheduled,
    metrics_view,
    preload_pass,
    registry,
    serve,
)

if TYPE_CHECKING:
    from delayjobs.transitions import Outcome


def job_finished(outcome: Outcome) -> None:
    """The old signature, for callers not yet moved to ``core.metrics.job_finished``."""
    if _core.ENABLED:  # as cheap as before without prometheus_client
        duration = (outcome.finished_at - outcome.started_at).total_seconds()
        _core.job_finished(outcome.job.job_type, outcome.attempt_outcome.value, duration)


__all__ = [
    "DURATION_BUCKETS",
    "ENABLED",
    "LATENESS_BUCKETS",
    "MULTIPROCESS_ENV",
    "BacklogCollector",
    "clock_offset",
    "consumer_beat",
    "consumer_running",
    "job_ended_unwatched",
    "job_finished",
    "job_started",
    "jobs_scheduled",
    "metrics_view",
    "preload_pass",
    "registry",
    "serve",
]

if ENABLED:  # prometheus_client's collectors exist only with it
    from delayjobs.core.metrics import (
        CLOCK_OFFSET,
        CONSUMERS,
        DURATION,
        FINISHED,
        HEARTBEAT,
        IN_FLIGHT,
        LATENESS,
        PRELOAD_PASS,
        SCHEDULED,
        STARTED,
    )

    __all__ += [
        "CLOCK_OFFSET",
        "CONSUMERS",
        "DURATION",
        "FINISHED",
        "HEARTBEAT",
        "IN_FLIGHT",
        "LATENESS",
        "PRELOAD_PASS",
        "SCHEDULED",
        "STARTED",
    ]
