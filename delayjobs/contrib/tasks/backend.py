"""``DelayJobsBackend``: Django's Tasks framework on delayjobs' rows, Redis and consumers.

    TASKS = {"default": {"BACKEND": "delayjobs.contrib.tasks.backend.DelayJobsBackend"}}

``task.enqueue()`` writes one ``django.task`` job row in the caller's transaction (the
Redis hand-off waits for the commit, as ``delayjobs.schedule`` always does): ``run_at`` is
the task's ``run_after`` (or now), ``priority`` and ``queue`` are the task's. A consumer
(``run_delay_consumer``) runs it; ``get_result()`` reads the row and its attempts.

Its settings (``QUEUES``, ``OPTIONS``: ``MAX_ATTEMPTS``, ``MODULES``) are read and checked
by ``contrib.tasks.options.DelayJobsBackendBase``, which it subclasses. Projects name it by
its documented path, ``delayjobs.contrib.tasks.backend.DelayJobsBackend``.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import transaction

from delayjobs.api import schedule
from delayjobs.contrib.tasks.compat import (
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from delayjobs.contrib.tasks.discovery import importable, index
from delayjobs.contrib.tasks.job_type import DjangoTaskJob, placeholder_task, task_for_job
from delayjobs.contrib.tasks.options import DelayJobsBackendBase
from delayjobs.contrib.tasks.results import TASK_JOB_TYPE, TaskCall, attempts_of, build_result
from delayjobs.exceptions import InvalidJob, TaskRefused, UnregisteredTask
from delayjobs.models import DelayedJob, jobs_database

# The old module's name: users' LOGGING names it.
logger = logging.getLogger("delayjobs.backends")

#: The largest id of a job row (a 64-bit signed integer on every database).
MAX_JOB_ID = 2**63 - 1


class InvalidTaskCall(InvalidTask, InvalidJob):
    """A task cannot be enqueued so: arguments that do not round-trip through JSON, a
    payload over the size limit, a queue name delayjobs cannot hold...

    Both the Tasks framework's ``InvalidTask`` and delayjobs' ``InvalidJob`` (a
    ``ValueError``) catch it.
    """


class UnserializableTaskArguments(InvalidTaskCall, TypeError):
    """Arguments JSON cannot hold (a set, an object): a ``TypeError`` as well, as Django's
    own backends raise for them."""


class DelayJobsBackend(DelayJobsBackendBase):
    supports_defer = True
    supports_priority = True
    supports_get_result = True
    # A coroutine task runs in the consumer's worker thread through async_to_sync.
    supports_async_task = True

    def default_max_attempts(self) -> int | None:
        # Without OPTIONS["MAX_ATTEMPTS"], a task gets the django.task job type's attempts.
        return DjangoTaskJob.max_attempts

    def enqueue(self, task: Task, args: Iterable[Any], kwargs: Mapping[str, Any]) -> TaskResult:
        self.validate_task(task)
        self._check_discoverable(task)
        call = TaskCall(
            path=task.module_path,
            args=_json_round_trip(task, "args", list(args)),
            kwargs=_json_round_trip(task, "kwargs", dict(kwargs)),
            backend=self.alias,
            deferred=task.run_after is not None,
        )
        try:
            job = schedule(
                TASK_JOB_TYPE,
                call.payload(),
                run_at=task.run_after,
                queue=task.queue_name,
                priority=task.priority,
                max_attempts=self.max_attempts,
            )
        except InvalidJob as exc:
            raise InvalidTaskCall(f"Task {task.module_path}: {exc}") from None
        result = build_result(task, job, call, history=[])
        using = jobs_database()
        # Like delayjobs' job_scheduled: only once the row exists for others to see.
        transaction.on_commit(lambda: _send_enqueued(type(self), result), using=using)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        job = self._job(result_id)
        try:
            call = TaskCall.from_payload(job.payload)
        except TaskRefused as exc:
            raise TaskResultDoesNotExist(
                f"Task result {result_id!r} is unreadable: {exc}"
            ) from None
        if call.backend != self.alias:
            raise TaskResultDoesNotExist(
                f"Task result {result_id!r} is of backend {call.backend!r}, not {self.alias!r}."
            )
        try:
            task = task_for_job(index.get(call.path), job, call, self.alias, sorted(self.queues))
        except UnregisteredTask:
            # A renamed or removed task, or one whose module failed to import here: the
            # row still tells its status, errors and return value.
            task = placeholder_task(job, call, self.alias, sorted(self.queues))
        return build_result(task, job, call, list(attempts_of(job)))

    def _check_discoverable(self, task: Task) -> None:
        """Refuse a task no consumer could run: one whose module lies outside every
        installed app (and OPTIONS["MODULES"]), which consumers never import, or that is
        not a @task attribute of its module, where they look it up."""
        path = task.module_path
        if index.find(path) is not None:
            return
        module_name = getattr(task.func, "__module__", None) or ""
        if not importable(module_name):
            raise InvalidTaskCall(
                f"Task {path} is defined in {module_name}, outside every installed app: "
                f"consumers import tasks only from installed apps' packages, so none could "
                f"run it. Move it into an app, or add {module_name!r} to "
                f"TASKS[{self.alias!r}]['OPTIONS']['MODULES']."
            )
        module = sys.modules.get(module_name)
        if module is not None:
            index.add_module(module)  # loaded already: it defines the function
        if index.find(path) is None:
            index.discover()  # a Task object of one declared module may wrap another's
        if index.find(path) is None:
            raise InvalidTaskCall(
                f"Task {path} is not a @task attribute of its module {module_name}, so "
                f"consumers, which look tasks up by module attribute, would not find it. "
                f"Define it at module level with @task."
            )

    def _job(self, result_id: Any) -> DelayedJob:
        text = str(result_id) if isinstance(result_id, str | int) else ""
        # Only plain decimal ids: "1e3", " 7" or "٣" (int() takes them) are not ids we gave;
        # nor one past the largest id a row can have, which is never sent to the database
        # (Django's own backends answer "no row", but a driver may raise OverflowError).
        if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) > MAX_JOB_ID:
            raise TaskResultDoesNotExist(f"No task result {result_id!r}: ids are job numbers.")
        job = DelayedJob.objects.filter(pk=int(text), job_type=TASK_JOB_TYPE).first()
        if job is None:
            raise TaskResultDoesNotExist(f"No task result {result_id!r}.")
        return job


def _json_round_trip(task: Task, label: str, value: Any) -> Any:
    """``value`` as the task will receive it; refused unless JSON gives back the same.

    The Tasks framework requires arguments to round-trip through JSON: a dict with int
    keys, a set or a datetime would reach the task changed or not at all.
    """
    try:
        normalized = normalize_json(value)
        text = json.dumps(normalized, allow_nan=False)
    except (TypeError, ValueError) as exc:
        refused = UnserializableTaskArguments if isinstance(exc, TypeError) else InvalidTaskCall
        raise refused(
            f"Task {task.module_path}: {label} must be JSON-serializable (dicts with string "
            f"keys, lists, strings, finite numbers, booleans, None): {exc}."
        ) from None
    if json.loads(text) != normalized:
        raise InvalidTaskCall(
            f"Task {task.module_path}: {label} would not come back the same from JSON "
            f"({normalized!r:.200} becomes {json.loads(text)!r:.200}); use string keys."
        )
    return normalized


def _send_enqueued(sender: type, result: TaskResult) -> None:
    for receiver, response in task_enqueued.send_robust(sender=sender, task_result=result):
        if isinstance(response, Exception):
            logger.error("A task_enqueued receiver failed: %r raised %r", receiver, response)


__all__ = ["DelayJobsBackend", "InvalidTaskCall", "TaskResultStatus", "UnserializableTaskArguments"]
