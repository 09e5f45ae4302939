"""A recurring schedule keeps ticking while Redis is down: the consumers, claiming from the
database, make its ticks into jobs themselves (the pre-loader needs Redis for its lock),
and still one job per tick."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from delayjobs.core import clock
from delayjobs.models import DelayedJob, JobStatus, Schedule
from delayjobs.recurring.definitions import tick_key
from tests.conftest import ConsumerFactory, ConsumerProcess
from tests.consumers import Outage, check_alive
from tests.models import Execution
from tests.utils import wait_for

pytestmark = [pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

TICKS = 5


@pytest.fixture
def outage(settings: Any) -> Iterator[Outage]:
    """A Redis of the test's own, never started: Redis is down for the whole test."""
    redis = Outage()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": redis.url}
    yield redis


def start_consumer(consumer_process: ConsumerFactory, outage: Outage) -> ConsumerProcess:
    overrides = {"REDIS_URL": outage.url, "DATABASE_POLL_INTERVAL": 0.2, "PRELOAD_INTERVAL": 1}
    return consumer_process(
        "--concurrency", "4", env={"DELAYJOBS_TEST_OVERRIDES": json.dumps(overrides)}
    )


def test_ticks_become_jobs_and_run_once_each_while_redis_is_down(
    consumer_process: ConsumerFactory, outage: Outage
) -> None:
    start = clock.now()
    Schedule.objects.create(
        name="every-second",
        job_type="tests.scripted",
        interval=timedelta(seconds=1),
        materialised_until=start,
    )
    consumers = [start_consumer(consumer_process, outage) for _ in range(2)]

    def succeeded() -> list[DelayedJob]:
        check_alive(consumers)
        jobs = list(DelayedJob.objects.filter(status=JobStatus.SUCCEEDED).order_by("run_at"))
        return jobs if len(jobs) >= TICKS else []

    jobs = wait_for(succeeded, timeout=60, message="the schedule made no jobs without Redis")
    first = jobs[0].run_at
    ticks = [first + timedelta(seconds=n) for n in range(TICKS)]
    # Every tick from the first on has its job, under its key, none twice.
    made = Counter(DelayedJob.objects.filter(run_at__in=ticks).values_list("key", flat=True))
    assert made == Counter(tick_key("every-second", tick) for tick in ticks)
    ran = Counter(
        Execution.objects.filter(job_id__in=[job.pk for job in jobs]).values_list(
            "job_id", flat=True
        )
    )
    assert set(ran.values()) == {1}, ran
    assert all(job.started_at is not None and job.started_at >= job.run_at for job in jobs)
