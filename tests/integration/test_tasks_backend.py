"""``delayjobs.contrib.tasks.backend.DelayJobsBackend``: Django's Tasks framework on delayjobs.

Django 6 uses the built-in ``django.tasks``, Django 5.2 the ``django_tasks`` backport; the
same tests run on both. Tasks live in tests/tasks.py; TASKS is in tests/settings.py.
End-to-end tests run real ``run_delay_consumer`` subprocesses and wait for events.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
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
from delayjobs import transitions
from delayjobs.contrib.tasks import compat as task_compat
from delayjobs.contrib.tasks.backend import DelayJobsBackend, InvalidTaskCall
from delayjobs.contrib.tasks.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    default_task_backend,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from delayjobs.contrib.tasks.discovery import TaskIndex, declared_modules, index
from delayjobs.contrib.tasks.job_type import UNREGISTERED_RETRY_BASE, UNREGISTERED_RETRY_CAP
from delayjobs.contrib.tasks.results import EXCEPTION_CLASS_NOTE, TASK_JOB_TYPE, unavailable_task
from delayjobs.engine.consumer import Consumer
from delayjobs.engine.execution import retry_at_after, run_claimed
from delayjobs.exceptions import (
    ForbiddenTaskPath,
    InvalidJob,
    JobTimeout,
    TaskCancelled,
    TaskExpired,
    TaskFailed,
    TaskRefused,
    TaskSkipped,
    TaskWorkerLost,
    UnknownTaskBackend,
    UnregisteredTask,
    UnstorableResult,
)
from delayjobs.index.keys import due_key
from delayjobs.jobtypes import registry
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
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
    repeat,
    returns_a_set,
    returns_int_keys,
    returns_nan,
)
from tests.utils import wait_for

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
        "deferred": True,  # get_result() shows the row's run_at as the task's run_after
    }
    assert job.max_attempts == 5  # the job type's default: OPTIONS has no MAX_ATTEMPTS
    assert result.task.run_after == run_after
    assert result.task.get_result(result.id).task.run_after == run_after
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
        # Past the column's range every enqueue would fail; refused at start instead.
        ({"OPTIONS": {"MAX_ATTEMPTS": 2**31}}, "positive int up to 2147483647"),
        ({"OPTIONS": {"MODULES": "tests.tasks"}}, "list of module paths"),
    ],
)
def test_bad_backend_settings_are_refused(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        DelayJobsBackend("broken", params)


@pytest.mark.django_db
def test_an_empty_queues_allows_any_queue_name() -> None:
    """Django's contract: QUEUES = [] means any queue."""
    with override_settings(
        TASKS={
            "default": {"BACKEND": "delayjobs.contrib.tasks.backend.DelayJobsBackend", "QUEUES": []}
        }
    ):
        result = add.using(queue_name="anything-at-all").enqueue(1, 2)
        assert row(result).queue == "anything-at-all"


def test_the_largest_max_attempts_is_accepted() -> None:
    backend = DelayJobsBackend("big", {"OPTIONS": {"MAX_ATTEMPTS": 2**31 - 1}})
    assert backend.max_attempts == 2**31 - 1


def test_the_task_job_type_cannot_be_scheduled_through_the_http_api() -> None:
    # Its payload names code to run: only the project's own enqueue() may write one.
    assert registry.get(TASK_JOB_TYPE).public is False


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
@pytest.mark.parametrize(
    "result_id",
    [
        "",
        "abc",
        "12abc",
        " 1",
        "1.0",
        "-1",
        "99999999",
        "٣",
        "9223372036854775807",  # the largest id a row can have, but no row
        "9223372036854775808",  # 2**63: past what the database's integers hold
        "9999999999999999999",
    ],
)
def test_get_result_of_an_unknown_id_raises_does_not_exist(result_id: str) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)


