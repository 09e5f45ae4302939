"""The worker side of the Celery executor: the body of ``delayjobs.tasks.execute``.

In a Celery worker it takes the claim over, renews the lease while the job runs, runs it
with the same code as the local pool and records its outcome (see ``executor``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import timedelta
from typing import Any

from django.db import InterfaceError, OperationalError, connections
from django.utils.dateparse import parse_datetime

from delayjobs import transitions
from delayjobs.core import tracing
from delayjobs.engine.execution import run_claimed, signal_outcome, time_to_run_of
from delayjobs.engine.limited import release_slots
from delayjobs.index.handoff import index_due_soon
from delayjobs.jobtypes import registry
from delayjobs.models import DelayedJob
from delayjobs.transitions import Outcome

# The consumer's logger: an operator follows a job by it, in whichever process it ran.
logger = logging.getLogger("delayjobs.consumer")

#: How long a worker keeps trying to record an outcome while the database is away; past
#: it the lease expires and the job runs again (at-least-once), as in the local pool.
RECORD_PATIENCE = 30.0
#: The least time between two lease renewals, whatever the job type's time_to_run.
MIN_HEARTBEAT = 0.5


def run_dispatched(
    job_id: int,
    attempt: int,
    claimed_by: str,
    claimed_at: str,
    worker_id: str,
    trace_headers: dict[str, str] | None = None,
) -> str:
    """The body of ``delayjobs.tasks.execute``; says what happened, for Celery's log.

    ``trace_headers``: the W3C trace context the task's headers carried, the parent of
    the attempt's span (None: the one stored with the job, if any)."""
    claimed = parse_datetime(claimed_at)
    if claimed is None:
        raise ValueError(f"claimed_at {claimed_at!r} is not an ISO 8601 datetime")
    probe = DelayedJob.objects.filter(pk=job_id).only("job_type").first()
    if probe is None:
        return "gone"
    if probe.job_type not in registry:
        # A worker deployed without this job type (a rolling deploy): leave the claim to
        # its lease, so that it runs on a worker that knows it, instead of failing here.
        logger.error(
            "Job %s: this Celery worker does not know job type %r; leaving it to its lease. "
            "Known: %s.",
            job_id,
            probe.job_type,
            ", ".join(registry.names()),
        )
        return "unknown job type"
    time_to_run = time_to_run_of(probe)
    job = transitions.take_over(
        job_id,
        attempt=attempt,
        claimed_by=claimed_by,
        claimed_at=claimed,
        worker_id=worker_id,
        lease=time_to_run,
    )
    if job is None:
        logger.info(
            "Job %s attempt %d: its claim by %s is gone (lease expired, cancelled or run "
            "elsewhere); not running it",
            job_id,
            attempt,
            claimed_by,
        )
        return "stale"
    with _Heartbeat(job, worker_id, time_to_run):
        outcome = run_claimed(job, worker_id, trace_carrier=trace_headers)
    if not _record(outcome):
        logger.warning(
            "Job %s attempt %d returned after its lease had expired (it ran past its "
            "time_to_run of %s, or the database was away); its outcome (%s) is ignored "
            "[trace %s]",
            job.pk,
            job.attempts,
            time_to_run,
            outcome.error or outcome.attempt_outcome.value,
            job.trace_id,
        )
        return "ignored"
    signal_outcome(outcome)  # after the write: only for an attempt the database kept
    return outcome.attempt_outcome.value


class _Heartbeat:
    """Renews one job's lease until the job returns or its time_to_run is over."""

    def __init__(self, job: DelayedJob, worker_id: str, time_to_run: timedelta) -> None:
        self._job = job
        self._worker_id = worker_id
        self._time_to_run = time_to_run
        self._deadline = time.monotonic() + time_to_run.total_seconds()
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"delayjobs-heartbeat-{job.pk}", daemon=True
        )

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        interval = max(self._time_to_run.total_seconds() / 3, MIN_HEARTBEAT)
        try:
            while not self._done.wait(interval):
                if time.monotonic() >= self._deadline:
                    # Timed out: the lease lapses and the reaper takes the job back.
                    logger.warning(
                        "Job %s attempt %d ran past its time_to_run (%s) in a Celery worker; "
                        "its lease is no longer renewed",
                        self._job.pk,
                        self._job.attempts,
                        self._time_to_run,
                    )
                    return
                # Never past the deadline: a hung job is reaped time_to_run after it began.
                left = timedelta(seconds=self._deadline - time.monotonic())
                try:
                    transitions.renew_leases(
                        {min(left, self._time_to_run): [self._job.pk]}, worker_id=self._worker_id
                    )
                except (OperationalError, InterfaceError) as exc:
                    logger.warning("Could not renew the lease of job %s: %s", self._job.pk, exc)
        finally:
            connections.close_all()


def _record(outcome: Outcome) -> bool:
    """Write the outcome if its claim still holds, waiting out a database restart for a
    while, and index a retry; whether it was written."""
    give_up = time.monotonic() + RECORD_PATIENCE
    delay = 0.1
    while True:
        try:
            retries = transitions.record_outcome_if_held(outcome)
            break
        except (OperationalError, InterfaceError) as exc:
            if time.monotonic() > give_up:
                logger.error(
                    "Giving up recording job %s attempt %d (%s); it runs again after its lease.",
                    outcome.job.pk,
                    outcome.job.attempts,
                    exc,
                )
                return False
            connections.close_all()
            time.sleep(delay)  # backoff while the database is away, not a test wait
            delay = min(delay * 2, 5.0)
    if retries is None:
        return False
    index_due_soon(retries)
    # A slot of its fleet-wide limit freed: wake the jobs it held, as a consumer's
    # recorder does.
    release_slots([outcome.job])
    return True


def trace_headers(request: Any) -> dict[str, str] | None:
    """The job's W3C trace context, as a task's request (Celery's ``task.request``) carries
    it (``tracing.CELERY_HEADERS``): custom headers are attributes of the request, or in
    its ``headers`` (by protocol)."""
    headers = getattr(request, "headers", None) or {}
    found = {}
    for field, name in tracing.CELERY_HEADERS.items():
        value = getattr(request, name, None) or headers.get(name)
        if isinstance(value, str):
            found[field] = value
    return found or None


def celery_worker_id(hostname: str | None) -> str:
    """The worker name stored in rows: Celery's node name and the process id."""
    return f"{hostname or 'celery'}:{os.getpid()}"
