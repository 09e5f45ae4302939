"""A consumer that starts claims what Redis already holds before the pre-loader's first
pass begins: the pass (reaping leases, planning, recurring ticks, the window) reads and
writes the database while a due job would wait for it, and nothing the first claim needs
comes from it. Its row in the consumers' table (presence) is written by the heartbeat
thread, not before the first claim either."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest
import redis

import delayjobs
from delayjobs.engine.consumer import Consumer
from delayjobs.jobtypes import registry
from delayjobs.models import Consumer as ConsumerRow
from delayjobs.models import DelayedJob, JobStatus
from tests.delay_jobs import Scripted
from tests.utils import in_thread, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class Watcher(delayjobs.JobType):
    """Plans nothing; notes, each time a pre-loader pass asks it, the status of the job
    ``watched`` names."""

    name = "tests.first_pass_watcher"
    queue = "other"
    watched: int | None = None
    seen: list[str] = []

    def plan(self, start: datetime, end: datetime) -> list[dict[str, object]]:
        status = DelayedJob.objects.filter(pk=type(self).watched).values_list("status", flat=True)
        type(self).seen.append(status.first() or "gone")
        return []

    def execute(self, job: DelayedJob) -> None:
        return None


@pytest.fixture
def watcher() -> Iterator[type[Watcher]]:
    Watcher.watched, Watcher.seen = None, []
    registry.add(Watcher)
    try:
        yield Watcher
    finally:
        registry.remove(Watcher.name)


def test_a_job_already_in_redis_is_claimed_before_the_first_preloader_pass(
    redis_client: redis.Redis, watcher: type[Watcher]
) -> None:
    job = delayjobs.schedule(Scripted)  # due now, handed to Redis on commit
    watcher.watched = job.pk
    consumer = Consumer(queues=[Scripted.queue], concurrency=2)

    thread = in_thread(consumer.run)
    try:
        wait_for(lambda: watcher.seen, message="no pre-loader pass asked the job types to plan")
        wait_for(lambda: ConsumerRow.objects.filter(worker_id=consumer.worker_id).exists())
    finally:
        consumer.request_stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    # Claimed (running, or finished already) when the first pass began.
    assert watcher.seen[0] in (JobStatus.RUNNING, JobStatus.SUCCEEDED)
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED
