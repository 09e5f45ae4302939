"""Recurring schedules: their definitions, the rows of code schedules, pause and resume.

A schedule is a ``Schedule`` row (``delayjobs.models.schedules``). A job type with a
``recurrence`` gets one named after it, kept in step with the code by
``sync_code_schedules`` (the pre-loader calls it each pass, the admin on each visit); an
operator's schedule is made in the admin. The pre-loader turns ticks into jobs
(``delayjobs.recurring.ticks``); this module says what a schedule is and what it did.

Each tick's job holds the key ``schedule:<name>@<tick, ISO UTC>``: an ordinary job, with
the usual precision, retries, lease and history, found again by that key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction

from delayjobs import transitions
from delayjobs.conf import settings
from delayjobs.core import clock
from delayjobs.exceptions import InvalidJob, UnknownJobType
from delayjobs.index.handoff import unindex_on_commit
from delayjobs.jobtypes import JobType, code_recurrence_problems, registry
from delayjobs.models import DelayedJob, JobStatus, jobs_database
from delayjobs.models.schedules import Schedule, ScheduleSource
from delayjobs.recurring.rules import Cron, Every, Recurrence, misfire_problem

logger = logging.getLogger("delayjobs.schedules")

TICK_KEY_PREFIX = "schedule:"
#: The fields that say when a schedule ticks and what its jobs are: a change to one of
#: them cancels the jobs of coming ticks made under the old definition (restart_ticks).
TIMING_FIELDS = frozenset({"interval", "cron", "timezone", "job_type", "payload"})
#: Jobs of past ticks looked up for a schedule's last outcome.
RECENT_TICKS = 5


def tick_key(name: str, tick: datetime) -> str:
    """The key of the job of ``name``'s tick at ``tick``: the same on every host."""
    return f"{TICK_KEY_PREFIX}{name}@{tick.astimezone(UTC).isoformat()}"


def schedule_name_of(key: str | None) -> str | None:
    """The schedule a job's key says it is a tick of (None: not a tick's job)."""
    if not key or not key.startswith(TICK_KEY_PREFIX) or "@" not in key:
        return None
    return key[len(TICK_KEY_PREFIX) :].rpartition("@")[0] or None


def recurrence_of(schedule: Schedule) -> Recurrence:
    if schedule.interval is not None:
        return Every(seconds=schedule.interval.total_seconds())
    return Cron(schedule.cron, tz=schedule.timezone or "UTC")


def grace_of(schedule: Schedule) -> timedelta:
    """How late a tick's job may start and still not count as missed."""
    return schedule.misfire_grace if schedule.misfire_grace is not None else settings.MISFIRE_GRACE


def definition_problem(schedule: Schedule) -> str:
    """Why this schedule cannot tick ("" if it can): the first problem found."""
    if schedule.source == ScheduleSource.CODE:
        jobtype = _code_type(schedule.name)
        if jobtype is None:
            return (
                f"Job type {schedule.name!r} has no recurrence in this code (any more): the "
                f"schedule is kept for its history; delete it if it is gone for good."
            )
    elif schedule.job_type not in registry:
        return f"Unknown job type {schedule.job_type!r} (not registered in this process)."
    if (schedule.cron == "") == (schedule.interval is None):
        return "Give either a cron expression or an interval."
    return recurrence_of(schedule).problem or misfire_problem(schedule.misfire)


@dataclass(frozen=True)
class CodeDefinition:
    """A job type's ``recurrence``, ``misfire`` and ``misfire_grace`` as row fields."""

    fields: dict[str, Any]

    @classmethod
    def of(cls, jobtype: JobType) -> CodeDefinition | None:
        recurrence = jobtype.recurrence
        if recurrence is None:
            return None  # not recurring: no schedule of its own
        if code_recurrence_problems(jobtype):
            return None  # the system check says what is wrong; nothing ticks meanwhile
        assert isinstance(recurrence, Every | Cron)  # code_recurrence_problems says so
        if isinstance(recurrence, Every):
            timing = {"interval": recurrence.interval, "cron": "", "timezone": "UTC"}
        else:
            timing = {"interval": None, "cron": recurrence.expression, "timezone": recurrence.tz}
        return cls(
            {
                "source": ScheduleSource.CODE,
                "job_type": jobtype.name,
                **timing,
                "misfire": jobtype.misfire,
                "misfire_grace": jobtype.misfire_grace,
            }
        )


