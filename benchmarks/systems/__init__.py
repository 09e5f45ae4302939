"""One adapter per job system, with the interface of :class:`base.System`.

Each module is imported only when its system is benchmarked: it imports its library at
the top, and defines the app its worker processes load.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # worker modules of this package import nothing the driver uses
    from benchmarks.systems.base import System

SYSTEMS = {
    "bare": "benchmarks.systems.bare_system:BareSystem",
    "delayjobs": "benchmarks.systems.delayjobs_system:DelayJobsSystem",
    "celery": "benchmarks.systems.celery_system:CelerySystem",
    "huey": "benchmarks.systems.huey_system:HueySystem",
    "rq": "benchmarks.systems.rq_system:RQSystem",
    "procrastinate": "benchmarks.systems.procrastinate_system:ProcrastinateSystem",
    "oban": "benchmarks.systems.oban_system:ObanSystem",
    "pgqueuer": "benchmarks.systems.pgqueuer_system:PgQueuerSystem",
    "djqueue": "benchmarks.systems.django_tasks_system:DjQueueSystem",
    "django-tasks-db": "benchmarks.systems.django_tasks_system:DjangoTasksDbSystem",
}


def load(name: str) -> type[System]:
    module, _, attribute = SYSTEMS[name].partition(":")
    system: type[System] = getattr(importlib.import_module(module), attribute)
    return system
