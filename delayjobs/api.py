"""The public scheduling API: schedule, schedule_many, cancel, reschedule, retry.

Every function writes in the caller's transaction and hands the job to Redis only once
that transaction commits; a rollback leaves no job anywhere. Bad arguments raise
``InvalidJob`` (or a subclass) before anything is written.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from delayjobs import metrics, signals, transitions
from delayjobs.bulk import insert_jobs
from delayjobs.conf import DEFAULTS
from delayjobs.conf import settings as conf
from delayjobs.db import max_length
from delayjobs.exceptions import DuplicateJob, InvalidJob, InvalidTransition, JobNotFound
from delayjobs.handoff import index_on_commit, unindex_on_commit
from delayjobs.jobtypes import MAX_LATENESS, MIN_LATENESS, QUEUE_PATTERN, JobType, registry
from delayjobs.logfields import job_fields
from delayjobs.models import DelayedJob, JobStatus, jobs_database
from delayjobs.redis_store import IndexEntry, index_entry

logger = logging.getLogger(__name__)

KEY_MAX_LENGTH = max_length(DelayedJob, "key")
#: The largest value of a PositiveIntegerField on PostgreSQL (integer) and MySQL; SQLite
#: would take more, but a row must be valid on every database.
MAX_ATTEMPTS_LIMIT = 2**31 - 1
#: A NUL character as json.dumps writes it: \u0000 after an even run of backslashes (an
#: odd run would make it a literal backslash followed by "u0000").
ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
SPEC_FIELDS = frozenset(
    {
        "job_type",
        "payload",
        "run_at",
        "delay",
        "key",
        "queue",
        "max_attempts",
        "replace",
        "obj",
        "max_lateness",
        "priority",
    }
)
OBJECT_ID_MAX_LENGTH = max_length(DelayedJob, "object_id")


@dataclass(frozen=True)
class JobSpec:
    """Validated, normalised arguments of one job."""

    job_type: str
    payload: Any
    run_at: datetime
    key: str | None
    queue: str
    max_attempts: int | None
    replace: bool
    max_lateness: timedelta | None = None
    priority: int = 0
    #: The domain object the job is about (``obj=``): its content type and primary key.
    content_type_id: int | None = None
    object_id: str | None = None

    def new_job(self) -> DelayedJob:
        return DelayedJob.build(
            job_type=self.job_type,
            payload=self.payload,
            run_at=self.run_at,
            key=self.key,
            queue=self.queue,
            max_attempts=self.max_attempts,
            max_lateness=self.max_lateness,
            priority=self.priority,
            content_type_id=self.content_type_id,
            object_id=self.object_id,
        )

    def replacement_fields(self) -> dict[str, Any]:
        """What ``replace=True`` changes on the job already holding the key."""
        return {
            "job_type": self.job_type,
            "payload": self.payload,
            "run_at": self.run_at,
            "queue": self.queue,
            "max_attempts": self.max_attempts,
            "max_lateness": self.max_lateness,
            "priority": self.priority,
            "attempts": 0,
            "last_error": "",
            # Without obj=, the job keeps the object it was linked to.
            **(
                {"content_type_id": self.content_type_id, "object_id": self.object_id}
                if self.content_type_id is not None
                else {}
            ),
        }


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
    if spec.key is None:
        # No constraint can fail: a plain INSERT in the caller's transaction (or autocommit).
        job = spec.new_job()
        job.save(force_insert=True, using=using)
        _on_commit_scheduled([job], using)
        return job
    with transaction.atomic(using=using):
        return _schedule_keyed(spec, using)


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
    built = [_build_indexed_spec(index, spec, now) for index, spec in enumerate(specs)]
    if not built:
        return []
    _refuse_repeated_keys(built)
    using = jobs_database()
    with transaction.atomic(using=using):
        keyed = [spec for spec in built if spec.key is not None]
        holders = _lock_active_holders([spec.key for spec in keyed if spec.key], using)
        jobs_by_position: dict[int, DelayedJob] = {}
        fresh: list[tuple[int, DelayedJob]] = []
        for position, spec in enumerate(built):
            holder = holders.get(spec.key) if spec.key else None
            if holder is None:
                fresh.append((position, spec.new_job()))
            else:
                jobs_by_position[position] = _replace(holder, spec, using)
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
        transitions.move(target, run_at=when)
        index_on_commit([_entry(target)], using, moved=True)
    return target


def retry(job: DelayedJob | int) -> DelayedJob:
    """Run a failed, cancelled or succeeded job again, now. Its attempt history is kept."""
    using = jobs_database()
    with transaction.atomic(using=using):
        target = _select(job, None).first()
        if target is None:
            raise JobNotFound(f"Job {_describe(job, None)} does not exist.")
        transitions.retry(target)
        index_on_commit([_entry(target)], using)
    return target


# Validation ---------------------------------------------------------------------------


def build_spec(
    job_type: Any,
    payload: Any = None,
    *,
    run_at: Any = None,
    delay: Any = None,
    key: Any = None,
    queue: Any = None,
    max_attempts: Any = None,
    replace: Any = False,
    obj: Any = None,
    max_lateness: Any = None,
    priority: Any = 0,
    now: datetime | None = None,
) -> JobSpec:
    """Check and normalise ``schedule`` arguments; raise ``InvalidJob`` with the reason.

    ``now`` is what ``delay`` counts from (default: the current time).
    """
    jobtype = registry.resolve(job_type)
    if not isinstance(replace, bool):
        raise InvalidJob(f"replace must be True or False, got {replace!r}.")
    if replace and key is None:
        raise InvalidJob("replace=True needs a key: it replaces the active job holding that key.")
    content_type_id, object_id = _check_object(obj)
    return JobSpec(
        job_type=jobtype.name,
        payload=normalize_payload(payload),
        run_at=resolve_run_at(run_at, delay, now or timezone.now()),
        key=_check_key(key),
        queue=_check_queue(jobtype.queue if queue is None else queue),
        max_attempts=_check_max_attempts(
            jobtype.max_attempts if max_attempts is None else max_attempts
        ),
        replace=replace,
        max_lateness=_check_max_lateness(max_lateness),
        priority=_check_priority(priority),
        content_type_id=content_type_id,
        object_id=object_id,
    )


def _check_object(obj: Any) -> tuple[int | None, str | None]:
    """(content type id, primary key as text) of a saved model instance; (None, None)."""
    if obj is None:
        return None, None
    if not isinstance(obj, models.Model):
        raise InvalidJob(f"obj must be a saved model instance, got {type(obj).__name__} {obj!r}.")
    if obj.pk is None:
        raise InvalidJob(f"obj must be saved first: {obj!r} has no primary key yet.")
    object_id = str(obj.pk)
    if len(object_id) > OBJECT_ID_MAX_LENGTH:
        raise InvalidJob(
            f"obj's primary key is {len(object_id)} characters as text; at most "
            f"{OBJECT_ID_MAX_LENGTH} fit."
        )
    content_type = ContentType.objects.db_manager(jobs_database()).get_for_model(obj)
    return content_type.pk, object_id


def normalize_payload(payload: Any) -> Any:
    """The payload as it will be stored and read back: a JSON round trip, within the limit."""
    if payload is None:
        return {}
    return storable_json(payload, "The payload")


def nesting_depth(value: Any, limit: int) -> int:
    """How deeply ``value`` nests lists, tuples and dicts (a scalar is 0), counted without
    recursion and only up to ``limit + 1``, so that any value is measured safely."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def storable_json(value: Any, what: str) -> Any:
    """``value`` after a JSON round trip, as a JSON column stores it; ``InvalidJob`` if it
    cannot be stored or is over ``MAX_PAYLOAD_BYTES`` or ``MAX_PAYLOAD_DEPTH``. ``what``
    names it in the message."""
    depth_limit = conf.MAX_PAYLOAD_DEPTH
    if nesting_depth(value, depth_limit) > depth_limit:
        _refuse_circular(value, what)
        raise InvalidJob(
            f"{what} nests lists and dicts more than {depth_limit} levels deep "
            f"(DELAYJOBS['MAX_PAYLOAD_DEPTH']). Store flat data: ids and values."
        )
    try:
        # ensure_ascii=False: the text is then what the size limit measures (its UTF-8
        # bytes), and a lone surrogate stays one, to be refused when it fails to encode.
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidJob(
            f"{what} must be JSON-serializable (dicts, lists, strings, finite numbers, "
            f"booleans, None): {exc}. Store ids and ISO strings, not objects."
        ) from None
    except RecursionError:
        raise InvalidJob(f"{what} is nested too deeply to be stored as JSON.") from None
    if ESCAPED_NUL.search(text):
        # PostgreSQL's jsonb cannot hold it: refuse it everywhere, not only there.
        raise InvalidJob(f"{what} must not contain NUL characters (\\u0000).")
    size = len(text) if text.isascii() else _utf8_length(text, what)
    limit = _payload_limit()
    if limit is not None and size > limit:
        raise InvalidJob(
            f"{what} is {size} bytes of JSON, over the limit of {limit} bytes "
            f"(DELAYJOBS['MAX_PAYLOAD_BYTES']). Store ids, not documents."
        )
    return json.loads(text)


