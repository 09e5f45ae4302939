"""Job types: the strategy classes that say what a job does, and the registry of them.

A job names its job type; the consumer looks the type up here by that name and nowhere
else. Nothing is ever imported from a path stored in a row (invariant 8 of
docs/explanation/design.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from django.core.exceptions import ImproperlyConfigured

from delayjobs.core.backoff import equal_jitter_backoff
from delayjobs.exceptions import UnknownJobType
from delayjobs.limits import (
    Limits,
    Rate,
    global_concurrency_problem,
    limit_group_problem,
    rate_limit_problem,
)
from delayjobs.names import NAME_RULE, QUEUE_RULE, is_name, is_queue
from delayjobs.recurring.rules import Cron, Every, Misfire, Recurrence, misfire_problem

if TYPE_CHECKING:
    # Only for annotations: this module is imported before the app registry is ready
    # (``delayjobs.register`` in an app's module), and models cannot be then.
    from delayjobs.models import DelayedJob


# Bounds of every duration a job type declares or returns. Past them, datetime arithmetic
# at claim or retry time overflows (timedelta.max) and takes a consumer down, so they are
# refused where they are written: at registration and by `manage.py check`, or, for
# retry_delay()'s value, at run time with the attempt's error saying why.
#: Zero would expire every job (none starts at its exact microsecond); a year and more is
#: no limit at all, and keeps the duration far inside every database's range.
MIN_LATENESS = timedelta(milliseconds=1)
MAX_LATENESS = timedelta(days=366)
#: A lease further out than a week is one nobody would wait for after a crash.
MIN_TIME_TO_RUN = timedelta(milliseconds=1)
MAX_TIME_TO_RUN = timedelta(days=7)
#: The longest wait before a retry (retry_delay()'s value, the backoff's base and cap).
MAX_RETRY_DELAY = timedelta(days=366)


class JobType:
    """Base class of a job type. Subclass it, set ``name``, implement ``execute``.

    One instance serves every job of the type, from several threads at once: keep
    per-job state in locals, not on ``self``.
    """

    #: Unique, stable name stored in each job row. Renaming it orphans scheduled jobs.
    name: ClassVar[str] = ""
    #: Queue the jobs go to unless ``schedule(queue=...)`` says otherwise.
    queue: ClassVar[str] = "default"
    #: Executions before the job is marked failed; ``None`` retries forever.
    max_attempts: ClassVar[int | None] = 5
    #: The longest one execution may run. Past it the attempt is recorded as timed out
    #: (with the stack where it was stuck) and retried or failed like any failure; the
    #: stuck thread keeps only its own slot. It is also the lease: a consumer that dies
    #: mid-job gives the job back to the others this long after its last heartbeat.
    time_to_run: ClassVar[timedelta] = timedelta(minutes=5)
    #: The most jobs of this type one consumer process runs at once; ``None``: no limit
    #: but the consumer's own. A flood of a slow type then leaves slots for the others.
    concurrency: ClassVar[int | None] = None
    #: The most jobs of this type (of its ``limit_group``) running at once across every
    #: consumer on every host, from claim to recorded outcome; per ``limit_key`` if it
    #: returns one. ``None``: no fleet-wide limit. Enforced by the database in the claim.
    global_concurrency: ClassVar[int | None] = None
    #: ``delayjobs.Rate(N, per=timedelta(...))``: at most N starts in any window of that
    #: length, fleet-wide (sliding, on the database's clock); per ``limit_key`` if any.
    rate_limit: ClassVar[Rate | None] = None
    #: Job types naming the same group share its limits (two types calling one provider);
    #: every member must declare the same ones (system check delayjobs.E022). ``None``:
    #: the type's own name.
    limit_group: ClassVar[str | None] = None
    #: A job that could only start later than this after its ``run_at`` ends ``expired``
    #: instead of running (an SMS an hour late is worse than none). ``None``: no limit.
    #: ``schedule(max_lateness=...)`` overrides it for one job.
    max_lateness: ClassVar[timedelta | None] = None
    #: Whether every API key may schedule it through the HTTP API (``delayjobs.http``).
    #: Off by default: a key meant to add reminders must not close orders. A key may
    #: also name private types it may schedule (``ApiKey.job_types``).
    public: ClassVar[bool] = False
    #: Backoff of the default ``retry_delay``: ``base * 2 ** (attempt - 1)``, capped,
    #: with equal jitter: drawn from ``[c/2, c]`` for that capped ceiling ``c``.
    retry_backoff_base: ClassVar[timedelta] = timedelta(seconds=2)
    retry_backoff_cap: ClassVar[timedelta] = timedelta(hours=1)
    #: ``delayjobs.Every(minutes=5)`` or ``delayjobs.Cron("0 8 * * MON-FRI", tz=...)``: the
    #: pre-loader then makes one job of this type per tick, however many hosts run it
    #: (docs/howto/recurring.md). ``None``: jobs only when scheduled.
    recurrence: ClassVar[Recurrence | None] = None
    #: What runs of the ticks missed by more than ``misfire_grace`` (the fleet was down):
    #: ``"skip"`` none, ``"once"`` the latest of them, ``"all"`` every one, in order.
    misfire: ClassVar[str] = Misfire.ONCE
    #: How late a tick's job may start and still not count as missed. ``None``: the
    #: ``MISFIRE_GRACE`` setting.
    misfire_grace: ClassVar[timedelta | None] = None

    def execute(self, job: DelayedJob) -> Any:
        """Do the work. Raise to fail this attempt. ``job.attempts`` is this attempt's number.

        A value returned is stored in ``job.result``; it must be JSON-serialisable. It may
        be ``async def``: the consumer then awaits it on its event loop (see the how-to
        "Async job types"), where the sync ORM is not allowed (use ``aget``, ``asave``...).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement execute(job)")

    def queues_served(self) -> Iterable[str]:
        """Queues this type's jobs may be on, which consumers given no ``--queue`` consume.

        Its ``queue``; override it if jobs of the type are scheduled on others
        (``schedule(queue=...)``), so that a plain ``run_delay_consumer`` runs them too.
        """
        return (self.queue,)

    def should_run(self, job: DelayedJob) -> bool:
        """Checked just before each execution; ``False`` ends the job ``skipped``.

        For a job the world has overtaken: the order was paid, the meeting cancelled.
        An exception here fails the attempt like one in ``execute``.
        """
        return True

    def retry_delay(self, job: DelayedJob, exc: BaseException) -> timedelta | None:
        """How long to wait before the next attempt after ``exc``; ``None`` means do not retry."""
        # Equal jitter spreads a burst of failures so the retries do not land together.
        return equal_jitter_backoff(
            job.attempts, base=self.retry_backoff_base, cap=self.retry_backoff_cap
        )

    def limit_key(self, job: DelayedJob) -> str | None:
        """The key the type's limits apply to for ``job``: a tenant, an account, a phone
        number. Each key gets the whole ``global_concurrency`` and ``rate_limit``; keys do
        not wait for each other. ``None`` (the default): one limit for the whole type.

        Called once, when the job is scheduled (the row keeps the key), from its payload.
        """
        return None

    def plan(self, start: datetime, end: datetime) -> Iterable[Mapping[str, Any]]:
        """Yield jobs derived from business data that are due in ``[start, end)``.

        Each item is a dict of ``delayjobs.schedule`` keyword arguments (``payload``,
        ``run_at``, ``key`` ...); ``key`` is required so that planning twice adds nothing.
        The pre-loader calls this on every pass, before it loads the window.
        """
        return ()

    def __repr__(self) -> str:
        return f"<JobType {self.name!r} queue={self.queue!r}>"


