"""The structured fields of every log line about one job, for ``logger.x(..., extra=...)``.

A JSON log formatter (python-json-logger, structlog's stdlib bridge, a cloud agent) turns
them into fields to filter and graph by: ``job_id``, ``job_type``, ``attempt``,
``lateness_ms`` (None where there is no start to measure), ``event``, ``trace_id`` and
``span_id``: those of the current OpenTelemetry span, or of the job's attempt, so that
logs and traces join (``delayjobs.core.tracing``); without a span, the trace id stored
with the job (the trace that scheduled it) and no span id.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from delayjobs.core.tracing import log_ids
from delayjobs.models import DelayedJob


def job_fields(
    job: DelayedJob, event: str, *, started: datetime | None = None, **more: Any
) -> dict[str, Any]:
    """The fields of ``job`` at ``event``; ``started``: when the attempt began, for its
    lateness."""
    lateness = None if started is None else (started - job.run_at).total_seconds() * 1000
    trace_id, span_id = log_ids(job)
    return {
        "job_id": job.pk,
        "job_type": job.job_type,
        "attempt": job.attempts,
        "lateness_ms": lateness,
        "event": event,
        "trace_id": trace_id,
        "span_id": span_id,
        **more,
    }