def _refuse_circular(value: Any, what: str) -> None:
    """InvalidJob saying so if ``value`` contains itself: endlessly deep, but the fix is
    not flatter data. json finds the cycle at its second visit, long before recursing far;
    a value merely too deep raises RecursionError or encodes, and is left to the caller."""
    try:
        json.dumps(value)
    except ValueError as exc:
        raise InvalidJob(f"{what} must be JSON-serializable: {exc} (it contains itself).") from None
    except (RecursionError, TypeError):
        pass


def _payload_limit() -> int | None:
    limit = conf.MAX_PAYLOAD_BYTES
    if limit is None or (isinstance(limit, int) and not isinstance(limit, bool) and limit > 0):
        return limit
    # A bad value is reported by check delayjobs.E012; meanwhile the default applies, as
    # conf does for the other settings, rather than a TypeError in every schedule().
    return DEFAULTS["MAX_PAYLOAD_BYTES"]


def _utf8_length(text: str, label: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        # Neither PostgreSQL nor SQLite can store it; it is never valid text anyway.
        raise InvalidJob(
            f"{label} must be valid Unicode text: it contains the lone surrogate "
            f"{text[exc.start]!r} at position {exc.start}."
        ) from None


def resolve_run_at(run_at: Any, delay: Any, now: datetime) -> datetime:
    """The job's run_at from ``run_at`` or ``delay`` (or now), refused past
    ``DELAYJOBS["MAX_SCHEDULE_AHEAD"]``."""
    resolved = _resolve_run_at(run_at, delay, now)
    ahead = conf.MAX_SCHEDULE_AHEAD
    if resolved - now > ahead:
        given = f"delay {delay}" if delay is not None else f"run_at {resolved.isoformat()}"
        raise InvalidJob(
            f"{given} is more than {ahead.days} days ahead, the most "
            f"DELAYJOBS['MAX_SCHEDULE_AHEAD'] allows."
        )
    return resolved


def _resolve_run_at(run_at: Any, delay: Any, now: datetime) -> datetime:
    if run_at is not None and delay is not None:
        raise InvalidJob("Give run_at or delay, not both.")
    if delay is not None:
        if not isinstance(delay, timedelta):
            raise InvalidJob(
                f"delay must be a datetime.timedelta, got {type(delay).__name__} {delay!r}."
            )
        try:
            return now + delay
        except OverflowError:
            raise InvalidJob(f"delay {delay!r} lands outside the supported dates.") from None
    if run_at is None:
        return now
    if not isinstance(run_at, datetime):
        raise InvalidJob(
            f"run_at must be an aware datetime.datetime, got {type(run_at).__name__} {run_at!r}."
        )
    if timezone.is_naive(run_at):
        raise InvalidJob(
            f"run_at must be timezone-aware, got the naive datetime {run_at!r}. "
            f"Use django.utils.timezone.now() + timedelta(...) or attach a tzinfo."
        )
    try:
        # In UTC: an aware time near datetime.min or max may not exist there, and
        # PostgreSQL refuses offsets beyond ±15:59 (Python allows up to ±23:59) with a
        # DataError that is no business of the caller's.
        return run_at.astimezone(UTC)
    except OverflowError:
        raise InvalidJob(
            f"run_at {run_at!r} is outside the supported dates (years 1 to 9999 in UTC)."
        ) from None


def _check_key(key: Any) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str):
        raise InvalidJob(f"key must be a string, got {type(key).__name__} {key!r}.")
    if not key or len(key) > KEY_MAX_LENGTH:
        raise InvalidJob(f"key must be 1-{KEY_MAX_LENGTH} characters, got {len(key)}.")
    if "\x00" in key:
        # PostgreSQL text cannot hold it: refuse it everywhere, as in payloads.
        raise InvalidJob(f"key must not contain NUL characters (\\x00), got {key!r}.")
    if not key.isascii():
        _utf8_length(key, "key")
    return key


