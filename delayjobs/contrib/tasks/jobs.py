"""The built-in job type that runs Django Tasks, and the TaskResult of a job row.

``DelayJobsBackend.enqueue()`` writes one ``django.task`` job whose payload is

    {"task": "<Task.module_path>", "args": [...], "kwargs": {...}, "backend": "<alias>"}

The consumer runs it through ``DjangoTaskJob.execute``: the task is found in the index of
declared ``@task`` objects (``delayjobs.task_index``), never by importing the stored path;
the alias must name a DelayJobsBackend in ``TASKS``. A task or an alias this process does
not know is retried minutes later (a rolling deploy: a newer consumer may know it); an
alias that is not a DelayJobsBackend, or an unreadable payload, fails the task
(``TaskRefused``, not retried). What the function returns, after the JSON round trip the
core stores it through, is what ``execute`` returns, so the core stores it in
``DelayedJob.result``; a value it could not store fails the task (``UnstorableResult``,
not retried).

``TaskError.exception_class`` imports its ``exception_class_path``: a path read from an
attempt row is therefore kept only if it names an exception class of a module this process
has already loaded (``safe_class_path``); any other stands in as ``TaskFailed``.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import random
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from delayjobs.api import storable_json
from delayjobs.exceptions import InvalidJob, JobTimeout
from delayjobs.execution import UnstorableResult
from delayjobs.jobtypes import JobType, register
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from delayjobs.task_compat import (
    DEFAULT_TASK_QUEUE_NAME,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from delayjobs.task_index import ForbiddenTaskPath, UnregisteredTask, index

if TYPE_CHECKING:
    from django.dispatch import Signal

    from delayjobs.backends import DelayJobsBackend

logger = logging.getLogger(__name__)

#: The job type of every row a DelayJobsBackend writes.
TASK_JOB_TYPE = "django.task"
#: Added to a task's exception as a note, so that its attempt row's traceback carries the
#: exception's full class path for ``TaskError.exception_class_path`` (the row's
#: ``error`` column has the bare class name only).
EXCEPTION_CLASS_NOTE = "Task exception class: "
_DOTTED_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
#: A row naming a task (or a backend alias) this consumer does not know is retried after
#: this long, doubled per attempt and capped (with jitter): during a rolling deploy, a
#: consumer still on the old code leaves a new task to the consumers that define it, rather
#: than failing it within seconds. MAX_ATTEMPTS still bounds the attempts.
UNREGISTERED_RETRY_BASE = timedelta(minutes=2)
UNREGISTERED_RETRY_CAP = timedelta(minutes=30)

#: How each job status reads in the Tasks framework, which has four. A job that ended
#: without succeeding (failed, cancelled, skipped, expired) is FAILED: "raised an
#: exception during execution, or was unable to start"; its errors say which.
STATUS_MAP: dict[str, TaskResultStatus] = {
    JobStatus.SCHEDULED: TaskResultStatus.READY,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobStatus.FAILED: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
    JobStatus.SKIPPED: TaskResultStatus.FAILED,
    JobStatus.EXPIRED: TaskResultStatus.FAILED,
}
FINISHED = (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)


class TaskRefused(Exception):
    """The row cannot run as a task (bad payload, or its alias is not a DelayJobsBackend).

    Not retried: the row will not get better by waiting.
    """


class UnknownTaskBackend(LookupError):
    """The row names a backend alias that is not in this process's ``TASKS``.

    Retried like an unregistered task: a deploy that adds an alias on a shared queue
    leaves consumers still on the old settings claiming its rows.
    """


class TaskCancelled(Exception):
    """Stands in ``TaskResult.errors`` for a job cancelled before it ran."""


class TaskSkipped(Exception):
    """Stands in ``TaskResult.errors`` for a job its job type chose not to run."""


class TaskExpired(Exception):
    """Stands in ``TaskResult.errors`` for a job that could start only past its lateness."""


class TaskWorkerLost(Exception):
    """Stands in ``TaskResult.errors`` for an attempt whose consumer died (lease expired)."""


class TaskFailed(Exception):
    """Stands in ``TaskResult.errors`` for an exception whose class this process cannot
    name safely: its module is not loaded here (``exception_class`` would import it), or
    the name is not an exception class. The traceback text names the original class."""


@dataclass(frozen=True)
class TaskCall:
    """A ``django.task`` payload, checked."""

    path: str
    args: list[Any]
    kwargs: dict[str, Any]
    backend: str
    #: Enqueued with a run_after: its TaskResult's task then shows the row's run_at as
    #: its run_after (moved by a reschedule or a retry), else None, as enqueued.
    deferred: bool = False

    @classmethod
    def from_payload(cls, payload: Any) -> TaskCall:
        if not isinstance(payload, dict):
            raise TaskRefused(f"A {TASK_JOB_TYPE} payload must be an object, got {payload!r:.200}.")
        path, args = payload.get("task"), payload.get("args", [])
        kwargs, backend = payload.get("kwargs", {}), payload.get("backend")
        if not isinstance(path, str) or not path:
            raise TaskRefused(f"The payload names no task: 'task' is {path!r:.200}.")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise TaskRefused("The payload's 'args' must be a list and 'kwargs' an object.")
        if not isinstance(backend, str) or not backend:
            raise TaskRefused(f"The payload names no backend alias: {backend!r:.200}.")
        deferred = payload.get("deferred", False) is True
        return cls(path=path, args=args, kwargs=kwargs, backend=backend, deferred=deferred)

    def payload(self) -> dict[str, Any]:
        payload = {
            "task": self.path,
            "args": self.args,
            "kwargs": self.kwargs,
            "backend": self.backend,
        }
        return {**payload, "deferred": True} if self.deferred else payload


@register
class DjangoTaskJob(JobType):
    """Runs one enqueued Django Task; ``max_attempts`` comes from the backend's OPTIONS."""

    name = TASK_JOB_TYPE
    # Its payload names code to run and the backend to run it with: only the project's
    # own code (``enqueue()``) writes it, never another service through the HTTP API.
    public = False

    def execute(self, job: DelayedJob) -> Any:
        return run_task(job)

    def queues_served(self) -> list[str]:
        """Every queue a DelayJobsBackend alias lets tasks use (its QUEUES), so that a
        consumer started without ``--queue`` runs them all."""
        served = {self.queue}
        for alias in getattr(settings, "TASKS", None) or {}:
            try:
                backend = delayjobs_backend(alias)
            except (TaskRefused, UnknownTaskBackend):
                continue  # another framework's backend, or one that cannot load
            served.update(backend.queues)
        return sorted(served)

    def retry_delay(self, job: DelayedJob, exc: BaseException) -> timedelta | None:
        if isinstance(exc, TaskRefused | ForbiddenTaskPath):
            return None  # no later attempt would do otherwise
        if isinstance(exc, UnregisteredTask | UnknownTaskBackend):
            return unregistered_retry_delay(job.attempts)
        return super().retry_delay(job, exc)


