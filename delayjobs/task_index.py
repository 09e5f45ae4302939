"""Exceptions of the Django Tasks backend's task lookup, defined at a path that is data.

A task result's ``TaskError.exception_class_path`` names these classes, attempt rows hold
the path, and ``docs/howto/django-tasks.md`` documents it: they stay defined here, and this
module stays importable without the Tasks framework. The lookup itself (``TaskIndex``) lives
in ``delayjobs.contrib.tasks.discovery``. Layer 0: imports nothing.
"""

from __future__ import annotations


class UnregisteredTask(LookupError):
    """A row names a task path that no importable module defines as a ``@task``."""


class ForbiddenTaskPath(UnregisteredTask):
    """A row names a task path outside every installed app: nothing was imported, and no
    later attempt will import it either."""


__all__ = ["ForbiddenTaskPath", "UnregisteredTask"]
