"""Compatibility path: the code lives in delayjobs.contrib.tasks.backend.

Documented: ``TASKS = {"default": {"BACKEND": "delayjobs.backends.DelayJobsBackend"}}``
and ``delayjobs.backends.InvalidTaskCall``; projects' settings name this path.
"""

from delayjobs.contrib.tasks.backend import (
    DelayJobsBackend,
    InvalidTaskCall,
    TaskResultStatus,
    UnserializableTaskArguments,
)

__all__ = ["DelayJobsBackend", "InvalidTaskCall", "TaskResultStatus", "UnserializableTaskArguments"]