def _check_queue(queue: Any) -> str:
    # fullmatch: the pattern's "$" would also match before a trailing newline.
    if not isinstance(queue, str) or not QUEUE_PATTERN.fullmatch(queue):
        raise InvalidJob(
            f"queue must be 1-100 characters of letters, digits and '_.-', got {queue!r}."
        )
    return queue


def _check_max_attempts(value: Any) -> int | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= MAX_ATTEMPTS_LIMIT
    ):
        raise InvalidJob(
            f"max_attempts must be an int from 1 to {MAX_ATTEMPTS_LIMIT}, or None to retry "
            f"forever; got {value!r}."
        )
    return value


def _check_max_lateness(value: Any) -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, timedelta) or not MIN_LATENESS <= value <= MAX_LATENESS:
        raise InvalidJob(
            f"max_lateness must be a timedelta from {MIN_LATENESS} to {MAX_LATENESS.days} "
            f"days, or None for the job type's; got {value!r}."
        )
    return value


def _check_priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -100 <= value <= 100:
        raise InvalidJob(f"priority must be an int from -100 to 100, got {value!r}.")
    return value


def _build_indexed_spec(index: int, spec: Any, now: datetime) -> JobSpec:
    if not isinstance(spec, Mapping):
        raise InvalidJob(f"specs[{index}] must be a dict of schedule() arguments, got {spec!r}.")
    unknown = set(spec) - SPEC_FIELDS
    if unknown:
        names = ", ".join(sorted(str(name) for name in unknown))  # not all keys are str
        raise InvalidJob(f"specs[{index}] has unknown argument(s): {names}.")
    if "job_type" not in spec:
        raise InvalidJob(f"specs[{index}] has no job_type.")
    try:
        return build_spec(**spec, now=now)
    except InvalidJob as exc:
        exc.args = (f"specs[{index}]: {exc}",)
        raise


