"""Celery task running one pre-loader pass, for Celery beat.

    CELERY_BEAT_SCHEDULE = {
        "delayjobs-preload": {"task": "delayjobs.tasks.preload", "schedule": 10.0},
    }

Importing this module needs Celery (the ``celery`` extra); nothing else in delayjobs does.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from delayjobs import preloader


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
