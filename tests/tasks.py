"""Django Tasks (``@task``) of the test suite, found like any app's ``tasks`` module.

They run through ``delayjobs.contrib.tasks.backend.DelayJobsBackend`` (TASKS in tests/settings.py):
``django.tasks`` on Django 6, the ``django_tasks`` backport on Django 5.2.
"""

from __future__ import annotations

from typing import Any

from tests.models import Execution

try:
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskContext, task  # type: ignore[no-redef]


class TaskBoom(RuntimeError):
    """Raised on purpose by ``boom``."""


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task
async def async_add(a: int, b: int) -> int:
    return a + b


@task
def boom(message: str) -> None:
    raise TaskBoom(message)


@task
def returns_a_set() -> set[int]:
    return {1, 2}


@task(takes_context=True)
def record(context: TaskContext, label: str = "") -> dict[str, Any]:
    """Writes an ``Execution`` row (job id, attempt), the ledger the tests read."""
    result = context.task_result
    Execution.objects.create(job_id=int(result.id), attempt=context.attempt, worker_id=label)
    return {"id": result.id, "attempt": context.attempt, "workers": list(result.worker_ids)}


@task(takes_context=True)
def flaky(context: TaskContext) -> int:
    """Fails its first attempt, then succeeds with the attempt number."""
    if context.attempt < 2:
        raise TaskBoom(f"attempt {context.attempt} fails")
    return context.attempt


@task
def repeat(text: str, times: int) -> str:
    """Returns ``text * times``: a return value as large as a test needs."""
    return text * times


@task
def returns_nan() -> float:
    return float("nan")


@task
def returns_int_keys() -> dict[int, str]:
    return {1: "one"}