JobTypeClass = TypeVar("JobTypeClass", bound=type[JobType])


class Registry:
    """Job types by name. Filled by ``@register`` while installed apps' modules import."""

    def __init__(self) -> None:
        self._types: dict[str, JobType] = {}
        # Names of the types whose execute is ``async def``: asked once per job run.
        self._async: set[str] = set()

    def add(self, cls: type[JobType]) -> None:
        validate_job_type_class(cls)
        existing = self._types.get(cls.name)
        if existing is not None and _qualified_name(type(existing)) != _qualified_name(cls):
            raise ImproperlyConfigured(
                f"Job type name {cls.name!r} is registered twice: by "
                f"{_qualified_name(type(existing))} and by {_qualified_name(cls)}."
            )
        # The same class registered again (a module imported twice, autoreload) replaces
        # the old instance rather than failing.
        self._types[cls.name] = cls()
        if inspect.iscoroutinefunction(cls.execute):
            self._async.add(cls.name)
        else:
            self._async.discard(cls.name)

    def remove(self, name: str) -> None:
        self._types.pop(name, None)
        self._async.discard(name)

    def is_async(self, name: str) -> bool:
        """Whether the type called ``name`` has an ``async def execute`` (False if unknown)."""
        return name in self._async

    def get(self, name: str) -> JobType:
        try:
            return self._types[name]
        except (KeyError, TypeError):
            raise UnknownJobType(name, list(self._types)) from None

    def resolve(self, job_type: str | type[JobType] | JobType) -> JobType:
        """Accept a name, a registered class or its instance; return the registered instance."""
        if isinstance(job_type, JobType):
            job_type = type(job_type)
        if isinstance(job_type, type) and issubclass(job_type, JobType):
            instance = self._types.get(job_type.name)
            if instance is None or type(instance) is not job_type:
                raise UnknownJobType(job_type.name, list(self._types))
            return instance
        if not isinstance(job_type, str):
            raise UnknownJobType(job_type, list(self._types))
        return self.get(job_type)

    def names(self) -> list[str]:
        return sorted(self._types)

    def queues(self) -> list[str]:
        return sorted({queue for jt in self._types.values() for queue in jt.queues_served()})

    def __iter__(self) -> Iterator[JobType]:
        return iter(list(self._types.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._types


registry = Registry()


def register(cls: JobTypeClass) -> JobTypeClass:
    """Class decorator: make a ``JobType`` subclass available to ``schedule`` and consumers."""
    registry.add(cls)
    return cls


def validate_job_type_class(cls: object) -> None:
    """Refuse a job type whose declaration cannot work, at import time, with the reason."""
    validate_declaration(cls)
    job_type = cast("type[JobType]", cls)  # validate_declaration refused anything else
    problems = limit_problems(job_type)
    if problems:
        raise ImproperlyConfigured(f"{_qualified_name(job_type)}.{problems[0]}")


def validate_declaration(cls: object) -> None:
    """Everything ``validate_job_type_class`` checks but the fleet-wide limits (which the
    system checks report under an id of their own, delayjobs.E021)."""
    if not (isinstance(cls, type) and issubclass(cls, JobType)):
        raise ImproperlyConfigured(f"@delayjobs.register expects a JobType subclass, got {cls!r}.")
    label = _qualified_name(cls)
    if not is_name(cls.name):
        raise ImproperlyConfigured(f"{label}.name must be {NAME_RULE}; got {cls.name!r}.")
    if not is_queue(cls.queue):
        raise ImproperlyConfigured(f"{label}.queue must be {QUEUE_RULE}; got {cls.queue!r}.")
    if cls.execute is JobType.execute:
        raise ImproperlyConfigured(f"{label} must implement execute(self, job).")
    _check_callables(cls, label)
    _check_optional_positive_int(cls, "max_attempts", "retry forever")
    _check_optional_positive_int(cls, "concurrency", "no limit of its own")
    _check_duration(cls, "time_to_run", MIN_TIME_TO_RUN, MAX_TIME_TO_RUN)
    _check_duration(cls, "retry_backoff_base", timedelta(microseconds=1), MAX_RETRY_DELAY)
    _check_duration(cls, "retry_backoff_cap", timedelta(microseconds=1), MAX_RETRY_DELAY)
    if cls.max_lateness is not None:
        _check_duration(cls, "max_lateness", MIN_LATENESS, MAX_LATENESS, none_means="no limit")


def limit_problems(cls: type[JobType]) -> list[str]:
    """What is wrong with a type's declared ``global_concurrency``, ``rate_limit`` and
    ``limit_group`` (system check delayjobs.E021); [] if nothing."""
    problems = [
        global_concurrency_problem(cls.global_concurrency),
        rate_limit_problem(cls.rate_limit),
        limit_group_problem(cls.limit_group),
    ]
    return [problem for problem in problems if problem]


def limits_of(jobtype: JobType) -> Limits | None:
    """The fleet-wide limits of a type, with its group; None if it declares none, and
    then its jobs take the claim's usual path, with no work for limits at all."""
    if jobtype.global_concurrency is None and jobtype.rate_limit is None:
        return None
    return Limits(
        group=jobtype.limit_group or jobtype.name,
        global_concurrency=jobtype.global_concurrency,
        rate=jobtype.rate_limit,
    )


#: Methods the consumer calls and uses the value of right away: a coroutine (or an async
#: generator) from one of them would be truthy, or not a timedelta, and never awaited.
SYNC_ONLY_METHODS = ("should_run", "retry_delay", "queues_served", "plan", "limit_key")


def _check_callables(cls: type[JobType], label: str) -> None:
    """``execute`` may be ``def`` or ``async def``, nothing else async; the hooks are sync."""
    if inspect.isasyncgenfunction(cls.execute) or inspect.isgeneratorfunction(cls.execute):
        raise ImproperlyConfigured(
            f"{label}.execute is a generator function: it must be a plain def, or an "
            f"async def that returns (not yields) its value."
        )
    for method in SYNC_ONLY_METHODS:
        function = getattr(cls, method)
        if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
            raise ImproperlyConfigured(
                f"{label}.{method} must be a plain def: only execute may be async def."
            )


def _check_duration(
    cls: type[JobType], attr: str, low: timedelta, high: timedelta, none_means: str = ""
) -> None:
    value = getattr(cls, attr)
    if not isinstance(value, timedelta) or not low <= value <= high:
        alternative = f", or None ({none_means})" if none_means else ""
        raise ImproperlyConfigured(
            f"{_qualified_name(cls)}.{attr} must be a timedelta from {show_duration(low)} to "
            f"{show_duration(high)}{alternative}; got {value!r}."
        )


def show_duration(value: timedelta) -> str:
    """A bound as a message states it: "1 ms", "7 days"."""
    if value.days:
        return f"{value.days} days"
    return f"{value.total_seconds() * 1000:g} ms"


def _check_optional_positive_int(cls: type[JobType], attr: str, none_means: str) -> None:
    value = getattr(cls, attr)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ImproperlyConfigured(
            f"{_qualified_name(cls)}.{attr} must be a positive int or None ({none_means}); "
            f"got {value!r}."
        )


def _qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def code_recurrence_problems(jobtype: JobType) -> list[str]:
    """What is wrong with a job type's ``recurrence``, ``misfire`` and ``misfire_grace``:
    the system check delayjobs.E102 reports it, and nothing ticks meanwhile. [] if the
    type can tick, or has no recurrence."""
    recurrence = jobtype.recurrence
    if recurrence is None:
        return []
    problems = []
    if not isinstance(recurrence, Every | Cron):
        problems.append(
            f"recurrence must be delayjobs.Every(...), delayjobs.Cron(...) or None; got "
            f"{recurrence!r}."
        )
    elif recurrence.problem:
        problems.append(f"recurrence {recurrence!r}: {recurrence.problem}")
    if problem := misfire_problem(jobtype.misfire):
        problems.append(problem)
    grace = jobtype.misfire_grace
    # The grace becomes each tick's job's max_lateness, which has these bounds.
    if grace is not None and (
        not isinstance(grace, timedelta) or not MIN_LATENESS <= grace <= MAX_LATENESS
    ):
        problems.append(
            f"misfire_grace must be a timedelta from {show_duration(MIN_LATENESS)} to "
            f"{show_duration(MAX_LATENESS)}, or None (the MISFIRE_GRACE setting); got {grace!r}."
        )
    return problems