def unregistered_retry_delay(attempt: int) -> timedelta:
    """The wait after ``attempt`` failed because this consumer does not know the task."""
    exponent = min(max(attempt - 1, 0), 16)
    ceiling = min(
        UNREGISTERED_RETRY_BASE.total_seconds() * 2**exponent,
        UNREGISTERED_RETRY_CAP.total_seconds(),
    )
    return timedelta(seconds=random.uniform(ceiling / 2, ceiling))


def delayjobs_backend(alias: str) -> DelayJobsBackend:
    """The backend of ``alias``, which must be a DelayJobsBackend: ``UnknownTaskBackend``
    if ``TASKS`` has no such alias, ``TaskRefused`` if it is not one or cannot load."""
    from delayjobs.backends import DelayJobsBackend

    try:
        backend = task_backends[alias]
    except InvalidTaskBackend as exc:
        if alias not in task_backends.settings:
            raise UnknownTaskBackend(
                f"Task backend alias {alias!r} is not in this process's TASKS (it has "
                f"{', '.join(sorted(map(repr, task_backends.settings)))}); tried again "
                f"later, as a consumer with newer settings may know it."
            ) from None
        raise TaskRefused(f"Task backend alias {alias!r} is not usable: {exc}") from None
    if not isinstance(backend, DelayJobsBackend):
        raise TaskRefused(
            f"Task backend alias {alias!r} is a {type(backend).__name__}, not a "
            f"DelayJobsBackend: delayjobs runs only tasks enqueued through its own backend."
        )
    return backend


