"""One import point for Django's Tasks framework, wherever it comes from.

Django 6.x ships it as ``django.tasks``; on Django 5.2 the ``django-tasks`` package
(``django_tasks``) is its backport. The built-in one wins when both are importable, so a
project on Django 6 never mixes the two. The backport names two exceptions differently
(``InvalidTaskError``, ``InvalidTaskBackendError``); they are exported here under the
built-in names.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

try:
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
except ImportError:
    try:
        from django_tasks import (  # type: ignore[no-redef]
            DEFAULT_TASK_QUEUE_NAME,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            default_task_backend,
            task_backends,
        )
        from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
        from django_tasks.base import Task, TaskError  # type: ignore[no-redef]
        from django_tasks.exceptions import (  # type: ignore[no-redef]
            InvalidTaskBackendError as InvalidTaskBackend,
        )
        from django_tasks.exceptions import (  # type: ignore[no-redef]
            InvalidTaskError as InvalidTask,
        )
        from django_tasks.exceptions import (  # type: ignore[no-redef]
            TaskResultDoesNotExist,
            TaskResultMismatch,
        )

        # The backport's receivers (logging, and resetting backends when TASKS changes
        # under override_settings) live here; its app config would import it, but the
        # app need not be installed for the backend to work.
        from django_tasks.signals import (  # type: ignore[no-redef]
            task_enqueued,
            task_finished,
            task_started,
        )
        from django_tasks.utils import normalize_json  # type: ignore[no-redef]

        FRAMEWORK = "django_tasks"
    except ImportError as exc:
        raise ImproperlyConfigured(
            "delayjobs.contrib.tasks.backend.DelayJobsBackend needs Django's Tasks framework: "
            "Django 6.0+ (django.tasks) or, on Django 5.2, the backport: pip install "
            f"'django-delayjobs[tasks]' (django-tasks). ({exc})"
        ) from exc

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "FRAMEWORK",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "default_task_backend",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