@pytest.mark.django_db
@pytest.mark.parametrize("result_id", ["9223372036854775808", "9999999999999999999"])
def test_get_result_of_an_id_past_the_largest_row_id_does_not_reach_the_database(
    result_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Django (5.0+) turns an out-of-range integer lookup into an empty result for its
    # own backends; one that declares no integer range hands the value to the driver,
    # where SQLite's raises OverflowError. The id check does not rely on that guard.
    monkeypatch.setattr(connection.ops, "integer_field_range", lambda internal_type: (None, None))
    with pytest.raises(TaskResultDoesNotExist, match="ids are job numbers"):
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

    running = status_after(status=JobStatus.RUNNING, attempts=1, worker_id="w-1", claimed_at=now)
    assert running.status == TaskResultStatus.RUNNING
    assert (running.worker_ids, running.attempts, running.started_at) == (["w-1"], 1, now)
    assert running.last_attempted_at == now and running.finished_at is None

    succeeded = status_after(status=JobStatus.SUCCEEDED, result={"ok": [1]}, finished_at=now)
    assert succeeded.status == TaskResultStatus.SUCCESSFUL
    assert succeeded.return_value == {"ok": [1]} and succeeded.finished_at == now

    cancelled = status_after(status=JobStatus.CANCELLED, attempts=0, claimed_at=None)
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
        ended = status_after(status=status, attempts=1, claimed_at=now, finished_at=now)
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
    DelayedJob.objects.filter(pk=job.pk).update(attempts=2, claimed_at=now + timedelta(seconds=2))
    fetched = default_task_backend.get_result(result.id)
    assert fetched.status == TaskResultStatus.READY  # scheduled again for attempt 3
    assert [e.exception_class for e in fetched.errors] == [JobTimeout, TaskWorkerLost]
    assert "timed_out error" in fetched.errors[0].traceback
    assert fetched.worker_ids == ["w-1", "w-2"]
    assert fetched.started_at == now + timedelta(seconds=1)
    assert fetched.last_attempted_at == now + timedelta(seconds=2)


@pytest.mark.django_db
def test_a_result_whose_queue_its_backend_no_longer_allows_stays_on_its_own_backend(
    tasks_signals: list[tuple[str, Any]],
) -> None:
    from django.conf import settings

    result = add.using(backend="retrying").enqueue(1, 2)
    assert row(result).queue == "default"
    # A later deploy removes the queue "default" from the backend that enqueued the task.
    tasks = {**settings.TASKS, "retrying": {**settings.TASKS["retrying"], "QUEUES": ["later"]}}
    with override_settings(TASKS=tasks):
        fetched = task_backends["retrying"].get_result(result.id)
        assert fetched.backend == "retrying"
        assert (fetched.task.backend, fetched.task.queue_name) == ("retrying", "later")
        assert fetched.task.func is add.func
        fetched.refresh()  # asks the task's backend: the one that holds the result
        assert fetched.status == TaskResultStatus.READY
        later = add.using(backend="retrying", queue_name="later")
        assert later.get_result(result.id).id == result.id

        assert registry.get(TASK_JOB_TYPE).execute(claimed(result)) == 3
        finished = tasks_signals[-1][1]
        assert (finished.task.backend, finished.task.queue_name) == ("retrying", "later")


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
    job.claimed_at = timezone.now()
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


def attempt_row(
    job: DelayedJob, number: int, worker_id: str, started_at: datetime, outcome: str
) -> JobAttempt:
    return JobAttempt.objects.create(
        job=job,
        number=number,
        worker_id=worker_id,
        started_at=started_at,
        finished_at=started_at,
        outcome=outcome,
        error="" if outcome == AttemptOutcome.SUCCEEDED else f"TaskBoom: {worker_id}",
        lateness=timedelta(0),
    )


@pytest.mark.django_db
def test_after_a_retry_attempt_numbers_and_history_count_only_the_new_run() -> None:
    result = record.enqueue("again")
    job = row(result)
    first_run = timezone.now() - timedelta(hours=1)
    # The first run: two attempts, then failed; an operator retries the job.
    attempt_row(job, 1, "old-1", first_run, AttemptOutcome.RETRYING)
    attempt_row(job, 2, "old-2", first_run + timedelta(minutes=1), AttemptOutcome.FAILED)
    DelayedJob.objects.filter(pk=job.pk).update(
        status=JobStatus.FAILED, attempts=2, claimed_at=first_run + timedelta(minutes=1)
    )
    delayjobs.retry(job.pk)
    retried = default_task_backend.get_result(result.id)
    assert retried.status == TaskResultStatus.READY
    assert (retried.attempts, retried.worker_ids, retried.errors) == (0, [], [])
    assert retried.started_at is None

    # Its first attempt fails; the second runs with attempt number 2, not 4.
    new_run = timezone.now()
    attempt_row(job, 1, "new-1", new_run, AttemptOutcome.RETRYING)
    DelayedJob.objects.filter(pk=job.pk).update(attempts=1, claimed_at=new_run)
    value = registry.get(TASK_JOB_TYPE).execute(claimed(result, attempt=2))
    assert value == {"id": result.id, "attempt": 2, "workers": ["new-1", "here"]}
    assert Execution.objects.get(job_id=job.pk).attempt == 2

    # Once it ends, the result reads the new run's attempts only.
    attempt_row(job, 2, "new-2", new_run + timedelta(seconds=1), AttemptOutcome.FAILED)
    DelayedJob.objects.filter(pk=job.pk).update(
        status=JobStatus.FAILED, attempts=2, claimed_at=new_run + timedelta(seconds=1)
    )
    ended = default_task_backend.get_result(result.id)
    assert ended.attempts == 2 and ended.worker_ids == ["new-1", "new-2"]
    assert ["TaskBoom: new-1" in e.traceback for e in ended.errors] == [True, False]
    assert ended.started_at == new_run


@pytest.mark.django_db
def test_a_retried_job_running_its_first_attempt_reports_only_that_attempt() -> None:
    result = add.enqueue(1, 2)
    job = row(result)
    earlier = timezone.now() - timedelta(hours=1)
    # It succeeded at its first attempt; retried, its new first attempt is running.
    attempt_row(job, 1, "old-1", earlier, AttemptOutcome.SUCCEEDED)
    DelayedJob.objects.filter(pk=job.pk).update(
        status=JobStatus.SUCCEEDED, attempts=1, claimed_at=earlier, result=3
    )
    delayjobs.retry(job.pk)
    now = timezone.now()
    DelayedJob.objects.filter(pk=job.pk).update(
        status=JobStatus.RUNNING, attempts=1, worker_id="w-new", claimed_at=now
    )
    running = default_task_backend.get_result(result.id)
    assert running.status == TaskResultStatus.RUNNING
    assert (running.attempts, running.worker_ids) == (1, ["w-new"])
    assert running.started_at == running.last_attempted_at == now
    # Its attempt row, once written (a read racing the end of the attempt), is the one.
    attempt_row(job, 1, "w-new", now, AttemptOutcome.SUCCEEDED)
    assert default_task_backend.get_result(result.id).worker_ids == ["w-new"]


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

    with pytest.raises(UnstorableResult, match="not JSON-serializable"):
        registry.get(TASK_JOB_TYPE).execute(claimed(returns_a_set.enqueue()))


# Return values: SUCCESSFUL only for what the core stores ---------------------------------


@pytest.mark.django_db
def test_a_return_value_over_the_size_limit_fails_the_task_and_is_never_reported_successful(
    settings: Any, tasks_signals: list[tuple[str, Any]]
) -> None:
    settings.DELAYJOBS = {**settings.DELAYJOBS, "MAX_PAYLOAD_BYTES": 200}
    job = claimed(repeat.enqueue("x", 1000))
    with pytest.raises(UnstorableResult, match="over the limit of 200 bytes") as caught:
        registry.get(TASK_JOB_TYPE).execute(job)
    assert f"{EXCEPTION_CLASS_NOTE}delayjobs.exceptions.UnstorableResult" in caught.value.__notes__
    assert [name for name, _ in tasks_signals] == ["started", "finished"]
    finished = tasks_signals[1][1]
    assert finished.status == TaskResultStatus.FAILED
    assert finished.errors[-1].exception_class is UnstorableResult


@pytest.mark.django_db(transaction=True)  # run_claimed closes old connections, as per job
def test_an_unstorable_return_value_fails_the_job_without_retry(settings: Any) -> None:
    settings.DELAYJOBS = {**settings.DELAYJOBS, "MAX_PAYLOAD_BYTES": 200}
    for result in (repeat.enqueue("x", 1000), returns_nan.enqueue()):
        job = claimed(result)
        assert job.max_attempts == 5
        outcome = run_claimed(job, "here")
        assert outcome.error.startswith("UnstorableResult: ")
        assert outcome.retry_at is None and not outcome.succeeded


@pytest.mark.django_db
def test_nan_is_refused_as_a_return_value(tasks_signals: list[tuple[str, Any]]) -> None:
    with pytest.raises(UnstorableResult, match="JSON-serializable"):
        registry.get(TASK_JOB_TYPE).execute(claimed(returns_nan.enqueue()))
    assert tasks_signals[-1][1].status == TaskResultStatus.FAILED


@pytest.mark.django_db
def test_the_result_reports_the_return_value_as_stored(
    tasks_signals: list[tuple[str, Any]],
) -> None:
    value = registry.get(TASK_JOB_TYPE).execute(claimed(returns_int_keys.enqueue()))
    assert value == {"1": "one"}  # what DelayedJob.result will hold, and get_result read
    assert tasks_signals[-1][1].return_value == {"1": "one"}


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
def test_get_result_of_a_row_naming_an_undeclared_path_reads_the_row_and_imports_nothing(
    marker_module: Path,
) -> None:
    job = forged(f"{MARKER_MODULE}.evil")
    job.payload = {**job.payload, "args": [1], "kwargs": {"k": "v"}}
    job.save()
    result = default_task_backend.get_result(str(job.pk))
    assert MARKER_MODULE not in sys.modules
    assert not marker_module.exists()
    assert (result.id, result.status) == (str(job.pk), TaskResultStatus.READY)
    assert (result.args, result.kwargs, result.backend) == ([1], {"k": "v"}, "default")
    # A placeholder task: calling it says why; a real task's get_result says mismatch.
    assert result.task.func is unavailable_task
    with pytest.raises(UnregisteredTask):
        result.task.call()
    with pytest.raises(task_compat.TaskResultMismatch):
        add.get_result(str(job.pk))


@pytest.mark.django_db
def test_get_result_of_a_renamed_task_still_reports_its_outcome() -> None:
    result = add.enqueue(1, 2)
    DelayedJob.objects.filter(pk=int(result.id)).update(
        payload={**row(result).payload, "task": "tests.tasks.add_renamed_since"},
        status=JobStatus.SUCCEEDED,
        result=3,
        attempts=1,
        finished_at=timezone.now(),
    )
    fetched = default_task_backend.get_result(result.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL and fetched.return_value == 3
    assert fetched.task.func is unavailable_task
    # A row of another job type, or an unreadable payload, is still no task result.
    DelayedJob.objects.filter(pk=int(result.id)).update(payload=["not", "an", "object"])
    with pytest.raises(TaskResultDoesNotExist, match="unreadable"):
        default_task_backend.get_result(result.id)


# Exception classes: TaskError.exception_class never imports what a row names -------------


def failed_attempt(job: DelayedJob, error: str, text: str, number: int = 1) -> None:
    JobAttempt.objects.create(
        job=job,
        number=number,
        worker_id="w",
        started_at=timezone.now(),
        outcome=AttemptOutcome.FAILED,
        error=error,
        traceback=text,
        lateness=timedelta(0),
    )
    DelayedJob.objects.filter(pk=job.pk).update(status=JobStatus.FAILED, attempts=number)


@pytest.mark.django_db
def test_an_exception_class_path_read_from_a_row_is_never_imported(marker_module: Path) -> None:
    result = add.enqueue(1, 2)
    job = row(result)
    named = [
        f"{MARKER_MODULE}.evil",  # a module this process never loaded
        "os.system",  # loaded, but not an exception class
        "UnregisteredBareName",  # no module at all
        "tests.tasks.TaskBoom",  # loaded, an exception class: kept
    ]
    for number, path in enumerate(named, start=1):
        failed_attempt(
            job, "X: y", f"Traceback ...\nX: y\n{EXCEPTION_CLASS_NOTE}{path}", number=number
        )
    errors = default_task_backend.get_result(result.id).errors
    stand_in = "delayjobs.exceptions.TaskFailed"
    assert [e.exception_class_path for e in errors] == [stand_in] * 3 + ["tests.tasks.TaskBoom"]
    assert [e.exception_class for e in errors] == [TaskFailed] * 3 + [TaskBoom]
    for error, path in zip(errors[:3], named, strict=False):
        assert f"The exception's class, {path!r}" in error.traceback  # the original name
    assert MARKER_MODULE not in sys.modules
    assert not marker_module.exists(), f"exception_class imported {MARKER_MODULE}"


@pytest.mark.django_db(transaction=True)  # run_claimed closes old connections, as per job
def test_errors_raised_before_the_task_runs_carry_an_importable_class_path() -> None:
    unknown = forged("tests.tasks.not_defined", max_attempts=1)
    foreign = forged("tests.tasks.add", backend="immediate", max_attempts=1)
    for job, expected in [(unknown, UnregisteredTask), (foreign, TaskRefused)]:
        job.status, job.attempts, job.worker_id = JobStatus.RUNNING, 1, "w"
        outcome = run_claimed(job, "w")
        path = f"{expected.__module__}.{expected.__qualname__}"
        assert f"{EXCEPTION_CLASS_NOTE}{path}" in outcome.traceback
        failed_attempt(job, outcome.error, outcome.traceback)
    # Readable by its backend: the unknown one through a placeholder task.
    [error] = default_task_backend.get_result(str(unknown.pk)).errors
    assert error.exception_class_path == "delayjobs.exceptions.UnregisteredTask"
    assert error.exception_class is UnregisteredTask
    assert "is not a registered @task" in error.traceback


# A missing task: retried late, rediscovered, refused at enqueue ---------------------------


@pytest.mark.django_db
def test_a_task_this_consumer_does_not_know_is_retried_minutes_later() -> None:
    # A rolling deploy: web code already enqueues a task old consumers do not define.
    job = forged("tests.tasks.added_in_the_next_release", max_attempts=5)
    job.status, job.attempts, job.worker_id = JobStatus.RUNNING, 1, "old-consumer"
    with pytest.raises(UnregisteredTask) as caught:
        registry.get(TASK_JOB_TYPE).execute(job)
    before = timezone.now()
    retry_at = retry_at_after(job, caught.value)
    assert retry_at is not None
    assert retry_at - before >= UNREGISTERED_RETRY_BASE / 2
    jobtype = registry.get(TASK_JOB_TYPE)
    delays = []
    for attempt in range(1, 40):
        job.attempts = attempt
        delays.append(jobtype.retry_delay(job, caught.value))
    assert all(UNREGISTERED_RETRY_BASE / 2 <= d <= UNREGISTERED_RETRY_CAP for d in delays)
    # Four waits (5 attempts) add up to a quarter of an hour at least.
    assert sum(delays[:4], timedelta(0)) >= timedelta(minutes=15)
    # Other failures keep delayjobs' short backoff.
    job.attempts = 1
    assert jobtype.retry_delay(job, TaskBoom("x")) <= timedelta(seconds=2)


@pytest.mark.django_db
def test_a_backend_alias_this_consumer_does_not_know_is_retried_minutes_later() -> None:
    # A deploy adds TASKS["emails"] on a shared queue; old consumers claim its rows.
    from django.conf import settings

    jobtype = registry.get(TASK_JOB_TYPE)
    job = forged("tests.tasks.add", backend="emails", max_attempts=5)
    job.status, job.attempts, job.worker_id = JobStatus.RUNNING, 1, "old-consumer"
    with pytest.raises(UnknownTaskBackend, match="'emails'") as caught:
        jobtype.execute(job)
    assert not isinstance(caught.value, TaskRefused)
    before = timezone.now()
    retry_at = retry_at_after(job, caught.value)
    assert retry_at is not None and retry_at - before >= UNREGISTERED_RETRY_BASE / 2
    job.attempts = 3
    assert jobtype.retry_delay(job, caught.value) >= UNREGISTERED_RETRY_BASE

    # An alias that exists but cannot run tasks here is still refused, not retried.
    tasks = {**settings.TASKS, "broken": {"BACKEND": "tests.no_such_module.Backend"}}
    with override_settings(TASKS=tasks):
        for alias, message in [("immediate", "not a DelayJobsBackend"), ("broken", "usable")]:
            refused = forged("tests.tasks.add", backend=alias, max_attempts=5)
            refused.status, refused.attempts = JobStatus.RUNNING, 1
            with pytest.raises(TaskRefused, match=message) as caught_refused:
                jobtype.execute(refused)
            assert retry_at_after(refused, caught_refused.value) is None


@pytest.fixture
def make_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """Writes an importable module of the given source; removed from sys.modules after."""
    directory = tmp_path / "modules"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))
    names: list[str] = []

    def make(name: str, source: str) -> str:
        (directory / f"{name}.py").write_text(source)
        names.append(name)
        return name

    yield make
    for name in names:
        sys.modules.pop(name, None)


