"""The built-in job type that runs Django Tasks.

``DelayJobsBackend.enqueue()`` writes one ``django.task`` job whose payload is

    {"task": "<Task.module_path>", "args": [...], "kwargs": {...}, "backend": "<alias>"}

The consumer runs it through ``DjangoTaskJob.execute``: the task is found in the index of
declared ``@task`` objects (``contrib.tasks.discovery``), never by importing the stored
path; the alias must name a DelayJobsBackend in ``TASKS``. A task or an alias this process
does not know is retried minutes later (a rolling deploy: a newer consumer may know it); an
alias that is not a DelayJobsBackend, or an unreadable payload, fails the task
(``TaskRefused``, not retried). What the function returns, after the JSON round trip the
core stores it through, is what ``execute`` returns, so the core stores it in
``DelayedJob.result``; a value it could not store fails the task (``UnstorableResult``,
not retried). The TaskResult of a row is built in ``contrib.tasks.results``.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils import timezone

from delayjobs.contrib.tasks.compat import (
    DEFAULT_TASK_QUEUE_NAME,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from delayjobs.contrib.tasks.discovery import index
from delayjobs.contrib.tasks.options import DelayJobsBackendBase
from delayjobs.contrib.tasks.results import (
    TASK_JOB_TYPE,
    TaskCall,
    attempts_of,
    build_result,
    note_exception_class,
    task_error,
    unavailable_task,
)
from delayjobs.core.backoff import equal_jitter_backoff
from delayjobs.exceptions import (
    ForbiddenTaskPath,
    InvalidJob,
    TaskRefused,
    UnknownTaskBackend,
    UnregisteredTask,
    UnstorableResult,
)
from delayjobs.jobtypes import JobType, register
from delayjobs.models import DelayedJob, JobStatus
from delayjobs.payload import storable_json

if TYPE_CHECKING:
    from django.dispatch import Signal

# Named after the module this code was first in: LOGGING configurations may name it.
logger = logging.getLogger("delayjobs.task_jobs")

#: A row naming a task (or a backend alias) this consumer does not know is retried after
#: this long, doubled per attempt and capped (with jitter): during a rolling deploy, a
#: consumer still on the old code leaves a new task to the consumers that define it, rather
#: than failing it within seconds. MAX_ATTEMPTS still bounds the attempts.
UNREGISTERED_RETRY_BASE = timedelta(minutes=2)
UNREGISTERED_RETRY_CAP = timedelta(minutes=30)


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
            # The task may be deployed soon: back off, but reach the cap in a few tries.
            return equal_jitter_backoff(
                job.attempts, base=UNREGISTERED_RETRY_BASE, cap=UNREGISTERED_RETRY_CAP
            )
        return super().retry_delay(job, exc)


def delayjobs_backend(alias: str) -> DelayJobsBackendBase:
    """The backend of ``alias``, which must be a DelayJobsBackend: ``UnknownTaskBackend``
    if ``TASKS`` has no such alias, ``TaskRefused`` if it is not one or cannot load."""
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
    if not isinstance(backend, DelayJobsBackendBase):
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
