"""Every import path the documentation names imports and resolves to an object.

The paths are read from README.md and docs/**/*.md (dotted ``delayjobs.…`` names and
``from delayjobs… import …`` lines), so a page cannot name a path that does not exist, and a
move cannot break a documented path unnoticed. A short pinned list keeps the public paths
even if a page stops naming one. Class paths that are data (written into rows and task
results) must be *defined* at their module. Importing needs Django set up (the suite's
settings), but no database and no Redis query.
"""

from __future__ import annotations

import ast
import re
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.utils.module_loading import import_string

import delayjobs
from delayjobs import exceptions
from delayjobs.core import tracing

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SKIPPED_DIRS = {"_build", "_generated"}

DOTTED = re.compile(r"(?<![\w/.-])delayjobs(?:\.[A-Za-z_]\w*)+")
FROM_IMPORT = re.compile(r"^\s*from (delayjobs[\w.]*) import \(?([\w, ]+)", re.M)
#: A check id (delayjobs.E001): not a path.
CHECK_ID = re.compile(r"delayjobs\.[CEIW]\d+")

#: The public paths, whatever the pages say: the facade, the modules a project imports
#: from, and the paths that settings and Celery name.
PINNED = [
    *(f"delayjobs.{name}" for name in delayjobs.__all__),
    "delayjobs.api.schedule",
    "delayjobs.api.schedule_many",
    "delayjobs.api.cancel",
    "delayjobs.api.reschedule",
    "delayjobs.api.retry",
    "delayjobs.jobtypes.JobType",
    "delayjobs.jobtypes.register",
    "delayjobs.recurring.rules.Every",
    "delayjobs.recurring.rules.Cron",
    "delayjobs.recurring.definitions.pause_schedule",
    "delayjobs.recurring.definitions.resume_schedule",
    "delayjobs.bindings.bind",
    "delayjobs.bindings.Binding",
    "delayjobs.pauses.pause",
    "delayjobs.pauses.resume",
    "delayjobs.models.DelayedJob",
    "delayjobs.models.JobAttempt",
    "delayjobs.models.JobStatus",
    "delayjobs.models.AttemptOutcome",
    "delayjobs.models.jobs_database",
    "delayjobs.models.new_trace_id",  # migration 0001 names it
    "delayjobs.contrib.tasks.backend.DelayJobsBackend",  # TASKS settings name it
    "delayjobs.contrib.tasks.backend.InvalidTaskCall",
    "delayjobs.tasks.preload",  # Celery beat schedules name it
    "delayjobs.tasks.execute",
    "delayjobs.signals.job_failed",
    "delayjobs.conf.DEFAULTS",
    "delayjobs.conf.settings",
    "delayjobs.core.metrics.metrics_view",
    "delayjobs.engine.preloader.preload",
    "delayjobs.api.stats",
    "delayjobs.admin.DelayedJobInline",
    "delayjobs.http.urls",
    "delayjobs.api_keys.create_api_key",
    "delayjobs.http.app.api_docs",
]

#: Written into rows and results as ``module.qualname``: each must be *defined* there.
DATA_PATHS = [
    "delayjobs.contrib.tasks.results.unavailable_task",  # its Task.module_path is shown
    *sorted(
        f"delayjobs.exceptions.{name}"
        for name, value in vars(exceptions).items()
        if isinstance(value, type) and issubclass(value, BaseException)
    ),
]


def _permission(path: str) -> bool:
    """delayjobs.view_delayedjob, delayjobs.cancel_delayedjob: a permission, not a path."""
    models = {model._meta.model_name for model in apps.get_app_config("delayjobs").get_models()}
    _, _, codename = path.partition(".")
    return "." not in codename and any(codename.endswith(f"_{model}") for model in models)


def documented_paths() -> list[str]:
    """Every dotted ``delayjobs…`` path on the pages, and each ``from … import`` name."""
    found: set[str] = set()
    for document in DOCUMENTS:
        if SKIPPED_DIRS & set(document.parts):
            continue
        text = document.read_text(encoding="utf-8")
        found.update(DOTTED.findall(text))
        for module, names in FROM_IMPORT.findall(text):
            found.update(f"{module}.{name.strip()}" for name in names.split(",") if name.strip())
        if re.search(r"^\s*import delayjobs\s*$", text, re.M):
            found.add("delayjobs")
    return sorted(
        p
        for p in found
        if not CHECK_ID.fullmatch(p) and not _permission(p) and p not in tracing.OWN_ATTRIBUTES
    )