TASK_IMPORT = (
    "try:\n    from django.tasks import task\n"
    "except ImportError:\n    from django_tasks import task\n"
)


def with_modules(*modules: str) -> Any:
    from django.conf import settings

    default = {**settings.TASKS["default"], "OPTIONS": {"MODULES": list(modules)}}
    return override_settings(TASKS={**settings.TASKS, "default": default})


def test_a_module_that_failed_to_import_is_tried_again_on_a_later_miss(
    make_module: Callable[..., str], tmp_path: Path
) -> None:
    broken, imports = tmp_path / "database-down", tmp_path / "imports"
    broken.write_text("")
    name = make_module(
        "delayjobs_flaky_tasks",
        "import pathlib\n"
        f"pathlib.Path({str(imports)!r}).open('a').write('x')\n"
        f"if pathlib.Path({str(broken)!r}).exists():\n"
        "    raise RuntimeError('the database is down')\n"
        f"{TASK_IMPORT}\n@task\ndef later():\n    return 'ok'\n",
    )
    fresh = TaskIndex(rediscover_interval=3600)
    with with_modules(name):
        with pytest.raises(UnregisteredTask, match="the database is down"):
            fresh.get(f"{name}.later")
        broken.unlink()  # the database is back
        # Rate-limited: a stream of misses does not re-import every declared module.
        with pytest.raises(UnregisteredTask):
            fresh.get(f"{name}.later")
        assert imports.read_text() == "x"
        fresh.rediscover_interval = 0  # ...the interval has passed
        assert fresh.get(f"{name}.later").name == "later"
        assert imports.read_text() == "xx"
        assert "the database is down" not in fresh._unknown_message("gone")


