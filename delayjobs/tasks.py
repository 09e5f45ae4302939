"""Celery tasks: the pre-loader for Celery beat, and the Celery executor's job runner.

    CELERY_BEAT_SCHEDULE = {
        "delayjobs-preload": {"task": "delayjobs.tasks.preload", "schedule": 10.0},
    }

``delayjobs.tasks.execute`` runs one claimed job for ``run_delay_consumer --executor
celery`` (see ``delayjobs.contrib.celery.executor``); route it like any task
(``CELERY_TASK_ROUTES = {"delayjobs.tasks.execute": {"queue": "jobs"}}``).

Celery's ``autodiscover_tasks()`` imports this module as ``<app>.tasks``, which registers
both tasks; within delayjobs, only the Celery executor (``delayjobs.contrib.celery``)
imports it, to publish ``execute``. Importing it needs Celery (the ``celery`` extra).
"""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from delayjobs.contrib.celery import worker
from delayjobs.engine import preloader


@shared_task(name="delayjobs.tasks.preload", ignore_result=True)
def preload() -> dict[str, Any]:
    """One pass; a pass already running elsewhere makes this one a no-op."""
    result = preloader.preload()
    return {
        "ran": result.ran,
        "reaped": result.reaped,
        "planned": result.planned,
        "loaded": result.loaded,
        "errors": result.errors,
    }


@shared_task(name="delayjobs.tasks.execute", bind=True, ignore_result=True)
def execute(
    task: Task[Any, str], job_id: int, attempt: int, claimed_by: str, claimed_at: str
) -> str:
    """Run one job claimed by a consumer; its outcome goes to the job's rows, not here.

    No Celery retries (the job type's policy retries, through the row) and no late ack:
    a message lost with its worker leaves the job to its lease, like a dead consumer.
    """
    worker_id = worker.celery_worker_id(task.request.hostname)
    return worker.run_dispatched(
        job_id, attempt, claimed_by, claimed_at, worker_id, worker.trace_headers(task.request)
    )
