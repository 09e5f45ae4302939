"""Signals about jobs, for alerting and metrics. Connect receivers as with any Django signal.

Every signal is sent with ``sender=DelayedJob`` and ``job`` (the ``DelayedJob``; during an
execution ``job.attempts`` is the attempt's number). Receivers are called with
``send_robust``: an exception in one is logged and changes nothing about the job.

- ``job_scheduled``: a new job was committed (``schedule``, ``schedule_many``, or a
  ``replace`` that moved a job). Sent after the commit, in the scheduling process.
- ``job_started``: an attempt is about to run. In the consumer's worker thread.
- ``job_succeeded``: an attempt succeeded; also ``duration`` (a timedelta).
- ``job_retrying``: an attempt failed and will be retried; also ``error`` (text) and
  ``retry_at``.
- ``job_failed``: the job failed for good (attempts exhausted or no retry wanted); also
  ``error`` and ``traceback`` (text). Hook alerting here.
- ``job_skipped``: ``JobType.should_run(job)`` said no; the job ended ``skipped``.
- ``job_expired``: the job could only have started past its ``max_lateness``; it ended
  ``expired`` without running. Also ``lateness`` (a timedelta).

The consumer sends the outcome signals when the attempt ends, just before the outcome
is written (in batches, moments later).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.dispatch import Signal

from delayjobs.models import DelayedJob

logger = logging.getLogger(__name__)

job_scheduled = Signal()
job_started = Signal()
job_succeeded = Signal()
job_retrying = Signal()
job_failed = Signal()
job_skipped = Signal()
job_expired = Signal()


def send(signal: Signal, job: Any, **kwargs: Any) -> None:
    """Send ``signal`` about ``job`` to its receivers, if any; a failing receiver is logged.

    Cheap checks first (no receiver at all, then none for jobs): the consumer calls this
    several times per job.
    """
    if not signal.receivers or not signal.has_listeners(DelayedJob):
        return
    for receiver, result in signal.send_robust(DelayedJob, job=job, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "Receiver %r of a delayjobs signal failed for job %s",
                receiver,
                job.pk,
                exc_info=result,
            )


def send_each(signal: Signal, jobs: Iterable[Any]) -> None:
    """``send`` for each of ``jobs``, in order."""
    for job in jobs:
        send(signal, job)
