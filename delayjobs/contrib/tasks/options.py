"""``DelayJobsBackendBase``: a DelayJobsBackend's settings, read and checked.

``QUEUES``: as Django's contract says, the queues tasks may use, and an empty list allows
any queue name. A consumer started without ``--queue`` serves every queue listed here (and
``default``); give ``--queue`` for the others a project's tasks use.

OPTIONS:

- ``MAX_ATTEMPTS``: executions before a raising task is FAILED (default: the job type's,
  5; at most 2**31 - 1); each failed attempt is retried with delayjobs' backoff and is
  listed in ``errors``.
- ``MODULES``: modules outside the installed apps' packages that consumers may import
  to find ``@task`` objects (a task in any module of an installed app needs no listing).
  ``enqueue()`` refuses a task consumers could not import.

Task discovery (``discovery``) and the job type (``job_type``) read these settings from any
``DelayJobsBackendBase``, so neither imports the backend that enqueues (``backend``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from delayjobs.contrib.tasks.compat import BaseTaskBackend
from delayjobs.names import QUEUE_RULE, is_queue
from delayjobs.validation import MAX_ATTEMPTS_LIMIT

OPTION_NAMES = frozenset({"MAX_ATTEMPTS", "MODULES"})


class DelayJobsBackendBase(BaseTaskBackend):
    """The settings of a delayjobs Tasks backend: ``queues``, ``max_attempts``, ``modules``."""

    def default_max_attempts(self) -> int | None:
        """The attempts when OPTIONS gives no MAX_ATTEMPTS: the ``django.task`` job type's,
        read when the backend is built. ``backend.DelayJobsBackend`` knows the job type
        (``job_type``, above this module)."""
        raise NotImplementedError

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        bad_queues = sorted(repr(q) for q in self.queues if not is_queue(q))
        if bad_queues:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['QUEUES']: {', '.join(bad_queues)} cannot be delayjobs "
                f"queues ({QUEUE_RULE})."
            )
        options = self.options if isinstance(self.options, Mapping) else None
        if options is None or set(options) - OPTION_NAMES:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS'] must be a dict with only "
                f"{', '.join(sorted(OPTION_NAMES))}; got {self.options!r}."
            )
        self.max_attempts = _max_attempts(
            alias, options.get("MAX_ATTEMPTS"), self.default_max_attempts()
        )
        modules = options.get("MODULES", [])
        if not isinstance(modules, list | tuple) or not all(isinstance(m, str) for m in modules):
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['MODULES'] must be a list of module paths, "
                f"got {modules!r}."
            )
        self.modules: list[str] = list(modules)


def _max_attempts(alias: str, value: Any, default: int | None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_ATTEMPTS_LIMIT:
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS']['MAX_ATTEMPTS'] must be a positive int up to "
            f"{MAX_ATTEMPTS_LIMIT}, got {value!r}."
        )
    return value
