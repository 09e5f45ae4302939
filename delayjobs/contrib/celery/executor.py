"""Running claimed jobs in Celery workers instead of the consumer's own threads.

``run_delay_consumer --executor celery`` (or ``DELAYJOBS['EXECUTOR'] = "celery"``) still
pops and claims jobs exactly as the local pool does; it then publishes one
``delayjobs.tasks.execute`` task per claimed job and frees its slot. The task, in a
Celery worker:

1. takes the claim over (``transitions.take_over``, fenced on attempt, claimant and claim
   time), so a task delivered after its lease expired and the job moved on does nothing;
2. renews the lease while the job runs (a heartbeat thread), and stops renewing once
   ``time_to_run`` has passed: the lease then expires and the reaper records the attempt
   as ``lease_expired`` and retries or fails the job, as for a consumer that died;
3. runs the job with the same code as the local pool (``engine.execution.run_claimed``: expiry,
   ``should_run``, ``execute``, retry policy), sends the same signals, and records the
   outcome with the same ``transitions.record_outcomes`` (job row and attempt row), then
   puts a retry into the Redis index.

Between the claim and the task's start the claim's own lease covers the job: if Celery
loses the message or its queue is longer than ``time_to_run``, the job is reaped and runs
again. A broker that does not take the task is the infrastructure's fault, not the job's:
the consumer gives the job back without spending its attempt (``transitions.give_back``)
and publishes nothing for a while (``PublishBackoff``). At start, ``prepare`` finds the
Celery app (``--celery-app``, as ``celery -A`` takes it) and checks that its broker answers,
so that a consumer without one stops before it claims anything.

This module imports Celery (through ``delayjobs.tasks``); the engine loads it by dotted path
(``delayjobs.engine.executors.EXECUTOR_PATHS``) only when this executor is chosen.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from delayjobs import transitions
from delayjobs.contrib.celery import broker
from delayjobs.contrib.celery.broker import BrokerUnavailable, PublishBackoff
from delayjobs.core import clock, tracing
from delayjobs.core.logfields import job_fields
from delayjobs.engine.execution import Running, describe, time_to_run_of
from delayjobs.engine.executors import ThreadedExecutor
from delayjobs.engine.inflight import InFlight
from delayjobs.engine.recorder import Recorder
from delayjobs.index.handoff import index_due_soon
from delayjobs.models import DelayedJob

try:
    from delayjobs.tasks import execute
except ImportError as _missing:
    raise ImproperlyConfigured(
        f"The Celery executor needs Celery ({_missing}): pip install "
        f"'django-delayjobs[celery]', and a Celery app that autodiscovers delayjobs.tasks."
    ) from None

logger = logging.getLogger("delayjobs.consumer")

#: How often to look whether Celery workers took the jobs handed to them over (each one
#: taken over frees its slot for the next claim).
HANDOVER_POLL = 0.05


def dispatch(job: DelayedJob, claimed_by: str) -> None:
    """Publish the Celery task that runs ``job``.

    Raises BrokerUnavailable if the broker does not take it: the caller gives the job
    back without spending its attempt, and backs off.
    """
    assert job.claimed_at is not None  # set by the claim, which it fences
    try:
        execute.apply_async(
            args=(job.pk, job.attempts, claimed_by, job.claimed_at.isoformat()),
            # Past its lease the claim is void anyway: a stale message is not worth running.
            expires=time_to_run_of(job).total_seconds(),
            # The trace context stored with the job, for the worker's process span (the
            # worker reads the row anyway; the headers are where messaging carries it).
            headers=tracing.celery_headers(job),
        )
    except Exception as exc:  # kombu's errors vary by transport; all mean "not published"
        raise BrokerUnavailable(describe(exc)) from exc
    logger.debug("Job %s attempt %d handed to Celery", job.pk, job.attempts)


class CeleryExecutor(ThreadedExecutor):
    """Publishes each claimed job as a Celery task from a thread of this process. A job
    handed over keeps its slot until a Celery worker takes it over (``poll``), and its
    lease is renewed here meanwhile; one no worker took over within its time_to_run is
    let go: its lease then expires. After a failed publish, nothing is claimed or
    published until the back-off is over."""

    name = "celery"

    @classmethod
    def prepare(cls, option: str | None) -> None:
        broker.prepare(option)

    def __init__(
        self, *, inflight: InFlight, recorder: Recorder, worker_id: str, concurrency: int
    ) -> None:
        super().__init__(
            inflight=inflight, recorder=recorder, worker_id=worker_id, concurrency=concurrency
        )
        self.backoff = PublishBackoff()
        self._next_handover_check = 0.0

    def hold_off(self) -> float:
        return self.backoff.remaining()

    def _run(self, running: Running, began: float) -> bool:
        """Hand a claimed job to Celery, or give it back if the broker does not take it;
        whether the job had timed out meanwhile."""
        job = running.job
        try:
            if self.backoff.remaining():
                raise BrokerUnavailable("backing off after a failed publish")
            dispatch(job, self.worker_id)
        except BrokerUnavailable as exc:
            timed_out = self.inflight.abandon(running)
            # A publish that outlasted time_to_run was timed out meanwhile: that outcome,
            # attempt spent, is being recorded; giving the job back too would contradict it.
            if not timed_out:
                self._give_back(job, exc)
            return timed_out
        if self.backoff.succeeded():
            logger.warning("Consumer %s: the Celery broker takes tasks again.", self.worker_id)
        timed_out = self.inflight.hand_over(running, time.monotonic() - began)
        if timed_out:
            logger.warning(
                "Job %s %s attempt %d was published to Celery after it had timed out; a "
                "Celery worker finds its claim gone and does nothing [trace %s]",
                job.pk,
                job.job_type,
                job.attempts,
                job.trace_id,
            )
        return timed_out

    def _give_back(self, job: DelayedJob, exc: BrokerUnavailable) -> None:
        """Return a job the broker did not take to ``scheduled``, its attempt unspent, due
        again once the back-off is over (the broker is down: nothing is lost meanwhile)."""
        wait = self.backoff.failed()
        logger.warning(
            "Job %s %s: the Celery broker did not take its task (%s); it goes back without "
            "spending its attempt, and no task is published for %.1f s [trace %s]",
            job.pk,
            job.job_type,
            exc,
            wait,
            job.trace_id,
            extra=job_fields(job, "given_back"),
        )
        try:
            entry = transitions.give_back(
                job, worker_id=self.worker_id, due=clock.now() + timedelta(seconds=wait)
            )
        except DatabaseError as error:
            logger.error(
                "Job %s: could not give it back (%s); it runs again once its lease expires, "
                "with an attempt spent.",
                job.pk,
                error,
            )
            return
        if entry is not None:
            index_due_soon([entry])  # best effort: the pre-loader re-indexes the row anyway

    def poll(self) -> float | None:
        """Free the slots of jobs Celery workers took over (or that waited too long);
        seconds until the next look, None if nothing is waiting."""
        waiting = self.inflight.handed_over()
        if not waiting:
            return None
        now = time.monotonic()
        if now < self._next_handover_check:
            return self._next_handover_check - now
        self._next_handover_check = now + HANDOVER_POLL
        still_ours = transitions.still_claimed(
            [running.job for running, _ in waiting.values()], worker_id=self.worker_id
        )
        for job in self.inflight.settle(waiting, still_ours, now):
            logger.warning(
                "Job %s attempt %d: no Celery worker took it over within its time_to_run; "
                "its lease is no longer renewed, so it runs again once the lease expires "
                "[trace %s]",
                job.pk,
                job.attempts,
                job.trace_id,
            )
        return HANDOVER_POLL
