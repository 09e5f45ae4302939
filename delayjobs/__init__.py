"""Database-backed delayed jobs for Django.

The public API is re-exported here lazily, so that ``import delayjobs`` is safe before
Django's app registry is ready (for example in ``settings.py`` or ``apps.py``).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from delayjobs.core.version import __version__

_EXPORTS = {
    "schedule": "delayjobs.api",
    "schedule_many": "delayjobs.api",
    "cancel": "delayjobs.api",
    "reschedule": "delayjobs.api",
    "retry": "delayjobs.api",
    "bind": "delayjobs.bindings",
    "JobType": "delayjobs.jobtypes",
    "register": "delayjobs.jobtypes",
    "Every": "delayjobs.recurring.rules",
    "Cron": "delayjobs.recurring.rules",
    "Rate": "delayjobs.limits",
    "pause_schedule": "delayjobs.recurring.definitions",
    "resume_schedule": "delayjobs.recurring.definitions",
    "DelayJobsError": "delayjobs.exceptions",
    "InvalidJob": "delayjobs.exceptions",
    "UnknownJobType": "delayjobs.exceptions",
    "DuplicateJob": "delayjobs.exceptions",
    "JobNotFound": "delayjobs.exceptions",
    "InvalidTransition": "delayjobs.exceptions",
}

__all__ = [
    "Cron",
    "DelayJobsError",
    "DuplicateJob",
    "Every",
    "InvalidJob",
    "InvalidTransition",
    "JobNotFound",
    "JobType",
    "Rate",
    "UnknownJobType",
    "__version__",
    "bind",
    "cancel",
    "pause_schedule",
    "register",
    "reschedule",
    "resume_schedule",
    "retry",
    "schedule",
    "schedule_many",
]

if TYPE_CHECKING:
    from delayjobs.api import cancel, reschedule, retry, schedule, schedule_many
    from delayjobs.bindings import bind
    from delayjobs.exceptions import (
        DelayJobsError,
        DuplicateJob,
        InvalidJob,
        InvalidTransition,
        JobNotFound,
        UnknownJobType,
    )
    from delayjobs.jobtypes import JobType, register
    from delayjobs.limits import Rate
    from delayjobs.recurring.definitions import pause_schedule, resume_schedule
    from delayjobs.recurring.rules import Cron, Every


def __getattr__(name: str) -> Any:
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'delayjobs' has no attribute {name!r}") from None
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
