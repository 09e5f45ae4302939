"""The Task objects this process knows, by module path: how a stored task name finds code.

A ``django.task`` job row names its task by ``Task.module_path``. That path is looked up
here and nowhere else: it is never imported (DESIGN invariant 8). The index is filled by
importing only modules the project declares, as Celery's autodiscovery does:

- the ``tasks`` module of every installed app (but delayjobs' own, which holds Celery
  tasks and needs Celery),
- the modules listed in ``OPTIONS["MODULES"]`` of each DelayJobsBackend in ``TASKS``,

and every Task object found as an attribute of those modules is indexed. ``enqueue()``
also indexes the task it is given, so the enqueuing process can read its results.
Discovery runs once per process, on the first lookup that misses.
"""

from __future__ import annotations

import logging
import threading
from importlib import import_module

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import module_has_submodule

from delayjobs.task_compat import Task, task_backends

logger = logging.getLogger(__name__)

#: The module of each installed app that is searched for Task objects.
TASKS_MODULE = "tasks"
#: Apps whose ``tasks`` module is not searched: delayjobs' own holds Celery tasks.
SKIPPED_APPS = frozenset({"delayjobs"})


class UnregisteredTask(LookupError):
    """A row names a task path that no declared module defines as a ``@task``."""


class TaskIndex:
    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self._lock = threading.Lock()
        # Held for the whole discovery, so that a lookup racing it waits for its end
        # rather than reporting a task unknown that is being imported.
        self._discovery_lock = threading.Lock()
        self._discovered = False
        #: Declared modules that failed to import, with the error: shown on a miss.
        self._failures: dict[str, str] = {}

    def add(self, task: Task) -> None:
        # The first Task object of a path wins: a later copy (task.using(...)) has the
        # same function and only other defaults, which the job row carries anyway.
        with self._lock:
            self._tasks.setdefault(task.module_path, task)

    def add_module(self, module: object) -> int:
        """Index every Task object that is an attribute of ``module``; return how many."""
        found = [value for value in vars(module).values() if isinstance(value, Task)]
        for task in found:
            self.add(task)
        return len(found)

    def get(self, path: str) -> Task:
        """The Task whose module path is ``path``; ``UnregisteredTask`` if none is declared."""
        task = self._tasks.get(path) if isinstance(path, str) else None
        if task is None:
            self.discover()
            task = self._tasks.get(path) if isinstance(path, str) else None
        if task is None:
            raise UnregisteredTask(self._unknown_message(path))
        return task

    def known(self) -> list[str]:
        return sorted(self._tasks)

    def discover(self) -> None:
        """Import the declared modules once and index their tasks."""
        with self._discovery_lock:
            if self._discovered:
                return
            for name in declared_modules():
                try:
                    module = import_module(name)
                except Exception as exc:
                    # One app's broken tasks module must not make every other task unknown.
                    logger.exception("Could not import %s to find its @task functions", name)
                    self._failures[name] = f"{type(exc).__name__}: {exc}"
                    continue
                self.add_module(module)
            self._discovered = True

    def reset(self) -> None:
        """Forget everything (tests; settings changes)."""
        with self._discovery_lock, self._lock:
            self._tasks.clear()
            self._failures.clear()
            self._discovered = False

    def _unknown_message(self, path: object) -> str:
        known = ", ".join(self.known()) or "none"
        failures = "".join(
            f" Importing {name} failed: {error}." for name, error in sorted(self._failures.items())
        )
        return (
            f"Task {path!r} is not a registered @task; known: {known}. Define it with @task "
            f"in the 'tasks' module of an installed app, or list its module in the backend's "
            f"OPTIONS['MODULES'].{failures} (A stored path is never imported.)"
        )


def declared_modules() -> list[str]:
    """Every installed app's ``tasks`` module that exists, then the backends' MODULES."""
    names = [
        f"{config.name}.{TASKS_MODULE}"
        for config in apps.get_app_configs()
        if config.name not in SKIPPED_APPS and module_has_submodule(config.module, TASKS_MODULE)
    ]
    for name in configured_modules():
        if name not in names:
            names.append(name)
    return names


def configured_modules() -> list[str]:
    """``OPTIONS["MODULES"]`` of every DelayJobsBackend alias in ``settings.TASKS``."""
    from delayjobs.backends import DelayJobsBackend

    modules: list[str] = []
    tasks_setting = getattr(settings, "TASKS", None)
    for alias in tasks_setting if isinstance(tasks_setting, dict) else ():
        try:
            # The framework builds the backend (its settings name the class, not data).
            backend = task_backends[alias]
        except ImproperlyConfigured:
            # A bad alias fails loudly wherever it is used; it must not stop discovery.
            logger.warning("TASKS[%r] is misconfigured; its MODULES are not searched", alias)
            continue
        if isinstance(backend, DelayJobsBackend):
            modules.extend(name for name in backend.modules if name not in modules)
    return modules


index = TaskIndex()
