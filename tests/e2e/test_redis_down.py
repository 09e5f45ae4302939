"""Redis-down mode, end to end: a consumer goes on claiming due jobs from the database while
its Redis is unreachable, says so once, and goes back to Redis by itself when it returns.

Each test has a Redis server of its own (the suite's shared one must stay up), which it
stops and starts again empty, as a crashed Redis without persistence would come back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from redis import Redis, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

import delayjobs
from delayjobs.engine.consumer import Consumer
from delayjobs.engine.execution import Running
from delayjobs.index.store import RedisStore
from delayjobs.models import DelayedJob
from tests.conftest import ConsumerFactory, ConsumerProcess
from tests.consumers import Outage, check_alive, executions_per_job, wait_final, wait_output
from tests.models import Execution
from tests.utils import in_thread, wait_for

pytestmark = [pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

DOWN = "claiming due jobs from the database"
BACK = "Redis is back"


@pytest.fixture
def outage(settings: Any) -> Iterator[Outage]:
    """A Redis of the test's own, used by the test process and its consumers (not started)."""
    redis = Outage()
    # schedule() in this process hands jobs to the same Redis as the consumers.
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": redis.url}
    yield redis
    if redis.server is not None:
        redis.stop()


def start_consumer(consumer_process: ConsumerFactory, outage: Outage) -> ConsumerProcess:
    overrides = {"REDIS_URL": outage.url, "DATABASE_POLL_INTERVAL": 0.5}
    return consumer_process(
        "--concurrency", "4", env={"DELAYJOBS_TEST_OVERRIDES": json.dumps(overrides)}
    )


def spread(count: int, seconds: float) -> list[DelayedJob]:
    """``count`` jobs due evenly over the next ``seconds``."""
    now = timezone.now()
    step = seconds / count
    return delayjobs.schedule_many(
        [
            {"job_type": "tests.scripted", "run_at": now + timedelta(seconds=n * step)}
            for n in range(count)
        ]
    )


def executed_since(moment: object) -> int:
    return Execution.objects.filter(started_at__gt=moment).count()


def test_a_consumer_started_without_redis_runs_due_jobs_from_the_database(
    consumer_process: ConsumerFactory, outage: Outage
) -> None:
    consumer = start_consumer(consumer_process, outage)
    jobs = spread(60, 2.0)  # scheduled fine: the database write is what counts

    wait_final([job.pk for job in jobs], [consumer])
    assert executions_per_job() == {job.pk: 1 for job in jobs}
    assert consumer.output().count(DOWN) == 1

    # Redis comes back: the consumer notices by itself and leaves database mode.
    outage.start()
    wait_output(consumer, BACK)
    later = spread(60, 2.0)
    wait_final([job.pk for job in later], [consumer])
    assert executions_per_job() == {job.pk: 1 for job in [*jobs, *later]}
    output = consumer.output()
    assert output.count(DOWN) == 1
    assert output.count(BACK) == 1
    check_alive([consumer])


def test_redis_lost_under_load_then_back_empty_loses_nothing(
    consumer_process: ConsumerFactory, outage: Outage
) -> None:
    outage.start()
    consumer = start_consumer(consumer_process, outage)
    jobs = spread(600, 8.0)
    wait_for(lambda: Execution.objects.count() >= 50, message="no job ran before the outage")

    outage.stop()
    stopped_at = timezone.now()
    wait_output(consumer, DOWN)
    # Jobs keep running while Redis is down, claimed from the database.
    wait_for(lambda: executed_since(stopped_at) >= 50, message="nothing ran during the outage")

    outage.start()  # empty: the jobs it indexed are gone
    wait_output(consumer, BACK)
    wait_final([job.pk for job in jobs], [consumer])

    assert executions_per_job() == {job.pk: 1 for job in jobs}
    output = consumer.output()
    assert output.count(DOWN) == 1
    assert output.count(BACK) == 1
    check_alive([consumer])


def test_redis_lost_in_a_backlog_with_busy_threads_switches_to_the_database(
    outage: Outage,
) -> None:
    """A consumer that waits for slots between pops in a backlog must not count those
    waits as Redis answering: two failed pops in a row switch it to the database."""
    outage.start()
    consumer = Consumer(concurrency=4, preload=False)
    # What a busy consumer's last good pop leaves: due jobs left behind (a backlog), jobs
    # of about 10 ms (one per idle thread), three threads still in long jobs.
    consumer.fetch_redis.backlog = True
    consumer.inflight.finish(unstarted(), 0.01)  # its first execution: the average
    for running in consumer.inflight.add([unstarted(pk).job for pk in range(1, 4)]):
        consumer.inflight.begin(running)
    outage.stop()

    loop = in_thread(consumer.loop)
    try:
        wait_for(lambda: consumer.fallback.database_mode, message="still retrying Redis")
    finally:
        consumer.request_stop()
        loop.join(timeout=30)
    assert not loop.is_alive()


@pytest.mark.parametrize(
    ("error", "failures_before_fallback"),
    [
        # Frozen, or behind a partition that drops packets: the socket timeout already ran
        # out once; waiting it out a second time would only double every job's lateness.
        (RedisTimeoutError("Timeout reading from socket"), 1),
        # Refused or reset: usually an idle connection dropped, which a reconnect mends.
        (RedisConnectionError("Connection reset by peer"), 2),
    ],
)
def test_a_time_out_falls_back_to_the_database_at_once_a_refusal_after_one_retry(
    error: RedisError, failures_before_fallback: int
) -> None:
    # Nothing listens on port 1: the store is never reached, only its errors are fed in.
    consumer = Consumer(
        queues=["default"], store=RedisStore(Redis.from_url("redis://127.0.0.1:1/0"))
    )
    for _ in range(failures_before_fallback - 1):
        assert consumer.fallback.redis_failed(error) == 0.0
        assert not consumer.fallback.database_mode
    assert consumer.fallback.redis_failed(error) == 0.0
    assert consumer.fallback.database_mode


def unstarted(pk: int = 0) -> Running:
    """An execution of an unsaved job, as a claim registers it (nothing runs). Due in an
    hour, as if claimed early: a thread taking it starts no time-out that could matter."""
    run_at = timezone.now() + timedelta(hours=1)
    return Running(DelayedJob(pk=pk, queue="default", job_type="tests.scripted", run_at=run_at))
