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
3. runs the job with the same code as the local pool (``execution.run_claimed``: expiry,
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

Nothing here imports Celery at module level; ``delayjobs.tasks`` does.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured
from django.db import InterfaceError, OperationalError, connections
from django.utils.dateparse import parse_datetime

from delayjobs import transitions
from delayjobs.engine.execution import describe, run_claimed, signal_outcome, time_to_run_of
from delayjobs.handoff import index_due_soon
from delayjobs.jobtypes import registry
from delayjobs.models import DelayedJob
from delayjobs.transitions import Outcome

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger("delayjobs.consumer")

#: How long a worker keeps trying to record an outcome while the database is away; past
#: it the lease expires and the job runs again (at-least-once), as in the local pool.
RECORD_PATIENCE = 30.0
#: The least time between two lease renewals, whatever the job type's time_to_run.
MIN_HEARTBEAT = 0.5


class BrokerUnavailable(Exception):
    """The Celery broker did not take a job's task: a fault of the infrastructure, not of
    the job, so the job goes back unspent (``transitions.give_back``)."""


#: At start, the broker is asked this many times, BROKER_CHECK_INTERVAL apart, before the
#: consumer gives up: seconds, not the minutes Celery itself would keep retrying.
BROKER_CHECK_RETRIES = 2
BROKER_CHECK_INTERVAL = 0.5
BROKER_CHECK_TIMEOUT = 3
#: After a failed publish, no task is published for this long, doubling with each
#: further failure up to PUBLISH_BACKOFF_MAX; a publish that works resets it.
PUBLISH_BACKOFF_FIRST = 0.5
PUBLISH_BACKOFF_MAX = 30.0


def prepare(app_spec: str | None = None) -> Celery:
    """Load the Celery app jobs are published with and check that its broker answers.

    ``app_spec`` is what ``celery -A`` takes (``proj``, ``proj.celery``,
    ``proj.celery:app``); without it, the app the project loaded (Celery's Django guide
    loads it from the project package's ``__init__``). Raises ImproperlyConfigured, naming
    the fix, when there is no app or its broker does not answer: then the consumer stops
    before it claims a job, instead of spending every job's attempts on a broker that is
    not there.
    """
    try:
        import delayjobs.tasks  # noqa: F401  (registers the execute task with every app)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"The Celery executor needs Celery ({exc}): pip install 'django-delayjobs[celery]', "
            f"and a Celery app that autodiscovers delayjobs.tasks."
        ) from None
    app = _find_app(app_spec) if app_spec else _loaded_app()
    # Jobs are published from worker threads, where Celery's current app is thread-local:
    # without a default app they would find Celery's fallback app and its default broker.
    app.set_default()
    app.set_current()
    _check_broker(app)
    return app


def _find_app(app_spec: str) -> Celery:
    from celery import Celery
    from celery.app.utils import find_app

    try:
        app = find_app(app_spec)
    except Exception as exc:  # ImportError, AttributeError, or the module's own error
        raise ImproperlyConfigured(
            f"--celery-app {app_spec!r}: no Celery app found there ({describe(exc)}). Give "
            f"what you give `celery -A`: a module (proj, proj.celery) or module:attribute."
        ) from None
    if not isinstance(app, Celery):
        raise ImproperlyConfigured(
            f"--celery-app {app_spec!r} is {type(app).__name__}, not a Celery app."
        )
    return app


def _loaded_app() -> Celery:
    from celery import _state

    # Private to Celery, but the one way to tell an app the project created from the
    # fallback Celery makes up on first use, which publishes to amqp://localhost.
    app = _state._tls.current_app or _state.default_app  # type: ignore[attr-defined]
    if app is None or (app.main == "default" and not app.set_as_current):
        raise ImproperlyConfigured(
            "The Celery executor found no Celery app in this process, so every job would be "
            "published to Celery's default broker. Pass --celery-app with what you give "
            "`celery -A` (e.g. --celery-app proj), or load the app when Django starts, as "
            "Celery's Django guide does: `from .celery import app as celery_app` in your "
            "project package's __init__.py."
        )
    return app


def _check_broker(app: Celery) -> None:
    connection = app.connection_for_write()
    try:
        connection.ensure_connection(
            max_retries=BROKER_CHECK_RETRIES,
            # kombu's stubs say int; kombu takes any number of seconds.
            interval_start=BROKER_CHECK_INTERVAL,  # type: ignore[arg-type]
            interval_step=BROKER_CHECK_INTERVAL,  # type: ignore[arg-type]
            timeout=BROKER_CHECK_TIMEOUT,
        )
    except Exception as exc:  # kombu's errors vary by transport; all mean "no broker"
        raise ImproperlyConfigured(
            f"The broker of Celery app {app.main!r} at {connection.as_uri()} does not answer "
            f"({describe(exc)}). Start it, or set the app's broker_url (CELERY_BROKER_URL "
            f"with Celery's Django setup) to one that runs."
        ) from None
    finally:
        connection.release()


def dispatch(job: DelayedJob, claimed_by: str) -> None:
    """Publish the Celery task that runs ``job``.

    Raises BrokerUnavailable if the broker does not take it: the caller gives the job
    back without spending its attempt, and backs off.
    """
    from delayjobs.contrib.celery.tasks import execute  # Celery is imported only by this executor

    assert job.claimed_at is not None  # set by the claim, which it fences
    try:
        execute.apply_async(
            args=(job.pk, job.attempts, claimed_by, job.claimed_at.isoformat()),
            # Past its lease the claim is void anyway: a stale message is not worth running.
            expires=time_to_run_of(job).total_seconds(),
        )
    except Exception as exc:  # kombu's errors vary by transport; all mean "not published"
        raise BrokerUnavailable(describe(exc)) from exc
    logger.debug("Job %s attempt %d handed to Celery", job.pk, job.attempts)


class PublishBackoff:
    """How long to leave the broker alone after failed publishes: PUBLISH_BACKOFF_FIRST,
    doubling with each failure in a row up to PUBLISH_BACKOFF_MAX. Thread-safe: the
    worker threads publish, the main loop asks before it claims."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._delay = 0.0
        self._until = 0.0

    def failed(self) -> float:
        """Note a failed publish; seconds until the next may be tried."""
        with self._lock:
            now = time.monotonic()
            if now >= self._until:  # one step per streak of failures, not per job
                self._delay = min(max(self._delay * 2, PUBLISH_BACKOFF_FIRST), PUBLISH_BACKOFF_MAX)
                self._until = now + self._delay
            return self._until - now

    def succeeded(self) -> bool:
        """Note a publish that worked; whether that ends a streak of failures."""
        with self._lock:
            ended = self._delay > 0
            self._delay = 0.0
            self._until = 0.0
            return ended

    def remaining(self) -> float:
        """Seconds to wait before publishing again (0: go ahead)."""
        with self._lock:
            return max(self._until - time.monotonic(), 0.0)


def run_dispatched(
    job_id: int, attempt: int, claimed_by: str, claimed_at: str, worker_id: str
) -> str:
    """The body of ``delayjobs.tasks.execute``; says what happened, for Celery's log."""
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
        outcome = run_claimed(job, worker_id)
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
    return True


def celery_worker_id(hostname: str | None) -> str:
    """The worker name stored in rows: Celery's node name and the process id."""
    return f"{hostname or 'celery'}:{os.getpid()}"
