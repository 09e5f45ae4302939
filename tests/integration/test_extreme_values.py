"""Extreme values a job type returns at run time, and surprises in a consumer's main loop:
each ends one job (with its history saying why) or one turn, never the consumer.

The consumers run in this process (``--burst``), against the test Redis and database, so
that a test can register its own job type and see what the loop logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from django.utils import timezone

import delayjobs
from delayjobs import transitions
from delayjobs.engine.claimer import PauseView
from delayjobs.engine.consumer import Consumer
from delayjobs.index.store import RedisStore
from delayjobs.jobtypes import registry
from delayjobs.lanes import LANE_SEPARATOR, lanes
from delayjobs.models import DelayedJob, JobStatus
from delayjobs.transitions import Outcome

QUEUE = "extreme"


class RetriesPastTheEndOfTime(delayjobs.JobType):
    """Fails, and asks for a retry further out than dates go: a bug in its own policy."""

    name = "tests.extreme.retry_past_the_end_of_time"
    queue = QUEUE

    def execute(self, job: DelayedJob) -> None:
        raise RuntimeError("the payment service did not answer")

    def retry_delay(self, job: DelayedJob, exc: BaseException) -> timedelta:
        return timedelta.max


class Succeeds(delayjobs.JobType):
    name = "tests.extreme.succeeds"
    queue = QUEUE

    def execute(self, job: DelayedJob) -> str:
        return "done"


@pytest.fixture
def job_types() -> Iterator[None]:
    for cls in (RetriesPastTheEndOfTime, Succeeds):
        delayjobs.register(cls)
    try:
        yield
    finally:
        for cls in (RetriesPastTheEndOfTime, Succeeds):
            registry.remove(cls.name)


def run_burst() -> Consumer:
    consumer = Consumer(queues=[QUEUE], burst=True, preload=False, concurrency=2)
    assert consumer.run() == 0
    return consumer


@pytest.mark.django_db(transaction=True)
def test_a_retry_delay_past_any_date_fails_the_job_saying_why_and_the_consumer_goes_on(
    job_types: None, redis_client: redis.Redis
) -> None:
    bad = delayjobs.schedule(RetriesPastTheEndOfTime.name)
    good = delayjobs.schedule(Succeeds.name)

    run_burst()

    bad.refresh_from_db()
    assert bad.status == JobStatus.FAILED
    [attempt] = bad.history.all()
    assert attempt.outcome == "failed"
    assert attempt.error == "RuntimeError: the payment service did not answer"
    # Its traceback ends with why it was not retried (as an exception note).
    assert attempt.traceback.rstrip().endswith(
        f"Not retried: {RetriesPastTheEndOfTime.name}.retry_delay() returned "
        f"{timedelta.max}, more than the 366 days a retry may wait."
    )
    assert DelayedJob.objects.get(pk=good.pk).status == JobStatus.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_an_unexpected_error_in_the_main_loop_is_logged_and_the_loop_carries_on(
    job_types: None,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    job = delayjobs.schedule(Succeeds.name)
    original = PauseView.refresh
    calls: list[int] = []

    def fails_once(self: PauseView, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ZeroDivisionError("a bug nobody foresaw")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PauseView, "refresh", fails_once)
    with caplog.at_level(logging.ERROR, logger="delayjobs.consumer"):
        run_burst()

    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED
    [record] = [r for r in caplog.records if "unexpected error in its main loop" in r.message]
    assert record.exc_info is not None and record.exc_info[0] is ZeroDivisionError
    assert len(calls) > 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "when",
    [
        {"run_at": datetime(9999, 12, 31, tzinfo=UTC)},
        {"delay": timedelta(days=36526)},
        {"delay": timedelta(days=999_999)},
    ],
)
def test_a_job_further_ahead_than_max_schedule_ahead_is_refused(when: dict[str, Any]) -> None:
    with pytest.raises(delayjobs.InvalidJob, match=r"MAX_SCHEDULE_AHEAD"):
        delayjobs.schedule("tests.scripted", **when)
    with pytest.raises(delayjobs.InvalidJob, match=r"MAX_SCHEDULE_AHEAD"):
        delayjobs.schedule_many([{"job_type": "tests.scripted", **when}])
    assert not DelayedJob.objects.exists()


@pytest.mark.django_db
def test_max_schedule_ahead_is_a_setting(settings: Any) -> None:
    settings.DELAYJOBS = {**settings.DELAYJOBS, "MAX_SCHEDULE_AHEAD": timedelta(days=1)}
    assert delayjobs.schedule("tests.scripted", delay=timedelta(hours=23)).pk
    with pytest.raises(delayjobs.InvalidJob, match="more than 1 days ahead"):
        delayjobs.schedule("tests.scripted", delay=timedelta(hours=25))


class FailsOnTheSecondLane(RedisStore):
    """The real store, on the test Redis, whose second pop of a turn fails as a dropped
    connection would."""

    pops = 0

    def pop_due(self, lane_name: str, now: float, limit: int) -> Any:
        self.pops += 1
        if self.pops == 2:
            raise redis.ConnectionError("Connection lost in the middle of a multi-lane pop")
        return super().pop_due(lane_name, now, limit)


@pytest.mark.django_db(transaction=True)
def test_a_redis_error_in_a_multi_lane_pop_puts_back_what_was_popped(
    redis_client: redis.Redis,
) -> None:
    # One job in the queue's own lane, one in the lane of a job type with a limit.
    plain = delayjobs.schedule("tests.scripted")
    limited = delayjobs.schedule("tests.limited")
    store = FailsOnTheSecondLane()
    before = {name: store.members(name) for name in lanes("default")}
    assert before == {
        "default": {plain.pk: pytest.approx(plain.run_at.timestamp())},
        f"default{LANE_SEPARATOR}tests.limited": {
            limited.pk: pytest.approx(limited.run_at.timestamp())
        },
    }
    consumer = Consumer(queues=["default"], burst=True, preload=False, store=store)

    with pytest.raises(redis.ConnectionError):
        consumer.fetch_redis.turn()

    assert store.pops == 2  # the first lane was popped, the second failed
    assert {name: store.members(name) for name in lanes("default")} == before
    assert not DelayedJob.objects.filter(status=JobStatus.RUNNING).exists()


@pytest.mark.django_db(transaction=True)
def test_a_lease_holds_until_the_outcome_waiting_in_the_recorder_is_written(
    redis_client: redis.Redis,
) -> None:
    # A finished job whose outcome waits for a slow database: its lease, already short,
    # must be renewed, or the reaper gives the job to another consumer, which runs it again.
    job = delayjobs.schedule("tests.scripted")
    consumer = Consumer(queues=["default"], burst=True, preload=False, worker_id="w-slow-db")
    now = timezone.now()
    [claimed] = transitions.claim(
        [job.pk],
        worker_id="w-slow-db",
        now=now,
        job_types=registry.names(),
        leases={},
        default_lease=timedelta(milliseconds=1),
    )
    first_lease = claimed.lease_expires_at
    assert first_lease is not None
    outcome = Outcome(job=claimed, worker_id="w-slow-db", started_at=now, finished_at=now)
    consumer.recorder.put(outcome)  # its thread is not started: the write waits

    consumer.heartbeat.renew_leases()  # what the heartbeat does, every third of a time_to_run

    assert transitions.reap_expired_leases(first_lease + timedelta(seconds=1)) == []
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.RUNNING
    consumer.recorder.start()
    consumer.recorder.stop()
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert [a.outcome for a in job.history.all()] == ["succeeded"]
    assert consumer.recorder.waiting_jobs() == []
