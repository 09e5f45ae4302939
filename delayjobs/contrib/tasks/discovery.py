"""The Task objects this process knows, by module path: how a stored task name finds code.

A ``django.task`` job row names its task by ``Task.module_path``, as Django's own backends
store it, and a consumer resolves it as they do, by importing its module, with one limit
(invariant 8 of docs/explanation/design.md): only a module inside an installed app's
package, or one a backend lists in ``OPTIONS["MODULES"]``, is ever imported. A row naming
``os.system`` or a module outside the project's apps imports nothing and fails, saying why.

Discovery fills the index up front, as Celery's autodiscovery does, from

- the ``tasks`` module of every installed app (but delayjobs' own, which holds Celery
  tasks and needs Celery),
- the modules listed in ``OPTIONS["MODULES"]`` of each DelayJobsBackend in ``TASKS``,

and a path found in neither is then imported if its module lies in an installed app.
Every Task object found as an attribute of an imported module is indexed.

Discovery runs on the first lookup that misses, and again on a later miss, at most once
every ``REDISCOVER_INTERVAL`` seconds: a module that failed to import (the database was
down while the consumer started) is tried again, yet a stream of rows naming an unknown
task does not re-import on every row.

``UnregisteredTask`` and ``ForbiddenTaskPath`` are in ``delayjobs.exceptions``: their class
paths are stored in task results.
"""

from __future__ import annotations

import logging
import threading
import time
from importlib import import_module
from types import ModuleType
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import module_has_submodule

from delayjobs.contrib.tasks.compat import Task, task_backends
from delayjobs.contrib.tasks.options import DelayJobsBackendBase
from delayjobs.exceptions import ForbiddenTaskPath, UnregisteredTask

# Named after the module this code was first in: LOGGING configurations may name it.
logger = logging.getLogger("delayjobs.task_index")

#: The module of each installed app that is searched for Task objects.
TASKS_MODULE = "tasks"
#: Apps whose ``tasks`` module is not searched: delayjobs' own holds Celery tasks.
SKIPPED_APPS = frozenset({"delayjobs"})
#: The least time, in seconds, between two discoveries (see the module's docstring).
REDISCOVER_INTERVAL = 5.0


