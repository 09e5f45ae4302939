"""``delayjobs.backends.DelayJobsBackend``: Django's Tasks framework on delayjobs.

Django 6 uses the built-in ``django.tasks``, Django 5.2 the ``django_tasks`` backport; the
same tests run on both. Tasks live in tests/tasks.py; TASKS is in tests/settings.py.
End-to-end tests run real ``run_delay_consumer`` subprocesses and wait for events.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import django
import pytest
import redis
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

import delayjobs
from delayjobs import task_compat, transitions
from delayjobs.backends import DelayJobsBackend, InvalidTaskCall
from delayjobs.consumer import Consumer
from delayjobs.exceptions import InvalidJob, JobTimeout
from delayjobs.jobtypes import registry
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from delayjobs.redis_store import due_key
from delayjobs.task_compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    default_task_backend,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from delayjobs.task_index import TaskIndex, declared_modules
from delayjobs.task_jobs import (
    EXCEPTION_CLASS_NOTE,
    TASK_JOB_TYPE,
    TaskCancelled,
    TaskExpired,
    TaskSkipped,
    TaskWorkerLost,
)
from tests.conftest import REPO_ROOT, ConsumerFactory, subprocess_env
from tests.consumers import wait_final
from tests.models import Execution
from tests.tasks import (
    TaskBoom,
    add,
    async_add,
    boom,
    echo,
    flaky,
    record,
    returns_a_set,
)

MARKER_MODULE = "delayjobs_tasks_marker"
MARKER_ENV = "DELAYJOBS_TASKS_MARKER"


def soon(seconds: float = 0.0) -> datetime:
    return timezone.now() + timedelta(seconds=seconds)


def row(result: Any) -> DelayedJob:
    return DelayedJob.objects.get(pk=int(result.id))


def run_consumer(consumer_process: ConsumerFactory, ids: list[int], *args: str) -> None:
    """Run one consumer until every job in ``ids`` is final, then stop it cleanly."""
    consumer = consumer_process("--worker-id", "tasks-worker", *args)
    wait_final(ids, [consumer], timeout=60)
    consumer.send_signal(15)
    assert consumer.wait(timeout=30) == 0, consumer.output()


# The framework ---------------------------------------------------------------------------


def test_the_framework_is_django_tasks_on_django_6_and_the_backport_before() -> None:
    expected = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    assert expected == task_compat.FRAMEWORK
    assert type(add).__module__.startswith(expected)
    backend = task_backends["default"]
    assert isinstance(backend, DelayJobsBackend)
    assert default_task_backend.alias == "default"
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task
    assert TASK_JOB_TYPE in registry


# Enqueue ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue_with_run_after_writes_one_row_with_its_time_priority_queue_and_payload() -> None:
    run_after = soon(3600).replace(microsecond=0)
    result = add.using(run_after=run_after, priority=7, queue_name="other").enqueue(2, b=3)

    job = row(result)
    assert job.job_type == TASK_JOB_TYPE
    assert job.run_at == run_after
    assert (job.priority, job.queue, job.status) == (7, "other", JobStatus.SCHEDULED)
    assert job.payload == {
        "task": "tests.tasks.add",
        "args": [2],
        "kwargs": {"b": 3},
        "backend": "default",
    }
    assert job.max_attempts == 5  # the job type's default: OPTIONS has no MAX_ATTEMPTS
    assert result.id == str(job.pk)
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at == job.created_at
    assert (result.args, result.kwargs, result.backend) == ([2], {"b": 3}, "default")
    assert (result.task.priority, result.task.queue_name) == (7, "other")
    assert result.errors == [] and result.worker_ids == [] and result.attempts == 0
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value


@pytest.mark.django_db
def test_enqueue_without_run_after_is_due_now_and_backend_options_set_max_attempts() -> None:
    before = timezone.now()
    result = add.using(backend="retrying").enqueue(1, 1)
    job = row(result)
    assert before <= job.run_at <= timezone.now()
    assert job.max_attempts == 2
    assert job.payload["backend"] == "retrying"
    assert result.backend == "retrying"


@pytest.mark.django_db(transaction=True)
def test_enqueue_joins_the_transaction_and_hands_over_to_redis_on_commit(
    redis_client: redis.Redis,
) -> None:
    sent: list[Any] = []

    def receiver(sender: type, task_result: Any, **kwargs: Any) -> None:
        sent.append(task_result)

    task_enqueued.connect(receiver)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            add.enqueue(1, 2)
            raise RuntimeError("roll back")
        assert not DelayedJob.objects.exists()
        assert redis_client.zcard(due_key("default")) == 0
        assert sent == []

        with transaction.atomic():
            result = add.enqueue(1, 2)
            assert sent == []  # not before the row is visible to others
            assert redis_client.zcard(due_key("default")) == 0
        assert [r.id for r in sent] == [result.id]
        assert redis_client.zscore(due_key("default"), result.id) is not None
    finally:
        task_enqueued.disconnect(receiver)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "kwargs", "reason"),
    [
        (({1, 2},), {}, "JSON-serializable"),
        ((object(),), {}, "JSON-serializable"),
        ((math.nan,), {}, "JSON-serializable"),
        ((), {"when": datetime(2030, 1, 1, tzinfo=UTC)}, "JSON-serializable"),
        (({1: "int key"},), {}, "would not come back the same"),
        (("NUL \x00",), {}, "NUL"),
    ],
)
def test_enqueue_refuses_arguments_that_do_not_round_trip_through_json(
    args: tuple[Any, ...], kwargs: dict[str, Any], reason: str
) -> None:
    with pytest.raises(InvalidTaskCall, match=reason) as caught:
        echo.enqueue(*args, **kwargs)
    # Caught as the framework's InvalidTask and as delayjobs' InvalidJob (a ValueError).
    assert isinstance(caught.value, InvalidTask)
    assert isinstance(caught.value, InvalidJob) and isinstance(caught.value, ValueError)
    assert not DelayedJob.objects.exists()


@pytest.mark.django_db
def test_tuples_and_bytes_are_normalised_as_the_framework_does() -> None:
    result = echo.enqueue((1, 2), b"bytes", nested={"t": (3,)})
    assert row(result).payload["args"] == [[1, 2], "bytes"]
    assert row(result).payload["kwargs"] == {"nested": {"t": [3]}}
    assert result.args == [[1, 2], "bytes"]


@pytest.mark.django_db
def test_bad_task_options_are_refused_before_anything_is_written() -> None:
    with pytest.raises(InvalidTask, match="aware"):
        add.using(run_after=datetime(2030, 1, 1))  # naive
    with pytest.raises(InvalidTask, match="priority"):
        add.using(priority=101)
    with pytest.raises(InvalidTask, match="Queue 'elsewhere'"):
        add.using(queue_name="elsewhere")
    assert not DelayedJob.objects.exists()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"QUEUES": ["bad queue"]}, "cannot be delayjobs queues"),
        ({"OPTIONS": {"RETRIES": 3}}, "only MAX_ATTEMPTS, MODULES"),
        ({"OPTIONS": {"MAX_ATTEMPTS": 0}}, "MAX_ATTEMPTS'] must be a positive int"),
        ({"OPTIONS": {"MAX_ATTEMPTS": True}}, "MAX_ATTEMPTS'] must be a positive int"),
        ({"OPTIONS": {"MODULES": "tests.tasks"}}, "list of module paths"),
    ],
)
def test_bad_backend_settings_are_refused(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        DelayJobsBackend("broken", params)


@pytest.mark.django_db
def test_the_row_carries_json_and_no_pickle() -> None:
    result = echo.enqueue("text", 1, [True, None], key={"nested": 1.5})
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT payload, result FROM {DelayedJob._meta.db_table} WHERE id = %s",
            [int(result.id)],
        )
        payload_text, result_text = cursor.fetchone()
    if isinstance(payload_text, dict):  # psycopg decodes jsonb itself
        payload_text = json.dumps(payload_text)
    payload = json.loads(payload_text)
    assert payload == {
        "task": "tests.tasks.echo",
        "args": ["text", 1, [True, None]],
        "kwargs": {"key": {"nested": 1.5}},
        "backend": "default",
    }
    assert result_text is None
    assert "\\x80" not in payload_text and "py/" not in payload_text


# Results ----------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("result_id", ["", "abc", "12abc", " 1", "1.0", "-1", "99999999", "٣"])
def test_get_result_of_an_unknown_id_raises_does_not_exist(result_id: str) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)


@pytest.mark.django_db
def test_get_result_of_another_job_type_or_another_alias_does_not_exist() -> None:
    other = delayjobs.schedule("tests.noop")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(other.pk))
    result = add.using(backend="retrying").enqueue(1, 2)
    with pytest.raises(TaskResultDoesNotExist, match="backend 'retrying'"):
        default_task_backend.get_result(result.id)
    assert task_backends["retrying"].get_result(result.id).id == result.id
    # Task.get_result asks the task's own backend, and checks the function.
    assert add.using(backend="retrying").get_result(result.id).id == result.id
    with pytest.raises(task_compat.TaskResultMismatch):
        echo.using(backend="retrying").get_result(result.id)


@pytest.mark.django_db
def test_async_enqueue_and_get_result() -> None:
    result = async_to_sync(add.aenqueue)(4, 5)
    assert row(result).payload["args"] == [4, 5]
    fetched = async_to_sync(add.aget_result)(result.id)
    assert fetched.status == TaskResultStatus.READY


@pytest.mark.django_db
def test_status_mapping_of_every_job_status() -> None:
    result = record.enqueue("mapping")
    job = row(result)
    now = timezone.now()

    def status_after(**changes: Any) -> Any:
        DelayedJob.objects.filter(pk=job.pk).update(**changes)
        return default_task_backend.get_result(result.id)

    running = status_after(status=JobStatus.RUNNING, attempts=1, worker_id="w-1", started_at=now)
    assert running.status == TaskResultStatus.RUNNING
    assert (running.worker_ids, running.attempts, running.started_at) == (["w-1"], 1, now)
    assert running.last_attempted_at == now and running.finished_at is None

    succeeded = status_after(status=JobStatus.SUCCEEDED, result={"ok": [1]}, finished_at=now)
    assert succeeded.status == TaskResultStatus.SUCCESSFUL
    assert succeeded.return_value == {"ok": [1]} and succeeded.finished_at == now

    cancelled = status_after(status=JobStatus.CANCELLED, attempts=0, started_at=None)
    assert cancelled.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in cancelled.errors] == [TaskCancelled]
    with pytest.raises(ValueError, match="failed"):
        _ = cancelled.return_value

    for status, outcome, stand_in in [
        (JobStatus.SKIPPED, AttemptOutcome.SKIPPED, TaskSkipped),
        (JobStatus.EXPIRED, AttemptOutcome.EXPIRED, TaskExpired),
    ]:
        JobAttempt.objects.filter(job=job).delete()
        JobAttempt.objects.create(
            job=job,
            number=1,
            worker_id="w-1",
            started_at=now,
            outcome=outcome,
            lateness=timedelta(0),
        )
        ended = status_after(status=status, attempts=1, started_at=now, finished_at=now)
        assert ended.status == TaskResultStatus.FAILED
        assert [e.exception_class for e in ended.errors] == [stand_in]
        assert ended.worker_ids == ["w-1"]


@pytest.mark.django_db
def test_errors_of_timed_out_and_lease_expired_attempts_name_stand_in_classes() -> None:
    result = add.enqueue(1, 2)
    job = row(result)
    now = timezone.now()
    for number, outcome in [(1, AttemptOutcome.TIMED_OUT), (2, AttemptOutcome.LEASE_EXPIRED)]:
        JobAttempt.objects.create(
            job=job,
            number=number,
            worker_id=f"w-{number}",
            started_at=now + timedelta(seconds=number),
            outcome=outcome,
            error=f"{outcome} error",
            lateness=timedelta(0),
        )
    DelayedJob.objects.filter(pk=job.pk).update(attempts=2, started_at=now + timedelta(seconds=2))
    fetched = default_task_backend.get_result(result.id)
    assert fetched.status == TaskResultStatus.READY  # scheduled again for attempt 3
    assert [e.exception_class for e in fetched.errors] == [JobTimeout, TaskWorkerLost]
    assert "timed_out error" in fetched.errors[0].traceback
    assert fetched.worker_ids == ["w-1", "w-2"]
    assert fetched.started_at == now + timedelta(seconds=1)
    assert fetched.last_attempted_at == now + timedelta(seconds=2)


# Execution in this process (signals, context) -------------------------------------------


@pytest.fixture
def tasks_signals() -> Iterator[list[tuple[str, Any]]]:
    received: list[tuple[str, Any]] = []

    def on_started(sender: type, task_result: Any, **kwargs: Any) -> None:
        received.append(("started", task_result.status))

    def on_finished(sender: type, task_result: Any, **kwargs: Any) -> None:
        received.append(("finished", task_result))

    task_started.connect(on_started)
    task_finished.connect(on_finished)
    try:
        yield received
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)


def claimed(result: Any, attempt: int = 1) -> DelayedJob:
    """The job as a consumer holds it once it claimed it (in memory only)."""
    job = row(result)
    job.status, job.attempts, job.worker_id = JobStatus.RUNNING, attempt, "here"
    job.started_at = timezone.now()
    return job


@pytest.mark.django_db
def test_execute_calls_the_task_sends_the_signals_and_returns_its_value(
    tasks_signals: list[tuple[str, Any]],
) -> None:
    jobtype = registry.get(TASK_JOB_TYPE)
    assert jobtype.execute(claimed(add.enqueue(2, 3))) == 5
    assert [name for name, _ in tasks_signals] == ["started", "finished"]
    assert tasks_signals[0][1] == TaskResultStatus.RUNNING
    finished = tasks_signals[1][1]
    assert finished.status == TaskResultStatus.SUCCESSFUL and finished.return_value == 5

    assert jobtype.execute(claimed(async_add.enqueue(2, 3))) == 5


@pytest.mark.django_db
def test_execute_gives_the_context_the_attempt_number_and_worker_history() -> None:
    result = record.enqueue("ctx")
    job = row(result)
    JobAttempt.objects.create(
        job=job,
        number=1,
        worker_id="earlier",
        started_at=timezone.now(),
        outcome=AttemptOutcome.RETRYING,
        error="TaskBoom: x",
        lateness=timedelta(0),
    )
    value = registry.get(TASK_JOB_TYPE).execute(claimed(result, attempt=2))
    assert value == {"id": result.id, "attempt": 2, "workers": ["earlier", "here"]}


@pytest.mark.django_db
def test_a_raising_task_fails_the_attempt_and_notes_its_exception_class(
    tasks_signals: list[tuple[str, Any]],
) -> None:
    with pytest.raises(TaskBoom) as caught:
        registry.get(TASK_JOB_TYPE).execute(claimed(boom.enqueue("bad")))
    assert f"{EXCEPTION_CLASS_NOTE}tests.tasks.TaskBoom" in caught.value.__notes__
    finished = tasks_signals[-1][1]
    assert finished.status == TaskResultStatus.FAILED
    assert finished.errors[0].exception_class is TaskBoom

    with pytest.raises(TypeError, match="not JSON-serializable"):
        registry.get(TASK_JOB_TYPE).execute(claimed(returns_a_set.enqueue()))


# Resolution: by the index of declared @task objects, never by import ----------------------


@pytest.fixture
def marker_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A module that writes $DELAYJOBS_TASKS_MARKER when imported; yields the marker."""
    directory = tmp_path / "importable"
    directory.mkdir()
    (directory / f"{MARKER_MODULE}.py").write_text(
        "import os\nimport pathlib\n\n"
        f"pathlib.Path(os.environ[{MARKER_ENV!r}]).write_text('imported')\n\n\n"
        "def evil():\n    return 'ran'\n"
    )
    marker = tmp_path / "imported"
    monkeypatch.setenv(MARKER_ENV, str(marker))
    monkeypatch.syspath_prepend(str(directory))
    yield marker
    sys.modules.pop(MARKER_MODULE, None)


