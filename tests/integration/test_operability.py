"""Operating delayjobs: jobs linked to objects, signals, pause and resume, live consumers."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

import delayjobs
from delayjobs import pauses, signals
from delayjobs.engine.consumer import Consumer as ConsumerLoop
from delayjobs.exceptions import InvalidJob, UnknownJobType
from delayjobs.index.keys import due_key
from delayjobs.models import Consumer, DelayedJob, JobStatus
from tests.conftest import ConsumerFactory
from tests.consumers import wait_final
from tests.utils import wait_for

# Jobs on their objects ------------------------------------------------------------------


@pytest.mark.django_db
def test_schedule_links_a_job_to_its_object() -> None:
    user = User.objects.create(username="erin")
    job = delayjobs.schedule("tests.noop", obj=user)
    other = delayjobs.schedule_many([{"job_type": "tests.noop", "obj": user}])[0]
    delayjobs.schedule("tests.noop")  # no object

    job.refresh_from_db()
    assert job.obj == user
    assert set(DelayedJob.objects.for_object(user)) == {job, other}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ("user:1", "obj must be a saved model instance"),
        (User(username="unsaved"), "obj must be saved first"),
    ],
)
def test_schedule_refuses_what_is_not_a_saved_object(obj: Any, message: str) -> None:
    with pytest.raises(InvalidJob, match=message):
        delayjobs.schedule("tests.noop", obj=obj)
    assert not DelayedJob.objects.exists()


@pytest.mark.django_db
def test_replace_moves_the_link_with_the_job_or_keeps_it_without_obj() -> None:
    first, second = User.objects.create(username="a"), User.objects.create(username="b")
    job = delayjobs.schedule("tests.noop", key="k", obj=first, delay=timedelta(hours=1))
    moved = delayjobs.schedule("tests.noop", key="k", obj=second, replace=True)
    assert moved.pk == job.pk
    assert list(DelayedJob.objects.for_object(second)) == [job]
    assert not DelayedJob.objects.for_object(first).exists()
    # A replace that names no object keeps the link (a signal moving the time, say).
    delayjobs.schedule("tests.noop", key="k", delay=timedelta(hours=2), replace=True)
    assert list(DelayedJob.objects.for_object(second)) == [job]


# Signals --------------------------------------------------------------------------------


@pytest.fixture
def received() -> Iterator[list[tuple[str, int, dict[str, Any]]]]:
    """Every delayjobs signal sent during the test, as (name, job id, extra kwargs)."""
    calls: list[tuple[str, int, dict[str, Any]]] = []
    receivers = {}
    for name in ("job_scheduled", "job_started", "job_succeeded", "job_retrying", "job_failed"):

        def receiver(sender: Any, job: DelayedJob, name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            calls.append((name, job.pk, kwargs))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver, sender=DelayedJob)
    yield calls
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver, sender=DelayedJob)


def run_burst() -> None:
    """An in-process consumer: its worker threads send the signals in this process."""
    assert ConsumerLoop(burst=True, concurrency=2).run() == 0


@pytest.mark.django_db(transaction=True)
def test_signals_follow_a_job_through_retries_to_success(received) -> None:
    job = delayjobs.schedule("tests.scripted", {"fail_attempts": [1]})
    wait_for(lambda: any(name == "job_scheduled" for name, *_ in received))
    # The retry is due 50-200 ms later: run bursts until the job is done.
    wait_for(lambda: run_burst() or DelayedJob.objects.get(pk=job.pk).status == "succeeded")

    names = [name for name, pk, _kwargs in received if pk == job.pk]
    assert names == [
        "job_scheduled",
        "job_started",
        "job_retrying",
        "job_started",
        "job_succeeded",
    ]
    retrying = next(kwargs for name, _pk, kwargs in received if name == "job_retrying")
    assert retrying["error"].startswith("ScriptedFailure")
    assert retrying["retry_at"] > timezone.now() - timedelta(seconds=5)
    succeeded = next(kwargs for name, _pk, kwargs in received if name == "job_succeeded")
    assert succeeded["duration"] >= timedelta(0)


@pytest.mark.django_db(transaction=True)
def test_job_failed_is_sent_once_when_the_attempts_are_exhausted(received) -> None:
    job = delayjobs.schedule("tests.raises", {"raise": "SystemExit"})  # max_attempts 2
    wait_for(lambda: run_burst() or DelayedJob.objects.get(pk=job.pk).status == "failed")
    failed = [kwargs for name, pk, kwargs in received if name == "job_failed" and pk == job.pk]
    assert len(failed) == 1
    assert failed[0]["error"].startswith("SystemExit")
    assert "SystemExit" in failed[0]["traceback"]


@pytest.mark.django_db(transaction=True)
def test_a_timed_out_attempt_signals_once_and_its_late_return_signals_nothing(
    received, tmp_path, caplog
) -> None:
    release = tmp_path / "release"
    # tests.scripted times out after 2 s; attempt 1 holds until released, attempt 2 runs.
    job = delayjobs.schedule("tests.scripted", {"hold_attempts": [1], "release_file": str(release)})
    try:
        wait_for(
            lambda: run_burst() or DelayedJob.objects.get(pk=job.pk).status == "succeeded",
            timeout=60,
        )
    finally:
        release.touch()
    # The stuck thread returns now; whatever it returns must send nothing.
    wait_for(lambda: "returned after it had timed out" in caplog.text)

    names = sorted(name for name, pk, _kwargs in received if pk == job.pk)
    assert names == [
        "job_retrying",  # the time-out of attempt 1, once
        "job_scheduled",
        "job_started",
        "job_started",
        "job_succeeded",  # attempt 2
    ]
    retrying = next(kwargs for name, _pk, kwargs in received if name == "job_retrying")
    assert retrying["error"].startswith("JobTimeout")


@pytest.mark.django_db(transaction=True)
def test_a_failing_receiver_changes_nothing_about_the_job(received) -> None:
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("alerting is down")

    signals.job_started.connect(broken, sender=DelayedJob)
    try:
        job = delayjobs.schedule("tests.scripted")
        run_burst()
    finally:
        signals.job_started.disconnect(broken, sender=DelayedJob)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED


@pytest.mark.django_db
def test_job_scheduled_is_not_sent_for_a_rolled_back_job(received) -> None:
    from django.db import transaction

    with transaction.atomic():
        delayjobs.schedule("tests.noop")
        transaction.set_rollback(True)
    assert received == []


# Pause and resume -----------------------------------------------------------------------


@pytest.mark.django_db
def test_pause_and_resume_validate_their_target() -> None:
    with pytest.raises(InvalidJob, match="not both or neither"):
        pauses.pause()
    with pytest.raises(InvalidJob, match="not both or neither"):
        pauses.pause(queue="default", job_type="tests.noop")
    with pytest.raises(UnknownJobType):
        pauses.pause(job_type="os.system")
    with pytest.raises(InvalidJob, match="queue must be"):
        pauses.pause(queue="bad queue!")
    assert pauses.pause(queue="default", by="ops") is True
    assert pauses.pause(queue="default") is False  # already paused
    assert pauses.paused() == pauses.Paused(queues=frozenset({"default"}))
    assert pauses.resume(queue="default") is True
    assert pauses.resume(queue="default") is False
    assert not pauses.paused()


@pytest.mark.django_db
@pytest.mark.parametrize("target", [{"job_type": "tests.scripted"}, {"queue": "default"}])
def test_the_claim_itself_refuses_paused_work(target: dict[str, str]) -> None:
    """Whatever a consumer believes is paused, the claim reads the pauses itself."""
    from delayjobs.jobtypes import registry
    from delayjobs.transitions import claim

    due = delayjobs.schedule("tests.scripted", run_at=timezone.now() - timedelta(seconds=1))
    other = delayjobs.schedule("tests.noop", run_at=timezone.now() - timedelta(seconds=1))
    pauses.pause(**target)

    def claim_both() -> list[int]:
        claimed = claim(
            [due.pk, other.pk],
            worker_id="w",
            now=timezone.now(),
            job_types=registry.names(),
            leases={},
            default_lease=timedelta(seconds=30),
        )
        return [job.pk for job in claimed]

    assert claim_both() == [other.pk]
    pauses.resume(**target)
    assert claim_both() == [due.pk]


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("target", [{"job_type": "tests.scripted"}, {"queue": "default"}])
def test_paused_work_waits_scheduled_and_resumes_without_a_restart(
    consumer_process: ConsumerFactory, redis_client: Any, target: dict[str, str]
) -> None:
    consumer = consumer_process()
    first = delayjobs.schedule("tests.scripted")
    wait_final([first.pk], [consumer])

    assert pauses.pause(**target, by="test")
    paused_job = delayjobs.schedule("tests.scripted")
    # A job of another queue runs: the consumer went round its loop after the pause.
    marker = delayjobs.schedule("tests.noop")
    wait_final([marker.pk], [consumer])
    paused_job.refresh_from_db()
    assert (paused_job.status, paused_job.attempts) == (JobStatus.SCHEDULED, 0)
    if "job_type" in target:
        # Popped with the queue's other jobs, then left out of Redis while paused, so
        # that no consumer pops it over and over. (A paused queue is simply not popped.)
        wait_for(lambda: redis_client.zscore(due_key("default"), paused_job.pk) is None)

    assert pauses.resume(**target)
    wait_final([paused_job.pk], [consumer])
    paused_job.refresh_from_db()
    assert paused_job.status == JobStatus.SUCCEEDED
    assert consumer.returncode is None  # the same consumer, never restarted


# Live consumers -------------------------------------------------------------------------


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_consumer_keeps_a_heartbeat_row_and_removes_it_when_it_stops(
    consumer_process: ConsumerFactory,
) -> None:
    consumer = consumer_process("--worker-id", "heartbeat-test", "--concurrency", "3")
    row = wait_for(lambda: Consumer.objects.filter(worker_id="heartbeat-test").first())
    assert (row.pid, row.concurrency) == (consumer.pid, 3)
    assert "default" in row.queues

    # tests.scripted has a 2 s time_to_run, so the heartbeat comes every 0.67 s.
    first_seen = row.last_seen
    wait_for(lambda: Consumer.objects.get(worker_id="heartbeat-test").last_seen > first_seen)

    consumer.send_signal(signal.SIGTERM)
    assert consumer.wait() == 0, consumer.output()
    assert not Consumer.objects.filter(worker_id="heartbeat-test").exists()