@pytest.mark.django_db
def test_enqueue_refuses_a_task_from_a_module_consumers_do_not_search(
    make_module: Callable[..., str],
) -> None:
    name = make_module(
        "delayjobs_undeclared_tasks",
        f"{TASK_IMPORT}\n@task\ndef orphan():\n    return 1\n",
    )
    orphan = __import__(name).orphan
    with pytest.raises(InvalidTaskCall, match=r"outside every installed app") as caught:
        orphan.enqueue()
    message = str(caught.value)
    assert "Move it into an app" in message
    assert f"add '{name}' to TASKS['default']['OPTIONS']['MODULES']" in message
    assert not DelayedJob.objects.exists()
    # Listed in MODULES, it is found by consumers, and accepted.
    with with_modules(name):
        result = orphan.enqueue()
        assert row(result).payload["task"] == f"{name}.orphan"
        assert default_task_backend.get_result(result.id).task.func is orphan.func
    # The test suite's own tasks module is an installed app's: declared.
    assert index.is_declared("tests.tasks")


@pytest.mark.django_db
def test_enqueue_refuses_a_task_that_is_not_an_attribute_of_its_module(
    make_module: Callable[..., str],
) -> None:
    name = make_module(
        "delayjobs_hidden_tasks",
        f"{TASK_IMPORT}\n@task\ndef hidden():\n    return 1\n\nREGISTRY = [hidden]\ndel hidden\n",
    )
    hidden = __import__(name).REGISTRY[0]
    with with_modules(name), pytest.raises(InvalidTaskCall, match="not a @task attribute"):
        hidden.enqueue()


