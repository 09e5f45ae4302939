"""The job spec and every check of ``schedule`` arguments, with public names.

Everyone who validates a job argument calls these: the verbs of ``delayjobs.api``,
``bind()`` (checking its options at declaration), pauses (a queue's name), the HTTP API
and the admin. Each check returns the value normalised, or raises ``InvalidJob`` with the
reason. The bounds the checks apply are public too (``PRIORITY_MIN`` ... ``__all__``), for
what describes the arguments without calling the checks (the HTTP API's schemas): each is
defined once, where its rule lives, and read from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.utils import timezone

from delayjobs.conf import settings as conf
from delayjobs.core.db import max_length
from delayjobs.exceptions import InvalidJob
from delayjobs.jobtypes import MAX_LATENESS, MIN_LATENESS, limits_of, registry
from delayjobs.limits import limit_key_problem
from delayjobs.models import PRIORITY_MAX, PRIORITY_MIN, DelayedJob, jobs_database
from delayjobs.models.jobs import LIMIT_KEY_MAX_LENGTH
from delayjobs.names import (
    NAME_MAX_LENGTH,
    NAME_PATTERN,
    QUEUE_MAX_LENGTH,
    QUEUE_PATTERN,
    QUEUE_RULE,
    is_queue,
)
from delayjobs.payload import normalize_payload, utf8_length

__all__ = [
    # The bounds
    "KEY_MAX_LENGTH",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_LATENESS",
    "MIN_LATENESS",
    "NAME_MAX_LENGTH",
    "NAME_PATTERN",
    "OBJECT_ID_MAX_LENGTH",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "QUEUE_MAX_LENGTH",
    "QUEUE_PATTERN",
    "SPEC_FIELDS",
    # The spec and the checks
    "JobSpec",
    "build_indexed_spec",
    "build_spec",
    "check_key",
    "check_max_attempts",
    "check_max_lateness",
    "check_object",
    "check_priority",
    "check_queue",
    "refuse_repeated_keys",
    "resolve_run_at",
]

KEY_MAX_LENGTH = max_length(DelayedJob, "key")
#: The largest value of a PositiveIntegerField on PostgreSQL (integer) and MySQL; SQLite
#: would take more, but a row must be valid on every database.
MAX_ATTEMPTS_LIMIT = 2**31 - 1
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
        job = DelayedJob.build(
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
        job.limit_key = stored_limit_key(job)
        return job

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
            "limit_key": self.new_job().limit_key,
            # Without obj=, the job keeps the object it was linked to.
            **(
                {"content_type_id": self.content_type_id, "object_id": self.object_id}
                if self.content_type_id is not None
                else {}
            ),
        }


def stored_limit_key(job: DelayedJob) -> str | None:
    """The limit key a new job of a limited type is counted under (its group, and what
    its type's ``limit_key(job)`` returns); None for a type without limits."""
    jobtype = registry.get(job.job_type)
    limits = limits_of(jobtype)
    if limits is None:
        return None
    key = jobtype.limit_key(job)
    problem = limit_key_problem(key, LIMIT_KEY_MAX_LENGTH - len(limits.group) - 1)
    if problem:
        raise InvalidJob(f"Job type {jobtype.name!r}: {problem}", field="payload")
    return limits.stored_key(key)


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
        raise InvalidJob(f"replace must be True or False, got {replace!r}.", field="replace")
    if replace and key is None:
        raise InvalidJob(
            "replace=True needs a key: it replaces the active job holding that key.", field="key"
        )
    content_type_id, object_id = check_object(obj)
    return JobSpec(
        job_type=jobtype.name,
        payload=normalize_payload(payload),
        run_at=resolve_run_at(run_at, delay, now or timezone.now()),
        key=check_key(key),
        queue=check_queue(jobtype.queue if queue is None else queue),
        max_attempts=check_max_attempts(
            jobtype.max_attempts if max_attempts is None else max_attempts
        ),
        replace=replace,
        max_lateness=check_max_lateness(max_lateness),
        priority=check_priority(priority),
        content_type_id=content_type_id,
        object_id=object_id,
    )


def check_object(obj: Any) -> tuple[int | None, str | None]:
    """(content type id, primary key as text) of a saved model instance (``obj=``);
    (None, None) for None. ``InvalidJob`` for anything else, or an unsaved instance."""
    if obj is None:
        return None, None
    if not isinstance(obj, models.Model):
        raise InvalidJob(
            f"obj must be a saved model instance, got {type(obj).__name__} {obj!r}.", field="obj"
        )
    if obj.pk is None:
        raise InvalidJob(f"obj must be saved first: {obj!r} has no primary key yet.", field="obj")
    object_id = str(obj.pk)
    if len(object_id) > OBJECT_ID_MAX_LENGTH:
        raise InvalidJob(
            f"obj's primary key is {len(object_id)} characters as text; at most "
            f"{OBJECT_ID_MAX_LENGTH} fit.",
            field="obj",
        )
    content_type = ContentType.objects.db_manager(jobs_database()).get_for_model(obj)
    return content_type.pk, object_id


def resolve_run_at(run_at: Any, delay: Any, now: datetime) -> datetime:
    """The job's run_at from ``run_at`` or ``delay`` (or now), refused past
    ``DELAYJOBS["MAX_SCHEDULE_AHEAD"]``."""
    resolved = _resolve_run_at(run_at, delay, now)
    ahead = conf.MAX_SCHEDULE_AHEAD
    if resolved - now > ahead:
        given = f"delay {delay}" if delay is not None else f"run_at {resolved.isoformat()}"
        raise InvalidJob(
            f"{given} is more than {ahead.days} days ahead, the most "
            f"DELAYJOBS['MAX_SCHEDULE_AHEAD'] allows.",
            field="delay" if delay is not None else "run_at",
        )
    return resolved


def _resolve_run_at(run_at: Any, delay: Any, now: datetime) -> datetime:
    if run_at is not None and delay is not None:
        raise InvalidJob("Give run_at or delay, not both.", field="delay")
    if delay is not None:
        if not isinstance(delay, timedelta):
            raise InvalidJob(
                f"delay must be a datetime.timedelta, got {type(delay).__name__} {delay!r}.",
                field="delay",
            )
        try:
            return now + delay
        except OverflowError:
            raise InvalidJob(
                f"delay {delay!r} lands outside the supported dates.", field="delay"
            ) from None
    if run_at is None:
        return now
    if not isinstance(run_at, datetime):
        raise InvalidJob(
            f"run_at must be an aware datetime.datetime, got {type(run_at).__name__} {run_at!r}.",
            field="run_at",
        )
    if timezone.is_naive(run_at):
        raise InvalidJob(
            f"run_at must be timezone-aware, got the naive datetime {run_at!r}. "
            f"Use django.utils.timezone.now() + timedelta(...) or attach a tzinfo.",
            field="run_at",
        )
    try:
        # In UTC: an aware time near datetime.min or max may not exist there, and
        # PostgreSQL refuses offsets beyond ±15:59 (Python allows up to ±23:59) with a
        # DataError that is no business of the caller's.
        return run_at.astimezone(UTC)
    except OverflowError:
        raise InvalidJob(
            f"run_at {run_at!r} is outside the supported dates (years 1 to 9999 in UTC).",
            field="run_at",
        ) from None


def check_key(key: Any) -> str | None:
    """A job key: None, or 1-KEY_MAX_LENGTH characters of valid text without NUL."""
    if key is None:
        return None
    if not isinstance(key, str):
        raise InvalidJob(f"key must be a string, got {type(key).__name__} {key!r}.", field="key")
    if not key or len(key) > KEY_MAX_LENGTH:
        raise InvalidJob(f"key must be 1-{KEY_MAX_LENGTH} characters, got {len(key)}.", field="key")
    if "\x00" in key:
        # PostgreSQL text cannot hold it: refuse it everywhere, as in payloads.
        raise InvalidJob(f"key must not contain NUL characters (\\x00), got {key!r}.", field="key")
    if not key.isascii():
        utf8_length(key, "key", field="key")
    return key


def check_queue(queue: Any) -> str:
    """A queue name (``delayjobs.names.QUEUE_PATTERN``)."""
    if not is_queue(queue):
        raise InvalidJob(f"queue must be {QUEUE_RULE}, got {queue!r}.", field="queue")
    return str(queue)


def check_max_attempts(value: Any) -> int | None:
    """An int from 1 to MAX_ATTEMPTS_LIMIT, or None (retry forever)."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= MAX_ATTEMPTS_LIMIT
    ):
        raise InvalidJob(
            f"max_attempts must be an int from 1 to {MAX_ATTEMPTS_LIMIT}, or None to retry "
            f"forever; got {value!r}.",
            field="max_attempts",
        )
    return value


def check_max_lateness(value: Any) -> timedelta | None:
    """A timedelta from MIN_LATENESS to MAX_LATENESS, or None (the job type's)."""
    if value is None:
        return None
    if not isinstance(value, timedelta) or not MIN_LATENESS <= value <= MAX_LATENESS:
        raise InvalidJob(
            f"max_lateness must be a timedelta from {MIN_LATENESS} to {MAX_LATENESS.days} "
            f"days, or None for the job type's; got {value!r}.",
            field="max_lateness",
        )
    return value


def check_priority(value: Any) -> int:
    """An int from PRIORITY_MIN to PRIORITY_MAX (higher starts first among jobs due
    together)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not PRIORITY_MIN <= value <= PRIORITY_MAX
    ):
        raise InvalidJob(
            f"priority must be an int from {PRIORITY_MIN} to {PRIORITY_MAX}, got {value!r}.",
            field="priority",
        )
    return value


def build_indexed_spec(index: int, spec: Any, now: datetime) -> JobSpec:
    """``build_spec`` of ``specs[index]`` of a batch (``schedule_many``): a dict of
    ``schedule`` arguments plus ``job_type``; the message of ``InvalidJob`` names the index."""
    if not isinstance(spec, Mapping):
        raise InvalidJob(
            f"specs[{index}] must be a dict of schedule() arguments, got {spec!r}.", index=index
        )
    unknown = set(spec) - SPEC_FIELDS
    if unknown:
        names = ", ".join(sorted(str(name) for name in unknown))  # not all keys are str
        raise InvalidJob(f"specs[{index}] has unknown argument(s): {names}.", index=index)
    if "job_type" not in spec:
        raise InvalidJob(f"specs[{index}] has no job_type.", field="job_type", index=index)
    try:
        return build_spec(**spec, now=now)
    except InvalidJob as exc:
        exc.args = (f"specs[{index}]: {exc}",)
        exc.index = index
        raise


def refuse_repeated_keys(specs: list[JobSpec]) -> None:
    """``InvalidJob`` if two specs of one batch hold the same key."""
    seen: set[str] = set()
    for index, spec in enumerate(specs):
        if spec.key is None:
            continue
        if spec.key in seen:
            raise InvalidJob(
                f"specs[{index}]: key {spec.key!r} appears twice in this batch.",
                field="key",
                index=index,
            )
        seen.add(spec.key)