def run_task(job: DelayedJob) -> Any:
    """Call the job's task function with its arguments; return its stored return value.

    ``task_started`` and ``task_finished`` are sent for an attempt that found its task
    (before then there is no TaskResult to send). ``task_finished`` says SUCCESSFUL only
    for a return value the core can store: any other fails the task with
    ``UnstorableResult``, which the core does not retry (the work is done).
    """
    try:
        call = TaskCall.from_payload(job.payload)
        backend = delayjobs_backend(call.backend)
        task = task_for_job(index.get(call.path), job, call, call.backend, sorted(backend.queues))
    except BaseException as exc:
        # The note gives the attempt row the class's full path (UnregisteredTask...).
        note_exception_class(exc)
        raise
    history = list(attempts_of(job)) if job.attempts > 1 else []
    result = build_result(task, job, call, history, status=JobStatus.RUNNING)
    sender = type(backend)
    _send(task_started, sender, result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *call.args, **call.kwargs)
        else:
            value = task.call(*call.args, **call.kwargs)
        value = stored_return_value(call.path, value)
    except BaseException as exc:
        class_path = note_exception_class(exc)
        result.errors.append(task_error(class_path, traceback.format_exc()))
        _finish(result, TaskResultStatus.FAILED)
        # Sent inside the handler: the framework's own receiver logs sys.exc_info().
        _send(task_finished, sender, result)
        raise
    _finish(result, TaskResultStatus.SUCCESSFUL, value)
    _send(task_finished, sender, result)
    return value


def task_for_job(
    task: Task, job: DelayedJob, call: TaskCall, alias: str, queues: Sequence[str]
) -> Task:
    """The indexed Task on ``alias``, with the row's priority and queue when the backend
    still allows them (see ``on_backend``), and its run_after if it was deferred."""

    def make(**options: Any) -> Task:
        return dataclasses.replace(task, run_after=run_after_of(job, call), **options)

    return on_backend(make, job, alias, queues)


def run_after_of(job: DelayedJob, call: TaskCall) -> datetime | None:
    return job.run_at if call.deferred else None


def unavailable_task(*args: Any, **kwargs: Any) -> NoReturn:
    """The function of ``TaskResult.task`` for a row whose task this process does not know
    (renamed, removed, or its module failed to import): the result reads from the row."""
    raise UnregisteredTask(
        "This TaskResult's task is not a @task this process knows; its row's payload "
        "names it. (Only a module of an installed app is imported to find a task.)"
    )


def placeholder_task(job: DelayedJob, call: TaskCall, alias: str, queues: Sequence[str]) -> Task:
    """A Task of ``unavailable_task`` on ``alias``, with the row's priority and queue when
    the backend still allows them (see ``on_backend``), and its run_after if deferred."""

    def make(**options: Any) -> Task:
        return Task(func=unavailable_task, run_after=run_after_of(job, call), **options)

    return on_backend(make, job, alias, queues)


def on_backend(
    make: Callable[..., Task], job: DelayedJob, alias: str, queues: Sequence[str]
) -> Task:
    """``make(backend=alias, ...)``: the Task of a row, always on the alias that holds it
    (``TaskResult.refresh()`` asks the task's backend), with the row's priority and queue;
    if the backend no longer allows them (its settings changed since the enqueue: a queue
    removed), with its default queue or else its first, the row keeping its own values."""
    options: list[dict[str, Any]] = [
        {"priority": job.priority, "queue_name": job.queue},
        {"queue_name": DEFAULT_TASK_QUEUE_NAME},
        {"queue_name": min(queues, default=DEFAULT_TASK_QUEUE_NAME)},
    ]
    for option in options[:-1]:
        try:
            return make(backend=alias, **option)
        except InvalidTask:
            continue
    return make(backend=alias, **options[-1])


