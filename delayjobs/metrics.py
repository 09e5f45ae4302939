"""Compatibility path: the code lives in delayjobs.core.metrics."""

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
    job_finished,
    job_started,
    jobs_scheduled,
    metrics_view,
    preload_pass,
    registry,
    serve,
)

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
