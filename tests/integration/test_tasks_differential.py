"""Django Tasks, differentially: every scenario runs on the reference database backend
(django-tasks-db's ``DatabaseBackend``, with its ``db_worker``) and on delayjobs' backend
(with a consumer), and what a caller can observe must be the same.

Observed: statuses before and after a worker ran, arguments and return values after their
JSON round trip, priority, queue, run_after, the timestamps that are set, worker ids, the
errors (exception class, and the exception's line in the traceback), ``get_result()`` and
``refresh()``, ``aenqueue()``, and the exceptions that validation raises. Not observed,
because they differ on purpose (docs/howto/django-tasks.md, "Differences from the
reference backend"): the ids (job numbers here, UUIDs there), worker names, retries (the
"differential" alias allows one attempt, as the reference makes), and two failures that
delayjobs names more precisely (``NON_JSON_RETURN`` below).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from delayjobs.contrib.tasks.compat import InvalidTask, TaskResultDoesNotExist, task_backends
from delayjobs.engine.consumer import Consumer
from tests import task_functions, tasks

pytestmark = pytest.mark.django_db(transaction=True)

REFERENCE = "reference"
DELAYJOBS = "differential"
#: A task returning what JSON cannot hold fails on both; the reference records the
#: TypeError of its serializer, delayjobs its own UnstorableResult (a TypeError too).
NON_JSON_RETURN = {
    REFERENCE: "builtins.TypeError",
    DELAYJOBS: "delayjobs.exceptions.UnstorableResult",
}


def run_worker(alias: str) -> None:
    """Run what is due with the backend's own worker, until nothing is left."""
    if alias == REFERENCE:
        call_command(
            "db_worker",
            "--batch",
            f"--backend={REFERENCE}",
            "--queue-name=*",
            "--no-startup-delay",
            "--interval=0.05",
        )
    else:
        assert Consumer(queues=["default", "other"], burst=True, concurrency=2).run() == 0


def observed(result: Any) -> dict[str, Any]:
    """What a caller sees of a task result (ids and worker names aside)."""
    seen: dict[str, Any] = {
        "status": str(result.status),
        "args": result.args,
        "kwargs": result.kwargs,
        "priority": result.task.priority,
        "queue_name": result.task.queue_name,
        "run_after": result.task.run_after,
        "backend": result.backend,
        "takes_context": result.task.takes_context,
        "module_path": result.task.module_path,
        "enqueued_at": result.enqueued_at is not None,
        "started_at": result.started_at is not None,
        "finished_at": result.finished_at is not None,
        "last_attempted_at": result.last_attempted_at is not None,
        "worker_ids": len(result.worker_ids),
        "errors": [
            (error.exception_class_path, _exception_line(error.exception_class_path, error))
            for error in result.errors
        ],
    }
    try:
        seen["return_value"] = result.return_value
    except ValueError as exc:
        seen["return_value"] = f"ValueError: {exc}"
    return seen


def _exception_line(class_path: str, error: Any) -> bool:
    """Whether the traceback shows the exception itself (``module.Class: message``)."""
    return f"{class_path}: " in error.traceback or class_path.startswith("delayjobs.")


def same_for_the_caller(seen: dict[str, Any], alias: str) -> dict[str, Any]:
    """``seen`` with the backend alias as a placeholder, and the one intended difference."""
    normalized = {**seen, "backend": "<alias>" if seen["backend"] == alias else seen["backend"]}
    normalized["errors"] = [
        ("<non-JSON return>", True) if path == NON_JSON_RETURN[alias] else (path, line)
        for path, line in seen["errors"]
    ]
    return normalized


