"""The task of the peers built on Django's Tasks framework (dj-queue, django-tasks-db),
and their scheduling client: ``benchmarks.remote`` serves this module's functions in a
process of the peer's venv, with ``benchmarks.tasks_settings``.

Scheduling is the framework's own call for a job at a time,
``work.using(run_after=...).enqueue(job_id, run_at)``; many at once go through the
backend's ``enqueue_all`` where it has one (dj-queue), else a loop (django-tasks-db).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

from benchmarks import bodies

bodies.setup_django()  # the client imports this module first; a worker has set it up

from django.conf import settings  # noqa: E402 - Django is set up above

try:
    from django.tasks import task  # Django 6
except ImportError:  # the backport, on Django 5.2
    from django_tasks import task  # type: ignore[no-redef]


@task()
def work(job_id: int, run_at: float) -> None:
    bodies.job(job_id, run_at)


def _scheduled(run_at: float) -> Any:
    return work.using(run_after=datetime.fromtimestamp(run_at, UTC))


def versions() -> dict[str, str]:
    package = {"dj_queue": "dj-queue", "django_tasks_db": "django-tasks-db"}[settings.APP]
    return {package: version(package), "django": version("django")}


def schedule_one(job: Sequence[Any]) -> None:
    job_id, run_at = job
    _scheduled(run_at).enqueue(job_id, run_at)


def schedule_many(jobs: Sequence[Sequence[Any]]) -> None:
    backend = work.get_backend()
    if hasattr(backend, "enqueue_all"):
        backend.enqueue_all([(_scheduled(t), [i, t], {}) for i, t in jobs])
        return
    for job in jobs:
        schedule_one(job)
