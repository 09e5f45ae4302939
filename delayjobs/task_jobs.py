"""Names of the ``django.task`` job type whose paths are data.

A task result's ``TaskError.exception_class_path`` names the stand-in exceptions below and
attempt rows hold it; ``TaskResult.task`` of a row whose task is unknown is a Task of
``unavailable_task``, whose ``module_path`` a result shows. ``docs/howto/django-tasks.md``
documents these paths, so they stay defined here. The job type and the reading of results
live in ``delayjobs.contrib.tasks.jobs`` and ``.results``. Layer 0: imports only
``delayjobs.task_index``.
"""

from __future__ import annotations

from typing import Any, NoReturn

from delayjobs.task_index import UnregisteredTask

#: The job type of every row a DelayJobsBackend writes.
TASK_JOB_TYPE = "django.task"
#: Added to a task's exception as a note, so that its attempt row's traceback carries the
#: exception's full class path for ``TaskError.exception_class_path`` (the row's
#: ``error`` column has the bare class name only).
EXCEPTION_CLASS_NOTE = "Task exception class: "


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


def unavailable_task(*args: Any, **kwargs: Any) -> NoReturn:
    """The function of ``TaskResult.task`` for a row whose task this process does not know
    (renamed, removed, or its module failed to import): the result reads from the row."""
    raise UnregisteredTask(
        "This TaskResult's task is not a @task this process knows; its row's payload "
        "names it. (Only a module of an installed app is imported to find a task.)"
    )


__all__ = [
    "EXCEPTION_CLASS_NOTE",
    "TASK_JOB_TYPE",
    "TaskCancelled",
    "TaskExpired",
    "TaskFailed",
    "TaskRefused",
    "TaskSkipped",
    "TaskWorkerLost",
    "UnknownTaskBackend",
    "unavailable_task",
]