def sync_code_schedules() -> list[str]:
    """Give each job type with a valid ``recurrence`` its row, definition as in the code.

    A row's ``enabled`` (paused or not) and cursor are left alone: they are the
    operator's and the pre-loader's. Returns what could not be synced, for the caller
    to report; writes nothing when the rows already match the code.
    """
    definitions = {
        jobtype.name: definition
        for jobtype in registry
        if (definition := CodeDefinition.of(jobtype)) is not None
    }
    if not definitions:
        return []
    problems = []
    rows = {row.name: row for row in Schedule.objects.filter(name__in=definitions)}
    for name, definition in definitions.items():
        row = rows.get(name)
        if row is None:
            Schedule.objects.get_or_create(
                name=name, defaults={**definition.fields, "materialised_until": clock.now()}
            )
        elif row.source != ScheduleSource.CODE:
            problems.append(
                f"Job type {name!r} has a recurrence, but the schedule named {name!r} was "
                f"made in the admin; rename or delete that one so the code's can tick."
            )
        elif any(getattr(row, field) != value for field, value in definition.fields.items()):
            # A deploy changed it. The ticks already made (up to PRELOAD_WINDOW ahead) stay:
            # during a rolling deploy old and new processes both write their own
            # definition here, and cancelling on each change could lose a tick. The
            # cursor only moves forward, so no tick time gets a second job either way.
            Schedule.objects.filter(pk=row.pk).update(**definition.fields)
    return problems


def add_schedule(row: Schedule) -> Schedule:
    """Save an operator's new schedule (``source = database``, the admin's form): it ticks
    from now on, the database server's now, never catching up on ticks before it."""
    row.source = ScheduleSource.DATABASE
    row.materialised_until = clock.now()
    row.save(force_insert=True)
    return row


def _code_type(name: str) -> JobType | None:
    try:
        jobtype = registry.get(name)
    except UnknownJobType:
        return None
    return jobtype if CodeDefinition.of(jobtype) is not None else None


def pause_schedule(schedule: Schedule | str, *, by: str = "") -> Schedule:
    """Stop a schedule ticking, and cancel the jobs of its coming ticks already made.

    Works for code schedules too: no deploy needed. Ticks that fall while it is paused
    never run; ``resume_schedule`` starts again from the next tick.
    """
    using = jobs_database()
    with transaction.atomic(using=using):
        row = _locked(schedule)
        if row.enabled:
            row.enabled = False
            row.paused_at = clock.now()
            row.paused_by = by[:150]
            row.save(update_fields=["enabled", "paused_at", "paused_by", "updated_at"])
        _cancel_coming_ticks(row, using)
    logger.info("Schedule %s paused%s", row.name, f" by {by}" if by else "")
    return row


def restart_ticks(schedule: Schedule | str) -> Schedule:
    """After its definition changed (interval, cron, time zone, job type, payload): cancel
    the jobs of its coming ticks made under the old one, and tick anew from now on."""
    using = jobs_database()
    with transaction.atomic(using=using):
        row = _locked(schedule)
        _cancel_coming_ticks(row, using)
        row.materialised_until = clock.now()
        row.save(update_fields=["materialised_until", "updated_at"])
    return row


def _cancel_coming_ticks(row: Schedule, using: str) -> None:
    # Never started (attempts 0): a past tick's job waiting for its retry is not a
    # coming tick, and keeps its retry.
    coming = DelayedJob.objects.filter(
        key__startswith=f"{TICK_KEY_PREFIX}{row.name}@", status=JobStatus.SCHEDULED, attempts=0
    )
    unindex_on_commit(transitions.cancel(coming), using)


def resume_schedule(schedule: Schedule | str) -> Schedule:
    """Let a paused schedule tick again, from its next tick after now (none are caught up)."""
    with transaction.atomic(using=jobs_database()):
        row = _locked(schedule)
        if not row.enabled:
            row.enabled = True
            row.paused_at = None
            row.paused_by = ""
            row.materialised_until = clock.now()
            row.save(
                update_fields=[
                    "enabled",
                    "paused_at",
                    "paused_by",
                    "materialised_until",
                    "updated_at",
                ]
            )
    logger.info("Schedule %s resumed", row.name)
    return row


def _locked(schedule: Schedule | str) -> Schedule:
    name = schedule.name if isinstance(schedule, Schedule) else schedule
    row = Schedule.objects.select_for_update().filter(name=name).first()
    if row is None:
        raise InvalidJob(f"No schedule named {name!r}.")
    return row


def next_ticks(schedule: Schedule, count: int = 5, after: datetime | None = None) -> list[datetime]:
    """The schedule's next ``count`` ticks after ``after`` (default now); [] if it cannot tick."""
    if definition_problem(schedule):
        return []
    moment = after or clock.now()
    recurrence = recurrence_of(schedule)
    return recurrence.ticks_between(moment, datetime.max.replace(tzinfo=UTC), count)


def recent_jobs(schedule: Schedule, count: int = RECENT_TICKS) -> list[DelayedJob]:
    """The jobs of the schedule's latest ``count`` ticks up to now, newest first.

    Looked up by their keys (the key index), so the cost does not grow with the history.
    """
    if definition_problem(schedule):
        return []
    recurrence = recurrence_of(schedule)
    keys: list[str] = []
    moment: datetime | None = clock.now()
    while moment is not None and len(keys) < count:
        tick = recurrence.last_at_or_before(moment)
        if tick is None:
            break
        keys.append(tick_key(schedule.name, tick))
        moment = tick - timedelta(microseconds=1)
    return list(DelayedJob.objects.filter(key__in=keys).order_by("-run_at", "-id"))