def resolve(path: str) -> Any:
    """Import the longest importable prefix of ``path``, then read the rest as attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is None or not ".".join(parts[:cut]).startswith(exc.name):
                raise  # a module that exists failed to import something else: say so
            continue
        origin = Path(found.__file__ or "").resolve()
        # Another checkout's editable install can answer for a module missing here.
        assert origin.is_relative_to(REPO), f"{path} was imported from {origin}, not {REPO}"
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(path)


ALL_PATHS = sorted(set(documented_paths()) | set(PINNED) | set(DATA_PATHS))


def test_the_pages_name_paths() -> None:
    """A guard for the scan itself: the pages name dozens of paths."""
    found = documented_paths()
    assert len(found) >= 40, found
    assert {"delayjobs.schedule", "delayjobs.contrib.tasks.backend.DelayJobsBackend"} <= set(found)


@pytest.mark.parametrize("path", ALL_PATHS)
def test_a_documented_path_resolves(path: str) -> None:
    assert resolve(path) is not None


@pytest.mark.parametrize("path", DATA_PATHS)
def test_a_class_path_that_is_data_is_defined_there(path: str) -> None:
    found = resolve(path)
    # Defined there, not re-exported: safe_class_path reads the defining module's namespace.
    assert f"{found.__module__}.{found.__qualname__}" == path
    assert import_string(path) is found


@pytest.mark.parametrize("path", [p for p in DATA_PATHS if isinstance(resolve(p), type)])
def test_a_stored_exception_path_reads_back_as_its_class(path: str) -> None:
    """A task result reads an attempt's exception class back from its stored path."""
    from delayjobs.contrib.tasks.results import safe_class_path

    assert safe_class_path(path)


def test_the_placeholder_task_shows_its_module_path() -> None:
    from delayjobs.contrib.tasks.compat import Task
    from delayjobs.contrib.tasks.results import unavailable_task

    # Every field given: Django 6.0's Task has no defaults for them (the backport has).
    task = Task(
        priority=0, func=unavailable_task, backend="default", queue_name="default", run_after=None
    )
    assert task.module_path == "delayjobs.contrib.tasks.results.unavailable_task"


@pytest.mark.parametrize("name", ["preload", "execute"])
def test_the_celery_task_names_stay(name: str) -> None:
    assert resolve(f"delayjobs.tasks.{name}").name == f"delayjobs.tasks.{name}"


def test_the_facade_exports_resolve() -> None:
    """Every name of the lazy facade imports from the module it names, and is public."""
    exported = delayjobs._EXPORTS
    assert set(exported) | {"__version__"} == set(delayjobs.__all__)
    for name, module in exported.items():
        assert getattr(delayjobs, name) is getattr(import_module(module), name), name


def _executor_paths() -> list[str]:
    """The strings of every ``EXECUTOR_PATHS = {...}`` in the package (ast: no import)."""
    paths = []
    for path in sorted((REPO / "delayjobs").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            value = getattr(node, "value", None)
            if any(isinstance(t, ast.Name) and t.id == "EXECUTOR_PATHS" for t in targets):
                assert isinstance(value, ast.Dict), f"{path}: EXECUTOR_PATHS is a dict literal"
                paths += [
                    v.value
                    for v in value.values
                    if isinstance(v, ast.Constant) and isinstance(v.value, str)
                ]
    return paths


def test_every_executor_path_resolves() -> None:
    """Engine names executors by dotted path (it never imports contrib): each must resolve."""
    paths = _executor_paths()
    assert paths, "no EXECUTOR_PATHS found in delayjobs"
    for path in paths:
        assert isinstance(resolve(path), type), path


def test_every_executor_setting_has_a_path() -> None:
    """The names the EXECUTOR setting accepts are exactly the executors the engine can load."""
    from delayjobs.conf import EXECUTORS
    from delayjobs.engine.executors import EXECUTOR_PATHS

    assert set(EXECUTORS) == set(EXECUTOR_PATHS)
