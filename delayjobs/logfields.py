"""Compatibility path: the code lives in delayjobs.core.logfields."""

from delayjobs.core.logfields import job_fields

__all__ = ["job_fields"]