def forged(task_path: str, backend: str = "default", max_attempts: int = 1) -> DelayedJob:
    """A row written past enqueue(), as a compromised database or a bad migration could."""
    return DelayedJob.objects.create(
        job_type=TASK_JOB_TYPE,
        payload={"task": task_path, "args": [], "kwargs": {}, "backend": backend},
        run_at=timezone.now(),
        max_attempts=max_attempts,
    )


@pytest.mark.django_db
def test_get_result_of_a_row_naming_an_undeclared_path_does_not_import_it(
    marker_module: Path,
) -> None:
    job = forged(f"{MARKER_MODULE}.evil")
    with pytest.raises(TaskResultDoesNotExist, match="not a registered @task"):
        default_task_backend.get_result(str(job.pk))
    assert MARKER_MODULE not in sys.modules
    assert not marker_module.exists()


def test_discovery_imports_only_declared_modules() -> None:
    fresh = TaskIndex()
    fresh.discover()
    assert "tests.tasks.add" in fresh.known()
    assert "delayjobs.tasks" not in declared_modules()  # Celery tasks, not Django tasks
    with override_settings(
        TASKS={
            "default": {
                "BACKEND": "delayjobs.backends.DelayJobsBackend",
                "OPTIONS": {"MODULES": ["tests.delay_jobs"]},
            }
        }
    ):
        assert declared_modules()[-1] == "tests.delay_jobs"
    with pytest.raises(LookupError, match=r"known: .*tests\.tasks\.add"):
        fresh.get("tests.tasks.not_there")


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_consumer_fails_rows_naming_unknown_tasks_or_foreign_backends_without_running_them(
    consumer_process: ConsumerFactory, marker_module: Path
) -> None:
    unknown = forged(f"{MARKER_MODULE}.evil")
    not_a_task = forged("os.system")
    foreign = forged("tests.tasks.record", backend="immediate", max_attempts=3)
    missing_alias = forged("tests.tasks.record", backend="no-such-alias", max_attempts=3)
    control = add.enqueue(20, 22)
    ids = [unknown.pk, not_a_task.pk, foreign.pk, missing_alias.pk, int(control.id)]

    consumer = consumer_process(
        "--worker-id", "tasks-worker", env={"PYTHONPATH": _pythonpath(marker_module)}
    )
    wait_final(ids, [consumer], timeout=60)
    consumer.send_signal(15)
    assert consumer.wait(timeout=30) == 0, consumer.output()

    assert default_task_backend.get_result(control.id).return_value == 42
    for job in (unknown, not_a_task):
        job.refresh_from_db()
        assert job.status == JobStatus.FAILED
        assert "is not a registered @task; known: " in job.last_error
        assert "tests.tasks.add" in job.last_error
    for job in (foreign, missing_alias):
        job.refresh_from_db()
        # Refused, and not retried: waiting does not make the row runnable.
        assert (job.status, job.attempts) == (JobStatus.FAILED, 1)
        assert job.last_error.startswith("TaskRefused: Task backend alias")
    foreign.refresh_from_db()
    assert "not a DelayJobsBackend" in foreign.last_error
    assert not Execution.objects.exists()  # tests.tasks.record never ran
    assert not marker_module.exists(), f"the consumer imported {MARKER_MODULE}"
    # The control: importing the module in that environment does create the marker.
    completed = subprocess.run(
        [sys.executable, "-c", f"import {MARKER_MODULE}"],
        cwd=REPO_ROOT,
        env=subprocess_env(PYTHONPATH=_pythonpath(marker_module)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert marker_module.read_text() == "imported"


def _pythonpath(marker: Path) -> str:
    return str(marker.parent / "importable")


# End to end: a real consumer runs the tasks ---------------------------------------------


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_consumer_runs_deferred_tasks_and_get_result_reflects_them(
    consumer_process: ConsumerFactory,
) -> None:
    run_after = soon(1.0)
    deferred = add.using(run_after=run_after).enqueue(2, 3)
    now_result = echo.enqueue("a", n=(1, 2))
    contextual = record.enqueue("e2e")
    coroutine = async_add.enqueue(40, 2)
    assert default_task_backend.get_result(deferred.id).status == TaskResultStatus.READY

    results = [deferred, now_result, contextual, coroutine]
    run_consumer(consumer_process, [int(r.id) for r in results])

    fetched = default_task_backend.get_result(deferred.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL
    assert fetched.return_value == 5
    assert fetched.started_at >= run_after  # never before run_after
    assert fetched.enqueued_at < fetched.started_at <= fetched.finished_at
    assert fetched.last_attempted_at == fetched.started_at
    assert (fetched.worker_ids, fetched.attempts, fetched.errors) == (["tasks-worker"], 1, [])
    assert row(deferred).result == 5

    deferred.refresh()  # the TaskResult returned by enqueue() catches up
    assert deferred.status == TaskResultStatus.SUCCESSFUL and deferred.return_value == 5
    assert add.get_result(deferred.id).return_value == 5

    assert echo.get_result(now_result.id).return_value == {
        "args": ["a"],
        "kwargs": {"n": [1, 2]},
    }
    assert record.get_result(contextual.id).return_value == {
        "id": contextual.id,
        "attempt": 1,
        "workers": ["tasks-worker"],
    }
    assert Execution.objects.get().job_id == int(contextual.id)
    assert async_add.get_result(coroutine.id).return_value == 42


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_raising_task_is_retried_by_policy_then_failed_with_its_errors(
    consumer_process: ConsumerFactory,
) -> None:
    failing = boom.using(backend="retrying").enqueue("it broke")
    recovers = flaky.using(backend="retrying").enqueue()
    bad_return = returns_a_set.using(backend="once").enqueue()
    ids = [int(r.id) for r in (failing, recovers, bad_return)]

    run_consumer(consumer_process, ids)

    result = task_backends["retrying"].get_result(failing.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 2 and result.worker_ids == ["tasks-worker"] * 2
    assert len(result.errors) == 2
    for error in result.errors:
        assert error.exception_class_path == "tests.tasks.TaskBoom"
        assert error.exception_class is TaskBoom
        assert "raise TaskBoom(message)" in error.traceback
        assert "TaskBoom: it broke" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value
    job = row(failing)
    assert (job.status, job.attempts) == (JobStatus.FAILED, 2)
    assert job.last_error == "TaskBoom: it broke"
    outcomes = list(job.history.order_by("number").values_list("outcome", flat=True))
    assert outcomes == [AttemptOutcome.RETRYING, AttemptOutcome.FAILED]

    recovered = task_backends["retrying"].get_result(recovers.id)
    assert recovered.status == TaskResultStatus.SUCCESSFUL
    assert recovered.return_value == 2 and recovered.attempts == 2
    assert [e.exception_class_path for e in recovered.errors] == ["tests.tasks.TaskBoom"]

    refused = task_backends["once"].get_result(bad_return.id)
    assert refused.status == TaskResultStatus.FAILED and refused.attempts == 1
    assert refused.errors[0].exception_class_path == "builtins.TypeError"
    assert "not JSON-serializable" in refused.errors[0].traceback


# Priority ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_priority_orders_tasks_due_together() -> None:
    due = soon(-1)
    results = {
        priority: record.using(run_after=due, priority=priority).enqueue(str(priority))
        for priority in (-5, 0, 50, 10)
    }
    assert {p: row(r).priority for p, r in results.items()} == {-5: -5, 0: 0, 50: 50, 10: 10}
    # Claimed one at a time from the database (as Redis-down mode does): highest first.
    order = []
    for _ in results:
        [job] = transitions.claim_due(
            queues=["default"],
            job_types=[TASK_JOB_TYPE],
            limit=1,
            choose=lambda candidates: candidates,
            worker_id="w",
            now=timezone.now(),
            leases={},
            default_lease=timedelta(minutes=1),
        )
        order.append(job.priority)
    assert order == [50, 10, 0, -5]


def test_consumers_without_queue_options_serve_every_queue_the_backends_allow() -> None:
    from django.conf import settings

    tasks = {
        **settings.TASKS,
        "reports": {
            "BACKEND": "delayjobs.backends.DelayJobsBackend",
            "QUEUES": ["reports", "default"],
        },
    }
    with override_settings(TASKS=tasks):
        assert "reports" in registry.get("django.task").queues_served()
        assert "reports" in Consumer(burst=True).queues
    assert "reports" not in registry.queues()