def attempts_of(job: DelayedJob) -> QuerySet[JobAttempt]:
    return JobAttempt.objects.filter(job_id=job.pk).order_by("number", "started_at", "id")


def current_run(job: DelayedJob, history: Sequence[JobAttempt], status: str) -> list[JobAttempt]:
    """The attempt rows of the job's current run, oldest first.

    ``retry()`` starts a new run (``attempts`` back to 0) and keeps the old rows, without
    recording when. A run numbers its attempts from 1 up and its rows are newer than any
    older run's, so from the newest row back: rows numbered at most ``job.attempts`` down
    to the newest numbered 1. One exception: a running job's newest row numbered
    ``job.attempts`` that started before the claim (``job.claimed_at``) is an older run's,
    as the current attempt's row starts after it: the current run has no row yet.
    """
    run: list[JobAttempt] = []
    limit = job.attempts
    for attempt in sorted(history, key=lambda a: (a.started_at, a.id), reverse=True):
        if attempt.number > limit:
            break
        if (
            not run
            and status == JobStatus.RUNNING
            and attempt.number == job.attempts
            and job.claimed_at is not None
            and attempt.started_at < job.claimed_at
        ):
            break
        run.append(attempt)
        if attempt.number <= 1:
            break
        limit = attempt.number
    run.reverse()
    return run


def build_result(
    task: Task,
    job: DelayedJob,
    call: TaskCall,
    history: Sequence[JobAttempt],
    status: str | None = None,
) -> TaskResult:
    """The TaskResult of a job row and its attempt rows (``status`` overrides the row's)."""
    status = status or job.status
    task_status = STATUS_MAP[status]
    history = current_run(job, history, status)
    worker_ids = [attempt.worker_id for attempt in history]
    starts = [attempt.started_at for attempt in history]
    if status == JobStatus.RUNNING and not any(a.number == job.attempts for a in history):
        # The attempt in progress has no row yet: its claim stands for it.
        worker_ids.append(job.worker_id)
        if job.claimed_at is not None:
            starts.append(job.claimed_at)
    errors = [error for attempt in history if (error := attempt_error(attempt))]
    if status == JobStatus.CANCELLED:
        errors.append(
            task_error(
                _class_path(TaskCancelled), f"The job was cancelled. {job.last_error}".strip()
            )
        )
    result = TaskResult(
        task=task,
        id=str(job.pk),
        status=task_status,
        enqueued_at=job.created_at,
        started_at=min(starts) if starts else None,
        finished_at=job.finished_at if task_status in FINISHED else None,
        last_attempted_at=max(starts) if starts else None,
        args=call.args,
        kwargs=call.kwargs,
        backend=call.backend,
        errors=errors,
        worker_ids=worker_ids,
    )
    if task_status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.result)
    return result


def attempt_error(attempt: JobAttempt) -> TaskError | None:
    """The TaskError of one attempt row, or None for a successful attempt."""
    outcome = attempt.outcome
    if outcome == AttemptOutcome.SUCCEEDED:
        return None
    if outcome in (AttemptOutcome.RETRYING, AttemptOutcome.FAILED):
        path = noted_exception_class(attempt.traceback) or _guess_class_path(attempt.error)
        return task_error(path, attempt.traceback or attempt.error)
    stand_in: type[Exception] = {
        AttemptOutcome.TIMED_OUT: JobTimeout,
        AttemptOutcome.LEASE_EXPIRED: TaskWorkerLost,
        AttemptOutcome.SKIPPED: TaskSkipped,
        AttemptOutcome.EXPIRED: TaskExpired,
    }.get(AttemptOutcome(outcome), TaskWorkerLost)
    text = "\n".join(part for part in (attempt.error, attempt.traceback) if part)
    return task_error(_class_path(stand_in), text or outcome)


