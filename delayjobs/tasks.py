"""Compatibility path: the code lives in delayjobs.contrib.celery.tasks.

Celery's autodiscovery imports this module (``delayjobs.tasks``): importing it registers
``delayjobs.tasks.preload`` and ``delayjobs.tasks.execute``. It needs Celery (the
``celery`` extra).
"""

from delayjobs.contrib.celery.tasks import execute, preload

__all__ = ["execute", "preload"]
