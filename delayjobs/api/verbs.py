"""The verbs of the public scheduling API: schedule, schedule_many, cancel, reschedule, retry.

Every function writes in the caller's transaction and hands the job to Redis only once
that transaction commits; a rollback leaves no job anywhere. Bad arguments raise
``InvalidJob`` (or a subclass) before anything is written: the checks are those of
``delayjobs.validation``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, models, transaction
from django.utils import timezone

from delayjobs import signals, transitions
from delayjobs.core import metrics, tracing
from delayjobs.core.logfields import job_fields
from delayjobs.exceptions import DuplicateJob, InvalidJob, InvalidTransition, JobNotFound
from delayjobs.index.handoff import index_due_soon, index_on_commit, unindex_on_commit
from delayjobs.jobtypes import JobType
from delayjobs.lanes import IndexEntry, index_entry
from delayjobs.models import DelayedJob, JobStatus, jobs_database
from delayjobs.transitions.bulk import insert_job, insert_jobs
from delayjobs.validation import (
    JobSpec,
    build_indexed_spec,
    build_spec,
    check_key,
    refuse_repeated_keys,
    resolve_run_at,
)

logger = logging.getLogger("delayjobs.api")  # the old path: users' LOGGING names it


def schedule(
    job_type: str | type[JobType],
    payload: Any = None,
    *,
    run_at: datetime | None = None,
    delay: timedelta | None = None,
    key: str | None = None,
    queue: str | None = None,
    max_attempts: int | None = None,
    replace: bool = False,
    obj: models.Model | None = None,
    max_lateness: timedelta | None = None,
    priority: int = 0,
) -> DelayedJob:
    """Schedule one job at ``run_at``, after ``delay``, or now; return its row.

    With ``key``, at most one scheduled or running job holds it: another one raises
    ``DuplicateJob``, unless ``replace=True``, which moves the scheduled job holding the
    key to the new time and payload instead. ``obj`` (a saved model instance) links the
    job to the object it is about, for that object's admin page. ``max_lateness``: a job
    that could only start later than this after ``run_at`` ends ``expired`` instead of
    running (default: its job type's). ``priority`` (-100 to 100): among jobs due
    together, higher starts first.
    """
    spec = build_spec(
        job_type,
        payload,
        run_at=run_at,
        delay=delay,
        key=key,
        queue=queue,
        max_attempts=max_attempts,
        replace=replace,
        obj=obj,
        max_lateness=max_lateness,
        priority=priority,
    )
    using = jobs_database()
    with tracing.producer("schedule", spec.queue, spec.job_type) as sent:
        if spec.key is None:
            # No constraint can fail: a plain INSERT in the caller's transaction (or autocommit).
            job = spec.new_job()
            sent.mark(job)
            insert_job(job, using)
            _on_commit_scheduled([job], using)
        else:
            with transaction.atomic(using=using):
                job = _schedule_keyed(spec, using, sent)
        sent.sent([job])
        return job


def schedule_many(specs: Iterable[Mapping[str, Any]]) -> list[DelayedJob]:
    """Schedule many jobs in one transaction with a bulk INSERT; all or none.

    Each spec is a dict of ``schedule`` keyword arguments plus ``job_type``.
    """
    # A dict or a string is iterable too, and would be read as a list of its keys or letters.
    if isinstance(specs, Mapping | str | bytes) or not isinstance(specs, Iterable):
        raise InvalidJob(
            f"schedule_many() takes a list of dicts of schedule() arguments, got "
            f"{type(specs).__name__} {specs!r:.100}."
        )
    now = timezone.now()  # one "now" for the batch: same delays give the same run_at
    built = [build_indexed_spec(index, spec, now) for index, spec in enumerate(specs)]
    if not built:
        return []
    refuse_repeated_keys(built)
    using = jobs_database()
    queues = {spec.queue for spec in built}
    job_types = {spec.job_type for spec in built}
    with (
        tracing.producer(
            "schedule",
            next(iter(queues)) if len(queues) == 1 else None,
            next(iter(job_types)) if len(job_types) == 1 else None,
            count=len(built),
        ) as sent,
        transaction.atomic(using=using),
    ):
        keyed = [spec for spec in built if spec.key is not None]
        holders = _lock_active_holders([spec.key for spec in keyed if spec.key], using)
        jobs_by_position: dict[int, DelayedJob] = {}
        fresh: list[tuple[int, DelayedJob]] = []
        for position, spec in enumerate(built):
            holder = holders.get(spec.key) if spec.key else None
            if holder is None:
                job = spec.new_job()
                sent.mark(job)
                fresh.append((position, job))
            else:
                jobs_by_position[position] = _replace(holder, spec, using, sent)
        created = [job for _position, job in fresh]
        try:
            with transaction.atomic(using=using):
                insert_jobs(created, using)
        except IntegrityError:
            # Another transaction took one of the keys since we looked.
            _raise_if_key_taken([spec.key for spec in keyed if spec.key], using)
            raise
        for position, job in fresh:
            jobs_by_position[position] = job
        jobs = [jobs_by_position[position] for position in range(len(built))]
        _on_commit_scheduled(created, using)
    return jobs


def cancel(job: DelayedJob | int | None = None, *, key: str | None = None) -> int:
    """Cancel the scheduled job given, or the one holding ``key``; return how many (0 or 1).

    A running job is not interrupted (0 is returned); a finished one stays as it is.
    """
    jobs = _select(job, key)
    using = jobs_database()
    with transaction.atomic(using=using):
        cancelled = transitions.cancel(jobs)
        unindex_on_commit(cancelled, using)
    return len(cancelled)


def reschedule(
    job: DelayedJob | int | None = None,
    *,
    key: str | None = None,
    run_at: datetime | None = None,
    delay: timedelta | None = None,
) -> DelayedJob:
    """Move a scheduled job (given, or holding ``key``) to ``run_at``, after ``delay``, or now."""
    when = resolve_run_at(run_at, delay, timezone.now())
    using = jobs_database()
    with transaction.atomic(using=using):
        target = _select(job, key).select_for_update().first()
        if target is None:
            raise JobNotFound(f"Cannot reschedule job {_describe(job, key)}: no such job.")
        if target.status != JobStatus.SCHEDULED:
            raise InvalidTransition(
                f"Cannot reschedule job {target.pk}: it is {target.status}; only a scheduled "
                f"job moves."
            )
        with tracing.producer("reschedule", target.queue, target.job_type) as sent:
            transitions.move(target, run_at=when, **sent.changes())
            sent.sent([target])
        index_on_commit([_entry(target)], using, moved=True)
    return target


def retry(job: DelayedJob | int) -> DelayedJob:
    """Run a failed, cancelled or succeeded job again, now. Its attempt history is kept."""
    using = jobs_database()
    with transaction.atomic(using=using):
        target = _select(job, None).first()
        if target is None:
            raise JobNotFound(f"Job {_describe(job, None)} does not exist.")
        with tracing.producer("retry", target.queue, target.job_type) as sent:
            transitions.retry(target, **sent.changes())
            sent.sent([target])
        index_on_commit([_entry(target)], using)
    return target


# Keys -------------------------------------------------------------------------------


def _schedule_keyed(spec: JobSpec, using: str, sent: tracing.Sent) -> DelayedJob:
    assert spec.key is not None
    # Twice at most: with replace=True, losing the race to insert means another
    # transaction just committed a job holding the key, and that is the one to move.
    for attempt in range(2):
        holder = _lock_active_holders([spec.key], using).get(spec.key)
        if holder is not None:
            return _replace(holder, spec, using, sent)
        job = spec.new_job()
        sent.mark(job)
        try:
            with transaction.atomic(using=using):
                insert_job(job, using)
        except IntegrityError:
            if spec.replace and attempt == 0:
                continue
            _raise_if_key_taken([spec.key], using)
            raise
        _on_commit_scheduled([job], using)
        return job
    raise AssertionError("unreachable")  # pragma: no cover


def _lock_active_holders(keys: list[str], using: str) -> dict[str, DelayedJob]:
    if not keys:
        return {}
    holders = DelayedJob.objects.using(using).select_for_update().active().filter(key__in=keys)
    return {job.key: job for job in holders if job.key}


def _replace(holder: DelayedJob, spec: JobSpec, using: str, sent: tracing.Sent) -> DelayedJob:
    assert spec.key is not None
    if not spec.replace:
        raise DuplicateJob(spec.key, holder.pk)
    if holder.status != JobStatus.SCHEDULED:
        raise DuplicateJob(
            spec.key,
            holder.pk,
            reason=f"it is {holder.status} and cannot be moved; schedule again once it ends",
        )
    previous = _entry(holder)
    transitions.move(holder, **spec.replacement_fields(), **sent.changes())
    if previous[1] != _entry(holder)[1]:  # another queue or lane: the old entry must go
        unindex_on_commit([previous], using)
    _on_commit_scheduled([holder], using, moved=True)
    return holder


def _raise_if_key_taken(keys: list[str], using: str) -> None:
    holders = DelayedJob.objects.using(using).active().filter(key__in=keys)
    taken = holders.values_list("key", "pk").first()
    if taken is not None:
        raise DuplicateJob(taken[0] or "", taken[1]) from None


# Helpers ----------------------------------------------------------------------------


def _select(job: DelayedJob | int | None, key: str | None) -> Any:
    if (job is None) == (key is None):
        raise InvalidJob("Give either a job (or its id) or key=..., not both and not neither.")
    if key is not None:
        return DelayedJob.objects.active().filter(key=check_key(key))
    pk = job.pk if isinstance(job, DelayedJob) else job
    if isinstance(job, DelayedJob) and pk is None:
        raise InvalidJob("job is an unsaved DelayedJob: it has no id yet.")
    if isinstance(pk, bool) or not isinstance(pk, int):
        raise InvalidJob(f"job must be a DelayedJob or its integer id, got {job!r}.")
    return DelayedJob.objects.filter(pk=pk)


def _describe(job: DelayedJob | int | None, key: str | None) -> str:
    if key is not None:
        return f"with key {key!r}"
    return str(job.pk if isinstance(job, DelayedJob) else job)


def _on_commit_scheduled(jobs: list[DelayedJob], using: str, *, moved: bool = False) -> None:
    """Once the jobs are committed: hand them to Redis, and send ``job_scheduled``.

    The hand-off and the count (metrics, debug log) are one on-commit callback: in
    autocommit each costs a call of Django's on_commit per ``schedule()``.
    """
    if not jobs:
        return
    entries = [_entry(job) for job in jobs]
    count = not moved and (metrics.ENABLED or logger.isEnabledFor(logging.DEBUG))

    def committed() -> None:
        index_due_soon(entries, moved=moved)  # best effort: it never raises
        if count:
            _committed(jobs)

    transaction.on_commit(committed, using=using, robust=True)
    scheduled = signals.job_scheduled
    if scheduled.receivers and scheduled.has_listeners(DelayedJob):
        transaction.on_commit(lambda: signals.send_each(scheduled, jobs), using=using, robust=True)


def _committed(jobs: list[DelayedJob]) -> None:
    metrics.jobs_scheduled(jobs)
    if not logger.isEnabledFor(logging.DEBUG):
        return  # no line's fields to build, once per job
    for job in jobs:
        logger.debug(
            "Job %s %s scheduled for %s [trace %s]",
            job.pk,
            job.job_type,
            job.run_at.isoformat(),
            job.trace_id,
            extra=job_fields(job, "scheduled"),
        )


def _entry(job: DelayedJob) -> IndexEntry:
    return index_entry(job.pk, job.queue, job.job_type, job.due_timestamp)