SCENARIOS: dict[str, Callable[[str], Any]] = {
    "enqueue": lambda alias: tasks.add.using(backend=alias).enqueue(2, 3),
    "JSON round trip of arguments": lambda alias: tasks.echo.using(backend=alias).enqueue(
        (1, 2), [3, (4,)], k={"b": (None, True, 1.5, "é")}
    ),
    "JSON round trip of a return value": lambda alias: task_functions.pair.using(
        backend=alias
    ).enqueue("x", (1,)),
    "priority": lambda alias: tasks.add.using(backend=alias, priority=10).enqueue(1, 1),
    "lowest priority": lambda alias: tasks.add.using(backend=alias, priority=-100).enqueue(1, 1),
    "queue_name": lambda alias: tasks.add.using(backend=alias, queue_name="other").enqueue(1, 1),
    "run_after in the future": lambda alias: tasks.add.using(
        backend=alias, run_after=FUTURE
    ).enqueue(1, 1),
    "run_after in the past": lambda alias: tasks.add.using(backend=alias, run_after=PAST).enqueue(
        1, 1
    ),
    "takes_context": lambda alias: task_functions.whoami.using(backend=alias).enqueue(7, k=8),
    "aenqueue": lambda alias: asyncio.run(tasks.add.using(backend=alias).aenqueue(4, 5)),
    "an async task": lambda alias: tasks.async_add.using(backend=alias).enqueue(6, 7),
    "an exception": lambda alias: tasks.boom.using(backend=alias).enqueue("kaboom"),
    "a return value JSON cannot hold": lambda alias: tasks.returns_a_set.using(
        backend=alias
    ).enqueue(),
    "a task from another module of the app": lambda alias: task_functions.multiply.using(
        backend=alias
    ).enqueue(6, 7),
}
NOW = timezone.now()
FUTURE = NOW + timedelta(days=1)
PAST = NOW - timedelta(minutes=5)


def run_scenarios(alias: str) -> dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """Each scenario's result as enqueued, after a worker ran, and fetched again."""
    results = {name: enqueue(alias) for name, enqueue in SCENARIOS.items()}
    before = {name: observed(result) for name, result in results.items()}
    run_worker(alias)
    seen = {}
    for name, result in results.items():
        result.refresh()
        fetched = task_backends[alias].get_result(result.id)
        assert fetched.id == result.id
        seen[name] = (before[name], observed(result), observed(fetched))
    return seen


def test_every_scenario_is_observed_the_same_on_both_backends() -> None:
    reference = run_scenarios(REFERENCE)
    ours = run_scenarios(DELAYJOBS)

    for name in SCENARIOS:
        expected = [same_for_the_caller(seen, REFERENCE) for seen in reference[name]]
        actual = [same_for_the_caller(seen, DELAYJOBS) for seen in ours[name]]
        assert actual == expected, name
    # The scenarios did what they say on the reference backend (so the comparison means
    # something): it ran what was due, failed what raised, and left the future alone.
    statuses = {name: seen[1]["status"] for name, seen in reference.items()}
    assert statuses["run_after in the future"] == "READY"
    assert statuses["an exception"] == statuses["a return value JSON cannot hold"] == "FAILED"
    assert statuses["enqueue"] == statuses["takes_context"] == "SUCCESSFUL"
    assert reference["takes_context"][1]["return_value"]["attempt"] == 1
    assert reference["JSON round trip of a return value"][1]["return_value"] == ["x", [1]]


def refusal(call: Callable[[], Any]) -> BaseException:
    with pytest.raises(Exception) as caught:
        call()
    return caught.value


VALIDATION: dict[str, Callable[[str], Any]] = {
    "arguments JSON cannot hold": lambda alias: tasks.echo.using(backend=alias).enqueue({1, 2}),
    "a queue not in QUEUES": lambda alias: tasks.add.using(backend=alias, queue_name="nope"),
    "a naive run_after": lambda alias: tasks.add.using(
        backend=alias, run_after=NOW.replace(tzinfo=None)
    ),
    "a priority out of range": lambda alias: tasks.add.using(backend=alias, priority=101),
    "an unknown result id": lambda alias: task_backends[alias].get_result("999999999"),
    "an unknown result UUID": lambda alias: task_backends[alias].get_result(
        "00000000-0000-0000-0000-000000000000"
    ),
}


@pytest.mark.parametrize("case", list(VALIDATION))
def test_validation_errors_are_those_of_the_reference_backend(case: str) -> None:
    reference = refusal(lambda: VALIDATION[case](REFERENCE))
    ours = refusal(lambda: VALIDATION[case](DELAYJOBS))
    # The reference's exception class, or a subclass of it: code catching what Django's
    # backends raise catches ours.
    assert isinstance(ours, type(reference)), (case, reference, ours)
    assert isinstance(ours, InvalidTask | TaskResultDoesNotExist | TypeError), ours
