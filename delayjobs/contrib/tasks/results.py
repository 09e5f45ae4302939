"""What a ``django.task`` row reads as: its payload (``TaskCall``) and its ``TaskResult``.

``TaskError.exception_class`` imports its ``exception_class_path``: a path read from an
attempt row is therefore kept only if it names an exception class of a module this process
has already loaded (``safe_class_path``); any other stands in as ``TaskFailed``. The
stand-in classes are in ``delayjobs.exceptions``.
"""

from __future__ import annotations

import builtins
import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NoReturn

from django.db.models import QuerySet

from delayjobs.contrib.tasks.compat import Task, TaskError, TaskResult, TaskResultStatus
from delayjobs.exceptions import (
    JobTimeout,
    TaskCancelled,
    TaskExpired,
    TaskFailed,
    TaskRefused,
    TaskSkipped,
    TaskWorkerLost,
    UnregisteredTask,
)
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus

# Named after the module this code was first in: LOGGING configurations may name it.
logger = logging.getLogger("delayjobs.task_jobs")

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


def unavailable_task(*args: Any, **kwargs: Any) -> NoReturn:
    """The function of ``TaskResult.task`` for a row whose task this process does not know
    (renamed, removed, or its module failed to import): the result reads from the row."""
    raise UnregisteredTask(
        "This TaskResult's task is not a @task this process knows; its row's payload "
        "names it. (Only a module of an installed app is imported to find a task.)"
    )


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
