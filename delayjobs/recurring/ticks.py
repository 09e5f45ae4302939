"""Ticks into jobs: the pre-loader's step for recurring schedules, and the misfire rule.

Each pass, every enabled schedule's ticks up to the window's end become ordinary jobs
(key ``schedule:<name>@<tick>``), and the schedule's cursor, ``materialised_until``,
moves past them **in the same transaction**, the row locked (PostgreSQL) and the move
conditional on the cursor read (every database): a second pre-loader, on this host or
another, finds the ticks taken and makes nothing. So each tick has one job, ever.

Missed ticks (earlier than now minus the grace: the fleet was down) follow the misfire
policy here for the ticks never made into jobs, and in the consumer (``runs_though_late``)
for those made before the fleet went down.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from delayjobs.api import schedule_many
from delayjobs.jobtypes import JobType, registry
from delayjobs.models import DelayedJob, jobs_database
from delayjobs.models.schedules import Schedule, ScheduleSource
from delayjobs.recurring.definitions import (
    definition_problem,
    grace_of,
    recurrence_of,
    schedule_name_of,
    sync_code_schedules,
    tick_key,
)
from delayjobs.recurring.rules import Misfire

logger = logging.getLogger("delayjobs.preloader")

#: Ticks made into jobs per schedule per pass: a long downtime under misfire="all" is
#: caught up over several passes (each continues from the cursor) rather than in one.
TICKS_PER_PASS = 1000
_MICROSECOND = timedelta(microseconds=1)


class _CursorMoved(Exception):
    """Another pre-loader moved the cursor since it was read: its jobs stand, ours go."""


def materialise_schedules(now: datetime, horizon: datetime, errors: list[str]) -> int:
    """Make the jobs of every enabled schedule's ticks before ``horizon``; return how many."""
    errors.extend(sync_code_schedules())
    made = 0
    for schedule in Schedule.objects.filter(enabled=True):
        if problem := definition_problem(schedule):
            if schedule.source != ScheduleSource.CODE:  # a code row's type is gone: quiet
                errors.append(f"schedule {schedule.name}: {problem}")
            continue
        cursor = schedule.materialised_until or now
        if _ticks_to_make(schedule, cursor, now, horizon)[1] == cursor:
            continue  # nothing new in the window: no transaction, no lock (most passes)
        try:
            made += _materialise(schedule.pk, now, horizon)
        except _CursorMoved:
            continue
        except Exception as exc:  # one broken schedule must not keep the others out
            logger.exception("Schedule %s: its ticks could not be made into jobs", schedule.name)
            errors.append(f"schedule {schedule.name}: {type(exc).__name__}: {exc}")
    return made


def _materialise(pk: int, now: datetime, horizon: datetime) -> int:
    using = jobs_database()
    with transaction.atomic(using=using):
        # A row another pass holds (PostgreSQL; SQLite has no row locks) is that pass's to
        # make: skipped, not waited for behind a slow database. The conditional UPDATE
        # below is the guarantee on every database.
        schedule = (
            Schedule.objects.select_for_update(skip_locked=True).filter(pk=pk, enabled=True).first()
        )
        if schedule is None or definition_problem(schedule):
            return 0
        cursor = schedule.materialised_until or now
        ticks, new_cursor = _ticks_to_make(schedule, cursor, now, horizon)
        if new_cursor == cursor:
            return 0
        specs = _specs(schedule, ticks)
        # Still enabled, too: a pause committed since the read (no row lock on SQLite)
        # has cancelled the coming ticks' jobs, and none may be made after it.
        moved = Schedule.objects.filter(
            pk=pk, enabled=True, materialised_until=schedule.materialised_until
        )
        if not moved.update(materialised_until=new_cursor):
            raise _CursorMoved  # rolls back nothing written yet: the jobs come next
        if specs:
            schedule_many(specs)
    if ticks:
        logger.debug("Schedule %s: %d tick(s) made into jobs", schedule.name, len(ticks))
    return len(ticks)


def _ticks_to_make(
    schedule: Schedule, cursor: datetime, now: datetime, horizon: datetime
) -> tuple[list[datetime], datetime]:
    """The ticks after ``cursor`` to make into jobs now, and the cursor after them."""
    recurrence = recurrence_of(schedule)
    missed_before = now - grace_of(schedule)
    ticks: list[datetime] = []
    start = cursor
    if schedule.misfire != Misfire.ALL:
        # Ticks never made into jobs and already missed: none of them runs under "skip";
        # under "once" the latest does, as the one catch-up run.
        latest_missed = recurrence.last_at_or_before(missed_before - _MICROSECOND)
        if latest_missed is not None and latest_missed > cursor:
            if schedule.misfire == Misfire.ONCE:
                ticks.append(latest_missed)
            start = latest_missed
    ticks += recurrence.ticks_between(start, horizon, TICKS_PER_PASS - len(ticks))
    return ticks, max([start, *ticks])


def _specs(schedule: Schedule, ticks: list[datetime]) -> list[dict[str, Any]]:
    keys = [tick_key(schedule.name, tick) for tick in ticks]
    # A tick's key still held by an active job: a cursor set back by hand (resume, an
    # edit) met a tick already made. That job stands; none is made twice.
    held = set(DelayedJob.objects.active().filter(key__in=keys).values_list("key", flat=True))
    # Under skip and once, a tick's job that cannot start within the grace is missed:
    # max_lateness ends it expired, unless runs_though_late says it runs anyway. The job
    # type's own max_lateness, if shorter, still applies (it does under "all" too).
    limit = None if schedule.misfire == Misfire.ALL else grace_of(schedule)
    own = registry.get(schedule.job_type).max_lateness
    if own is not None and (limit is None or own < limit):
        limit = own
    return [
        {
            "job_type": schedule.job_type,
            "payload": schedule.payload,
            "run_at": tick,
            "key": key,
            "max_lateness": limit,
        }
        for tick, key in zip(ticks, keys, strict=True)
        if key not in held
    ]


def runs_though_late(job: DelayedJob, jobtype: JobType, now: datetime) -> bool:
    """Whether a tick's job past its ``max_lateness`` (the grace) runs anyway.

    A retry or a lease's rerun (``attempts > 1``) is no tick any more: it runs, however
    late, as any job would. A first attempt runs under ``once`` if its tick is the
    latest missed one of its schedule (the one catch-up run); otherwise it ends expired.
    The job type's own ``max_lateness`` is never overridden. Asked only on that rare
    path: it reads the schedule's row.
    """
    name = schedule_name_of(job.key)
    if name is None:
        return False
    own = jobtype.max_lateness
    if own is not None and now - job.run_at > own:
        return False
    if job.attempts > 1:
        return True
    schedule = Schedule.objects.filter(name=name).first()
    if schedule is None or schedule.misfire != Misfire.ONCE or definition_problem(schedule):
        return False
    latest_missed = recurrence_of(schedule).last_at_or_before(
        now - grace_of(schedule) - _MICROSECOND
    )
    return latest_missed is not None and latest_missed <= job.run_at
