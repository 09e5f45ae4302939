"""A @task outside any ``tasks`` module, in a module of an installed app (``tests``), as a
project following Django's documentation may put one: consumers import it by its path."""

from __future__ import annotations

try:
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskContext, task  # type: ignore[no-redef]


@task
def multiply(a: int, b: int) -> int:
    return a * b


@task
def pair(a: object, b: object) -> tuple[object, object]:
    """Returns a tuple, which comes back from JSON as a list."""
    return a, b


@task(takes_context=True)
def whoami(context: TaskContext, *args: object, **kwargs: object) -> dict[str, object]:
    """What a task sees of itself while it runs."""
    result = context.task_result
    return {
        "attempt": context.attempt,
        "status": str(result.status),
        "args": result.args,
        "queue_name": result.task.queue_name,
        "workers": len(result.worker_ids),
    }