def task_error(class_path: str, text: str) -> TaskError:
    """A TaskError whose ``exception_class`` imports nothing: ``class_path`` if it is safe
    (``safe_class_path``), else ``TaskFailed``, the original name added to the text."""
    if safe_class_path(class_path):
        return TaskError(exception_class_path=class_path, traceback=text)
    stand_in = _class_path(TaskFailed)
    note = (
        f"(The exception's class, {class_path!r:.200}, is not an exception class loaded "
        f"in this process; {stand_in} stands in for it.)"
    )
    return TaskError(exception_class_path=stand_in, traceback=f"{text}\n{note}".lstrip("\n"))


def safe_class_path(path: str) -> bool:
    """Whether ``import_string(path)`` would import nothing and give an exception class:
    its module is in ``sys.modules`` and defines the class in its namespace.

    ``TaskError.exception_class`` calls ``import_string``; a path read from a row must not
    make it import a module (invariant 8 of docs/explanation/design.md). The namespace is
    read directly, so not even a module's ``__getattr__`` runs.
    """
    if not isinstance(path, str) or not _DOTTED_PATH.match(path) or "." not in path:
        return False
    module_name, _, name = path.rpartition(".")
    module = sys.modules.get(module_name)
    if not isinstance(module, ModuleType):
        return False
    value = module.__dict__.get(name)
    return isinstance(value, type) and issubclass(value, BaseException)


def note_exception_class(exc: BaseException) -> str:
    """Add the exception's class path to it as a note (read back by ``attempt_error``)."""
    path = _class_path(type(exc))
    try:
        exc.add_note(f"{EXCEPTION_CLASS_NOTE}{path}")
    except Exception:  # an exception class that refuses attributes: keep the bare name
        logger.debug("Could not add a note to %r", exc)
    return path


def noted_exception_class(text: str) -> str | None:
    """The class path noted by ``note_exception_class`` in a traceback; the last one wins.

    The note is printed after the exception's message, so the last such line is the one
    delayjobs wrote, whatever the message itself contains.
    """
    for line in reversed(text.splitlines()):
        if line.startswith(EXCEPTION_CLASS_NOTE):
            path = line[len(EXCEPTION_CLASS_NOTE) :].strip()
            return path if _DOTTED_PATH.match(path) else None
    return None


def _guess_class_path(error: str) -> str:
    """From an attempt's "Type: message": builtins.Type for a built-in, else Type."""
    name = error.split(":", 1)[0].strip()
    if not name.isidentifier():
        return _class_path(Exception)
    if isinstance(getattr(builtins, name, None), type):
        return f"builtins.{name}"
    return name


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def stored_return_value(path: str, value: Any) -> Any:
    """``value`` as ``DelayedJob.result`` will hold it, or ``UnstorableResult``.

    The framework's normalisation (tuples to lists, bytes to text), then the core's own
    check (``storable_json``: finite numbers, no NUL, the size limit) and its JSON round
    trip, so that what the task's result reports now is what ``get_result`` reads later
    (``{1: "a"}`` is ``{"1": "a"}``).
    """
    try:
        normalized = normalize_json(value)
    except (TypeError, ValueError) as exc:
        raise UnstorableResult(
            f"Task {path} returned {type(value).__name__} {value!r:.200}, which is not "
            f"JSON-serializable ({exc}); a task's return value is stored as JSON."
        ) from None
    try:
        return storable_json(normalized, f"The return value of task {path}")
    except InvalidJob as exc:
        raise UnstorableResult(str(exc)) from None


def _finish(result: TaskResult, status: TaskResultStatus, value: Any = None) -> None:
    # TaskResult is frozen; the framework's own backends update theirs the same way.
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", _now())
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", value)


def _send(signal: Signal, sender: type, result: TaskResult) -> None:
    # Receivers are other code: one that raises must neither fail nor falsely pass the
    # task; it is logged.
    for receiver, response in signal.send_robust(sender=sender, task_result=result):
        if isinstance(response, Exception):
            logger.error(
                "A receiver of a Tasks signal failed: %r raised %r (task result %s)",
                receiver,
                response,
                result.id,
                exc_info=response,
            )


def _now() -> datetime:
    return timezone.now()
