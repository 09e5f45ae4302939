"""Compatibility path: the code lives in delayjobs.contrib.celery."""

from delayjobs.contrib.celery.executor import run_dispatched

__all__ = ["run_dispatched"]
