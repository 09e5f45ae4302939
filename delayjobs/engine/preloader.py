"""The pre-loader: one idempotent pass that makes Redis reflect the coming window.

A pass (1) returns running jobs whose lease expired to ``scheduled``, (2) lets job types
plan jobs from business data, (3) makes the jobs of recurring schedules' ticks due in the
window (``delayjobs.recurring.ticks``), and (4) adds every scheduled job due before
now + window to its queue's sorted set, reading the partial index in keyset-paginated
batches.
Running it twice, or from two processes, changes nothing more: a Redis lock keeps it to
one process at a time anyway, and ZADD of an id already there only refreshes its score.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError
from django.utils import timezone
from redis import RedisError

from delayjobs.api import schedule
from delayjobs.conf import settings
from delayjobs.core import clock, metrics, tracing
from delayjobs.core.db import drop_broken_connections
from delayjobs.exceptions import DuplicateJob, InvalidJob
from delayjobs.index.store import RedisStore, get_store
from delayjobs.index.window import load_window
from delayjobs.jobtypes import JobType, registry
from delayjobs.models import DelayedJob, JobStatus
from delayjobs.pauses import paused
from delayjobs.recurring.ticks import materialise_schedules
from delayjobs.transitions import prune_limit_rows, reap_expired_leases

logger = logging.getLogger("delayjobs.preloader")  # the old path: users' LOGGING names it


@dataclass
class PassResult:
    ran: bool = True
    reaped: int = 0
    planned: int = 0
    ticks: int = 0
    loaded: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def __str__(self) -> str:
        if not self.ran:
            return "skipped: another process holds the pre-loader lock"
        return (
            f"reaped {self.reaped} expired lease(s), planned {self.planned} job(s), "
            f"made {self.ticks} tick(s) into jobs, loaded {self.loaded} job(s) in "
            f"{self.seconds * 1000:.1f} ms"
        ) + (f"; {len(self.errors)} error(s): {'; '.join(self.errors)}" if self.errors else "")


def preload(*, store: RedisStore | None = None, now: datetime | None = None) -> PassResult:
    """Run one pre-loader pass if no other process is running one."""
    store = store or get_store()
    # The lock outlives a normal pass (milliseconds) and expires about one interval after
    # a process died holding it, so the next pass is not held up. A pass outliving it is
    # harmless: passes are idempotent; the lock only saves duplicate work.
    lock_ttl = max(settings.PRELOAD_INTERVAL.total_seconds(), 1.0)
    with store.preload_lock(lock_ttl) as acquired:
        if not acquired:
            return PassResult(ran=False)
        return _pass(store, now or clock.now())


def _pass(store: RedisStore, now: datetime) -> PassResult:
    # One span per pass (none per job); planned jobs' send spans are its children.
    with tracing.internal("delayjobs preload") as span:
        result = _traced_pass(store, now)
        span.count(
            reaped=result.reaped, planned=result.planned, ticks=result.ticks, loaded=result.loaded
        )
        return result


def _traced_pass(store: RedisStore, now: datetime) -> PassResult:
    started = time.perf_counter()
    result = PassResult()
    horizon = now + settings.PRELOAD_WINDOW
    with tracing.internal("delayjobs reap", root=False) as reaping:
        rescheduled = reap_expired_leases(now)
        reaping.count(reaped=len(rescheduled))
    result.reaped = len(rescheduled)
    prune_limit_rows()
    for jobtype in registry:
        result.planned += _plan(jobtype, now, horizon, result.errors)
    try:
        result.ticks = materialise_schedules(now, horizon, result.errors)
    except Exception as exc:  # broken schedules must not stop the window from loading
        logger.exception("Recurring schedules could not be made into jobs")
        result.errors.append(f"recurring schedules: {type(exc).__name__}: {exc}")
    result.loaded = load_window(store, horizon, leave_out=paused().matching())
    result.seconds = time.perf_counter() - started
    metrics.preload_pass(result.seconds)
    return result


def _plan(jobtype: JobType, start: datetime, end: datetime, errors: list[str]) -> int:
    """Schedule what ``jobtype.plan`` yields; keys already held are left as they are."""
    if type(jobtype).plan is JobType.plan:
        return 0
    planned = 0
    try:
        for item in jobtype.plan(start, end):
            try:
                planned += _schedule_planned(jobtype, item)
            except Exception as exc:  # one bad item must not keep the others out
                logger.warning("Job type %s: plan() item %r refused: %s", jobtype.name, item, exc)
                errors.append(f"{jobtype.name}.plan() item: {type(exc).__name__}: {exc}")
    except Exception as exc:  # a broken plan() must not stop the window from loading
        logger.exception("Job type %s: plan() failed", jobtype.name)
        errors.append(f"{jobtype.name}.plan(): {type(exc).__name__}: {exc}")
    return planned


def _schedule_planned(jobtype: JobType, item: Any) -> int:
    spec = dict(item)
    if not spec.get("key"):
        raise InvalidJob(
            f"{jobtype.name}.plan() yielded a job without a key: {spec!r}. Keys make "
            f"planning idempotent, so they are required."
        )
    if spec.get("replace"):
        # Planned every pass: replacing would reset the job's attempts each time.
        raise InvalidJob(f"{jobtype.name}.plan() may not yield replace=True: {spec!r}.")
    if _cancelled_before(jobtype.name, spec):
        return 0
    try:
        schedule(jobtype.name, **spec)
    except DuplicateJob:
        return 0
    return 1


def _cancelled_before(job_type: str, spec: dict[str, Any]) -> bool:
    """Whether an operator cancelled this very occurrence (its key, due at the same time):
    the next pass must not plan it again, or cancelling a planned job could not stick. A
    new occurrence (another time) under the same key is planned as usual."""
    run_at = spec.get("run_at")
    if not isinstance(run_at, datetime) or timezone.is_naive(run_at):
        return False  # schedule() says what is wrong with it
    return DelayedJob.objects.filter(
        key=spec["key"], job_type=job_type, status=JobStatus.CANCELLED, run_at=run_at
    ).exists()


def run_forever(stop: threading.Event) -> None:
    """Run a pass every PRELOAD_INTERVAL until ``stop`` is set; errors are logged, not fatal."""
    unavailable = False  # Redis or the database is away: said once, not every interval
    while not stop.is_set():
        started = time.monotonic()
        drop_broken_connections()
        try:
            result = preload()
            # Routine passes are debug noise; recovering leases or planning jobs is news.
            notable = result.reaped or result.planned or result.errors or unavailable
            logger.log(logging.INFO if notable else logging.DEBUG, "Pre-loader pass: %s", result)
            unavailable = False
        except (RedisError, DatabaseError) as exc:
            if not unavailable:
                logger.error(
                    "Pre-loader pass failed (%s); trying again every interval, quietly "
                    "until a pass succeeds",
                    exc,
                )
            unavailable = True
        except Exception:
            logger.exception("Pre-loader pass failed; trying again next interval")
        elapsed = time.monotonic() - started
        stop.wait(max(0.0, settings.PRELOAD_INTERVAL.total_seconds() - elapsed))