def _refuse_repeated_keys(specs: list[JobSpec]) -> None:
    seen: set[str] = set()
    for index, spec in enumerate(specs):
        if spec.key is None:
            continue
        if spec.key in seen:
            raise InvalidJob(f"specs[{index}]: key {spec.key!r} appears twice in this batch.")
        seen.add(spec.key)


# Keys -------------------------------------------------------------------------------


def _schedule_keyed(spec: JobSpec, using: str) -> DelayedJob:
    assert spec.key is not None
    # Twice at most: with replace=True, losing the race to insert means another
    # transaction just committed a job holding the key, and that is the one to move.
    for attempt in range(2):
        holder = _lock_active_holders([spec.key], using).get(spec.key)
        if holder is not None:
            return _replace(holder, spec, using)
        job = spec.new_job()
        try:
            with transaction.atomic(using=using):
                job.save(force_insert=True, using=using)
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


def _replace(holder: DelayedJob, spec: JobSpec, using: str) -> DelayedJob:
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
    transitions.move(holder, **spec.replacement_fields())
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
        return DelayedJob.objects.active().filter(key=_check_key(key))
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
    """Once the jobs are committed: hand them to Redis, and send ``job_scheduled``."""
    index_on_commit([_entry(job) for job in jobs], using, moved=moved)
    if jobs and not moved and (metrics.ENABLED or logger.isEnabledFor(logging.DEBUG)):
        transaction.on_commit(lambda: _committed(jobs), using=using, robust=True)
    if jobs and signals.job_scheduled.has_listeners(DelayedJob):
        transaction.on_commit(
            lambda: signals.send_each(signals.job_scheduled, jobs),
            using=using,
            robust=True,
        )


def _committed(jobs: list[DelayedJob]) -> None:
    metrics.jobs_scheduled(jobs)
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
