"""The class paths stored in task results, and the backend's settings path, stay put.

``TaskError.exception_class_path`` of a task result names these classes, attempt rows and
``get_result`` readers hold the strings, and docs/howto/django-tasks.md documents them:
they are data, so a refactoring must not move the classes' definitions. The Tasks backend
is named by its path in projects' ``TASKS`` settings. Nothing here reads the database.
"""

from __future__ import annotations

import pytest
from django.utils.module_loading import import_string

from delayjobs import execution, task_index, task_jobs
from delayjobs.contrib.tasks import backend, results
from delayjobs.contrib.tasks.compat import Task

#: Each stored (and mostly documented) path and the object it must name.
STORED_PATHS: dict[str, object] = {
    "delayjobs.task_jobs.TaskFailed": task_jobs.TaskFailed,
    "delayjobs.task_jobs.TaskCancelled": task_jobs.TaskCancelled,
    "delayjobs.task_jobs.TaskWorkerLost": task_jobs.TaskWorkerLost,
    "delayjobs.task_jobs.TaskSkipped": task_jobs.TaskSkipped,
    "delayjobs.task_jobs.TaskExpired": task_jobs.TaskExpired,
    "delayjobs.task_jobs.TaskRefused": task_jobs.TaskRefused,
    "delayjobs.task_jobs.UnknownTaskBackend": task_jobs.UnknownTaskBackend,
    "delayjobs.task_index.UnregisteredTask": task_index.UnregisteredTask,
    "delayjobs.task_index.ForbiddenTaskPath": task_index.ForbiddenTaskPath,
    "delayjobs.execution.UnstorableResult": execution.UnstorableResult,
}


@pytest.mark.parametrize("path", sorted(STORED_PATHS))
def test_a_stored_exception_class_is_defined_at_its_path(path: str) -> None:
    cls = STORED_PATHS[path]
    assert isinstance(cls, type)
    # Defined there, not re-exported: safe_class_path reads the defining module's namespace.
    assert f"{cls.__module__}.{cls.__qualname__}" == path
    assert results.safe_class_path(path)
    assert import_string(path) is cls


def test_the_placeholder_task_keeps_its_module_path() -> None:
    path = "delayjobs.task_jobs.unavailable_task"
    placeholder = task_jobs.unavailable_task
    assert f"{placeholder.__module__}.{placeholder.__qualname__}" == path
    # Every field given: Django 6.0's Task has no defaults for them (the backport has).
    task = Task(
        priority=0, func=placeholder, backend="default", queue_name="default", run_after=None
    )
    assert task.module_path == path


def test_the_documented_backend_paths_name_the_backend() -> None:
    assert (
        import_string("delayjobs.contrib.tasks.backend.DelayJobsBackend")
        is backend.DelayJobsBackend
    )
    assert (
        import_string("delayjobs.contrib.tasks.backend.InvalidTaskCall") is backend.InvalidTaskCall
    )
    assert (
        import_string("delayjobs.contrib.tasks.backend.UnserializableTaskArguments")
        is backend.UnserializableTaskArguments
    )