def test_known_holds_the_lock_while_another_thread_adds() -> None:
    fresh = TaskIndex()
    fresh.add(add)
    added = threading.Event()

    def add_more() -> None:
        fresh.add(echo)
        added.set()

    class Racing(dict):  # type: ignore[type-arg]
        def __iter__(self) -> Iterator[str]:
            iterator = super().__iter__()
            yield next(iterator)
            if thread.ident is None:
                thread.start()
            # Unlocked, the other thread's add() changes the dict under this iteration.
            added.wait(0.2)
            yield from iterator

    thread = threading.Thread(target=add_more)
    fresh._tasks = Racing(fresh._tasks)
    assert fresh.known() == ["tests.tasks.add"]
    thread.join(timeout=10)
    assert fresh.known() == ["tests.tasks.add", "tests.tasks.echo"]


def test_discovery_imports_only_declared_modules() -> None:
    fresh = TaskIndex()
    fresh.discover()
    assert "tests.tasks.add" in fresh.known()
    assert "delayjobs.tasks" not in declared_modules()  # Celery tasks, not Django tasks
    with override_settings(
        TASKS={
            "default": {
                "BACKEND": "delayjobs.contrib.tasks.backend.DelayJobsBackend",
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
    ids = [unknown.pk, not_a_task.pk, foreign.pk, int(control.id)]

    consumer = consumer_process(
        "--worker-id", "tasks-worker", env={"PYTHONPATH": _pythonpath(marker_module)}
    )
    wait_final(ids, [consumer], timeout=60)
    # An alias this consumer does not know (a newer deploy's) is left for minutes.
    retried = wait_for(
        lambda: DelayedJob.objects.filter(
            pk=missing_alias.pk, status=JobStatus.SCHEDULED, attempts=1
        ).first(),
        message=f"{consumer.output()[-3000:]}",
    )
    consumer.send_signal(15)
    assert consumer.wait(timeout=30) == 0, consumer.output()
    assert retried.run_at - timezone.now() >= UNREGISTERED_RETRY_BASE / 2 - timedelta(seconds=30)
    assert retried.last_error.startswith("UnknownTaskBackend: Task backend alias 'no-such-alias'")

    assert default_task_backend.get_result(control.id).return_value == 42
    for job in (unknown, not_a_task):
        job.refresh_from_db()
        assert job.status == JobStatus.FAILED
        assert job.last_error.startswith("ForbiddenTaskPath: ")
        assert "is not in an installed app's package" in job.last_error
    foreign.refresh_from_db()
    # Refused, and not retried: waiting does not make the row runnable.
    assert (foreign.status, foreign.attempts) == (JobStatus.FAILED, 1)
    assert foreign.last_error.startswith("TaskRefused: Task backend alias")
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
    assert refused.errors[0].exception_class_path == "delayjobs.exceptions.UnstorableResult"
    assert refused.errors[0].exception_class is UnstorableResult
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
    # Claimed together from the database (as Redis-down mode does): highest first.
    offered: list[int] = []

    def choose(candidates: list[Any]) -> list[Any]:
        offered.extend(row_priority[c.pk] for c in candidates)
        return candidates

    row_priority = {int(r.id): p for p, r in results.items()}
    claimed_jobs = transitions.claim_due(
        queues=["default"],
        job_types=[TASK_JOB_TYPE],
        limit=len(results),
        choose=choose,
        worker_id="w",
        now=timezone.now(),
        leases={},
        default_lease=timedelta(minutes=1),
    )
    assert offered == [50, 10, 0, -5]
    assert len(claimed_jobs) == 4


def test_consumers_without_queue_options_serve_every_queue_the_backends_allow() -> None:
    from django.conf import settings

    tasks = {
        **settings.TASKS,
        "reports": {
            "BACKEND": "delayjobs.contrib.tasks.backend.DelayJobsBackend",
            "QUEUES": ["reports", "default"],
        },
    }
    with override_settings(TASKS=tasks):
        assert "reports" in registry.get("django.task").queues_served()
        assert "reports" in Consumer(burst=True).queues
    assert "reports" not in registry.queues()


# Resolution by module path, within the installed apps ---------------------------------


@pytest.mark.django_db(transaction=True)  # run_claimed closes old connections, as per job
def test_a_task_in_any_module_of_an_installed_app_is_imported_by_its_path() -> None:
    """A consumer that never imported tests.task_functions (no ``tasks`` module, not in
    MODULES) imports it to run the task the row names, as Django's backends do."""
    from tests.task_functions import multiply

    result = multiply.enqueue(6, 7)
    job = row(result)
    sys.modules.pop("tests.task_functions")  # a fresh consumer process has not imported it
    index.reset()
    job.status, job.attempts, job.worker_id = JobStatus.RUNNING, 1, "w"
    outcome = run_claimed(job, "w")
    assert "tests.task_functions" in sys.modules
    assert (outcome.error, outcome.result) == ("", 42)


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["os.system", "subprocess.run", f"{MARKER_MODULE}.evil"])
def test_a_path_outside_every_installed_app_imports_nothing_and_fails_without_retry(
    marker_module: Path, path: str
) -> None:
    sys.modules.pop("subprocess_not_loaded_marker", None)
    job = forged(path, max_attempts=5)
    job.status, job.attempts, job.worker_id = JobStatus.RUNNING, 1, "w"
    with pytest.raises(ForbiddenTaskPath, match="not in an installed app's package") as caught:
        registry.get(TASK_JOB_TYPE).execute(job)
    assert "Nothing was imported" in str(caught.value)
    assert not marker_module.exists(), f"{path} imported its module"
    assert MARKER_MODULE not in sys.modules
    assert retry_at_after(job, caught.value) is None, "no later attempt would do otherwise"
