"""The built-in job type that runs Django Tasks, and the TaskResult of a job row.

``DelayJobsBackend.enqueue()`` writes one ``django.task`` job whose payload is

    {"task": "<Task.module_path>", "args": [...], "kwargs": {...}, "backend": "<alias>"}

The consumer runs it through ``DjangoTaskJob.execute``: the task is found in the index of
declared ``@task`` objects (``delayjobs.task_index``), never by importing the stored path;
the alias must name a DelayJobsBackend in ``TASKS``. What the function returns is what
``execute`` returns, so the core stores it in ``DelayedJob.result``.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import re
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils import timezone

from delayjobs.exceptions import JobTimeout
from delayjobs.jobtypes import JobType, register
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from delayjobs.task_compat import (
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
from delayjobs.task_index import index

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


class TaskCancelled(Exception):
    """Stands in ``TaskResult.errors`` for a job cancelled before it ran."""


class TaskSkipped(Exception):
    """Stands in ``TaskResult.errors`` for a job its job type chose not to run."""


class TaskExpired(Exception):
    """Stands in ``TaskResult.errors`` for a job that could start only past its lateness."""


class TaskWorkerLost(Exception):
    """Stands in ``TaskResult.errors`` for an attempt whose consumer died (lease expired)."""


@dataclass(frozen=True)
class TaskCall:
    """A ``django.task`` payload, checked."""

    path: str
    args: list[Any]
    kwargs: dict[str, Any]
    backend: str

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
        return cls(path=path, args=args, kwargs=kwargs, backend=backend)

    def payload(self) -> dict[str, Any]:
        return {
            "task": self.path,
            "args": self.args,
            "kwargs": self.kwargs,
            "backend": self.backend,
        }


@register
class DjangoTaskJob(JobType):
    """Runs one enqueued Django Task; ``max_attempts`` comes from the backend's OPTIONS."""

    name = TASK_JOB_TYPE

    def execute(self, job: DelayedJob) -> Any:
        return run_task(job)

    def queues_served(self) -> list[str]:
        """Every queue a DelayJobsBackend alias lets tasks use (its QUEUES), so that a
        consumer started without ``--queue`` runs them all."""
        served = {self.queue}
        for alias in getattr(settings, "TASKS", None) or {}:
            try:
                backend = delayjobs_backend(alias)
            except TaskRefused:
                continue  # another framework's backend, or one that cannot load
            served.update(backend.queues)
        return sorted(served)

    def retry_delay(self, job: DelayedJob, exc: BaseException) -> timedelta | None:
        if isinstance(exc, TaskRefused):
            return None
        return super().retry_delay(job, exc)


def delayjobs_backend(alias: str) -> DelayJobsBackend:
    """The backend of ``alias``, which must be a DelayJobsBackend, or ``TaskRefused``."""
    from delayjobs.backends import DelayJobsBackend

    try:
        backend = task_backends[alias]
    except InvalidTaskBackend as exc:
        raise TaskRefused(f"Task backend alias {alias!r} is not usable: {exc}") from None
    if not isinstance(backend, DelayJobsBackend):
        raise TaskRefused(
            f"Task backend alias {alias!r} is a {type(backend).__name__}, not a "
            f"DelayJobsBackend: delayjobs runs only tasks enqueued through its own backend."
        )
    return backend


def run_task(job: DelayedJob) -> Any:
    """Call the job's task function with its arguments; return its JSON return value."""
    call = TaskCall.from_payload(job.payload)
    backend = delayjobs_backend(call.backend)
    task = task_for_job(index.get(call.path), job, call.backend)
    history = list(attempts_of(job)) if job.attempts > 1 else []
    result = build_result(task, job, call, history, status=JobStatus.RUNNING)
    sender = type(backend)
    _send(task_started, sender, result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *call.args, **call.kwargs)
        else:
            value = task.call(*call.args, **call.kwargs)
        value = _json_return_value(call.path, value)
    except BaseException as exc:
        class_path = note_exception_class(exc)
        result.errors.append(
            TaskError(exception_class_path=class_path, traceback=traceback.format_exc())
        )
        _finish(result, TaskResultStatus.FAILED)
        # Sent inside the handler: the framework's own receiver logs sys.exc_info().
        _send(task_finished, sender, result)
        raise
    _finish(result, TaskResultStatus.SUCCESSFUL, value)
    _send(task_finished, sender, result)
    return value


def task_for_job(task: Task, job: DelayedJob, alias: str) -> Task:
    """The indexed Task with the options the job was enqueued with (priority, queue, alias)."""
    try:
        return dataclasses.replace(task, priority=job.priority, queue_name=job.queue, backend=alias)
    except InvalidTask:
        # The backend's settings changed since the enqueue (a queue removed): the job's
        # own values stay in the row; the Task keeps its declared defaults.
        return task


def attempts_of(job: DelayedJob) -> Sequence[JobAttempt]:
    return JobAttempt.objects.filter(job_id=job.pk).order_by("number", "started_at", "id")


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
    worker_ids = [attempt.worker_id for attempt in history]
    starts = [attempt.started_at for attempt in history]
    if status == JobStatus.RUNNING and not any(a.number == job.attempts for a in history):
        # The attempt in progress has no row yet: its claim stands for it.
        worker_ids.append(job.worker_id)
        if job.started_at is not None:
            starts.append(job.started_at)
    errors = [error for attempt in history if (error := attempt_error(attempt))]
    if status == JobStatus.CANCELLED:
        errors.append(
            TaskError(
                exception_class_path=_class_path(TaskCancelled),
                traceback=f"The job was cancelled. {job.last_error}".strip(),
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
        return TaskError(exception_class_path=path, traceback=attempt.traceback or attempt.error)
    stand_in = {
        AttemptOutcome.TIMED_OUT: JobTimeout,
        AttemptOutcome.LEASE_EXPIRED: TaskWorkerLost,
        AttemptOutcome.SKIPPED: TaskSkipped,
        AttemptOutcome.EXPIRED: TaskExpired,
    }.get(outcome, TaskWorkerLost)
    text = "\n".join(part for part in (attempt.error, attempt.traceback) if part)
    return TaskError(exception_class_path=_class_path(stand_in), traceback=text or outcome)


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


def _json_return_value(path: str, value: Any) -> Any:
    try:
        return normalize_json(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"Task {path} returned {type(value).__name__} {value!r:.200}, which is not "
            f"JSON-serializable ({exc}); a task's return value is stored as JSON."
        ) from None


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
