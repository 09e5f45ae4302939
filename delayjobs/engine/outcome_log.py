"""The log line that says how an attempt ended, in the consumer's logger."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from delayjobs.core.logfields import job_fields
from delayjobs.models import DelayedJob
from delayjobs.transitions import Outcome

# The consumer's logger: these lines are what an operator follows a consumer by, whether
# the job ran in its thread pool, on its event loop or in a Celery worker.
logger = logging.getLogger("delayjobs.consumer")


def log_outcome_of(outcome: Outcome) -> None:
    """``log_outcome`` of an execution's outcome (the recorder's, for a batch)."""
    log_outcome(
        outcome.job,
        outcome.started_at,
        outcome.finished_at,
        outcome.error,
        outcome.retry_at,
        skipped=outcome.skipped,
        expired=outcome.expired,
    )


def log_outcome(
    job: DelayedJob,
    started: datetime,
    finished: datetime,
    error: str,
    retry_at: datetime | None,
    *,
    skipped: bool = False,
    expired: bool = False,
) -> None:
    if not (error or expired or skipped or logger.isEnabledFor(logging.INFO)):
        return  # a success, below the level logged: nothing to compute (once per job)
    lateness_ms = (started - job.run_at).total_seconds() * 1000
    took_ms = (finished - started).total_seconds() * 1000

    def fields(event: str) -> dict[str, Any]:
        return job_fields(job, event, started=started, duration_ms=took_ms, error=error or None)

    if expired:
        logger.warning(
            "Job %s %s expired: it could start only %.1f ms after run_at, past its "
            "max_lateness; not run [trace %s]",
            job.pk,
            job.job_type,
            lateness_ms,
            job.trace_id,
            extra=fields("expired"),
        )
    elif skipped:
        logger.info(
            "Job %s %s skipped: should_run() said no [trace %s]",
            job.pk,
            job.job_type,
            job.trace_id,
            extra=fields("skipped"),
        )
    elif not error:
        logger.info(
            "Job %s %s attempt %d succeeded in %.1f ms, started %.1f ms after run_at [trace %s]",
            job.pk,
            job.job_type,
            job.attempts,
            took_ms,
            lateness_ms,
            job.trace_id,
            extra=fields("succeeded"),
        )
    elif retry_at is not None:
        logger.warning(
            "Job %s %s attempt %d failed (%s), started %.1f ms after run_at; retrying at "
            "%s [trace %s]",
            job.pk,
            job.job_type,
            job.attempts,
            error,
            lateness_ms,
            retry_at.isoformat(),
            job.trace_id,
            extra=fields("retrying"),
        )
    else:
        logger.error(
            "Job %s %s attempt %d failed (%s), started %.1f ms after run_at; no retries "
            "left, marked failed [trace %s]",
            job.pk,
            job.job_type,
            job.attempts,
            error,
            lateness_ms,
            job.trace_id,
            extra=fields("failed"),
        )