class TaskIndex:
    def __init__(self, rediscover_interval: float = REDISCOVER_INTERVAL) -> None:
        self.rediscover_interval = rediscover_interval
        self._tasks: dict[str, Task] = {}
        # Guards _tasks, _failures and _declared: lookups, listings and additions come
        # from several threads (a consumer's workers, a web server's).
        self._lock = threading.Lock()
        # Held for the whole discovery, so that a lookup racing it waits for its end
        # rather than reporting a task unknown that is being imported.
        self._discovery_lock = threading.Lock()
        #: time.monotonic() of the last discovery; None: none yet.
        self._discovered_at: float | None = None
        #: Declared modules that failed to import, with the error: shown on a miss.
        self._failures: dict[str, str] = {}
        #: declared_modules(), computed once (and again when TASKS or INSTALLED_APPS change).
        self._declared: frozenset[str] | None = None
        #: time.monotonic() when importing an undeclared module of an app last failed.
        self._import_failed_at: dict[str, float] = {}

    def add(self, task: Task) -> None:
        # The first Task object of a path wins: a later copy (task.using(...)) has the
        # same function and only other defaults, which the job row carries anyway.
        with self._lock:
            self._tasks.setdefault(task.module_path, task)

    def add_module(self, module: ModuleType) -> int:
        """Index every Task object that is an attribute of ``module``; return how many."""
        found = [value for value in list(vars(module).values()) if isinstance(value, Task)]
        for task in found:
            self.add(task)
        return len(found)

    def find(self, path: object) -> Task | None:
        """The indexed Task of ``path``, without discovering anything."""
        if not isinstance(path, str):
            return None
        with self._lock:
            return self._tasks.get(path)

    def get(self, path: str) -> Task:
        """The Task whose module path is ``path``, imported if its module lies in an
        installed app; ``ForbiddenTaskPath`` outside them, ``UnregisteredTask`` if no
        @task is found there."""
        task = self.find(path)
        if task is None and isinstance(path, str):
            self.discover()
            task = self.find(path) or self._import(path)
        if task is None:
            raise UnregisteredTask(self._unknown_message(path))
        return task

    def _import(self, path: str) -> Task | None:
        """The @task at ``path``, importing its module, which must be an installed app's
        (or declared); None if the module does not define one there."""
        module_name, _dot, attribute = path.rpartition(".")
        if not (module_name and attribute and importable(module_name)):
            raise ForbiddenTaskPath(
                f"Task {path!r} is not in an installed app's package: a consumer imports "
                f"tasks only from installed apps (and TASKS OPTIONS['MODULES']), never from "
                f"a path some row names. Nothing was imported."
            )
        if self.is_declared(module_name):
            return None  # discovery imports it, at its own pace
        with self._lock:
            failed_at = self._import_failed_at.get(module_name)
        if failed_at is not None and time.monotonic() - failed_at < self.rediscover_interval:
            return None  # as discovery: a stream of rows does not re-import every time
        try:
            module = import_module(module_name)
        except Exception as exc:
            with self._lock:
                self._failures[module_name] = f"{type(exc).__name__}: {exc}"
                self._import_failed_at[module_name] = time.monotonic()
            return None
        with self._lock:
            self._failures.pop(module_name, None)
            self._import_failed_at.pop(module_name, None)
        self.add_module(module)
        return self.find(path)

    def known(self) -> list[str]:
        with self._lock:
            return sorted(self._tasks)

    def is_declared(self, module_name: str) -> bool:
        """Whether ``module_name`` is one of the modules discovery searches."""
        with self._lock:
            declared = self._declared
        if declared is None:
            declared = frozenset(declared_modules())
            with self._lock:
                self._declared = declared
        return module_name in declared

    def discover(self, *, force: bool = False) -> None:
        """Import the declared modules and index their tasks, unless that was done less
        than ``rediscover_interval`` seconds ago (``force``: regardless)."""
        with self._discovery_lock:
            last = self._discovered_at
            recent = last is not None and time.monotonic() - last < self.rediscover_interval
            if recent and not force:
                return
            names = declared_modules()
            failures: dict[str, str] = {}
            for name in names:
                try:
                    module = import_module(name)
                except Exception as exc:
                    # One app's broken tasks module must not make every other task unknown.
                    if name in self._failures:
                        logger.warning("Importing %s failed again: %r", name, exc)
                    else:
                        logger.exception("Could not import %s to find its @task functions", name)
                    failures[name] = f"{type(exc).__name__}: {exc}"
                    continue
                self.add_module(module)
            with self._lock:
                self._failures = failures
                self._declared = frozenset(names)
            self._discovered_at = time.monotonic()

    def forget_declared(self) -> None:
        """Compute the declared modules again when next needed (settings changed)."""
        with self._lock:
            self._declared = None

    def reset(self) -> None:
        """Forget everything (tests; settings changes)."""
        with self._discovery_lock, self._lock:
            self._tasks.clear()
            self._failures.clear()
            self._import_failed_at.clear()
            self._declared = None
            self._discovered_at = None

    def _unknown_message(self, path: object) -> str:
        known = ", ".join(self.known()) or "none"
        with self._lock:
            failed = sorted(self._failures.items())
        failures = "".join(f" Importing {name} failed: {error}." for name, error in failed)
        return (
            f"Task {path!r} is not a registered @task; known: {known}. Define it at module "
            f"level with @task in a module of an installed app.{failures}"
        )


def importable(module_name: str) -> bool:
    """Whether a consumer may import ``module_name`` to find a task: it is (or is inside)
    an installed app's package, or a backend lists it in OPTIONS["MODULES"]."""
    inside_an_app = any(
        module_name == config.name or module_name.startswith(f"{config.name}.")
        for config in apps.get_app_configs()
    )
    return inside_an_app or module_name in configured_modules()


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
        if isinstance(backend, DelayJobsBackendBase):
            modules.extend(name for name in backend.modules if name not in modules)
    return modules


index = TaskIndex()


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("TASKS", "INSTALLED_APPS"):
        index.forget_declared()


setting_changed.connect(_settings_changed, dispatch_uid="delayjobs.contrib.tasks.discovery")
