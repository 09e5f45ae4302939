"""A freed slot goes to the next job waiting for it (``delayjobs.engine.successors``): the
outcome that freed it is written in one transaction with that job's claim, on the real
database and Redis, by an in-process consumer that starts nothing (its start is recorded).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

import delayjobs
from delayjobs import pauses
from delayjobs.core import clock
from delayjobs.engine.consumer import Consumer
from delayjobs.engine.limited import claim_limited
from delayjobs.engine.successors import fill_freed_slots
from delayjobs.index.keys import due_key, held_key
from delayjobs.index.store import get_store
from delayjobs.jobtypes import JobType, registry
from delayjobs.lanes import own_lane
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from delayjobs.transitions import Outcome

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "limits"


class OneAtATime(JobType):
    name = "tests.successors.one"
    queue = QUEUE
    global_concurrency = 1

    def execute(self, job: DelayedJob) -> None:
        return None


#: Its own lane (``lane()`` says so once the type is registered).
LANE = own_lane(QUEUE, OneAtATime.name)


@pytest.fixture
def consumer() -> Iterator[tuple[Consumer, list[DelayedJob]]]:
    """A consumer of the type, whose claimed jobs are recorded, not run."""
    registry.add(OneAtATime)
    try:
        consumer = Consumer(queues=[QUEUE], concurrency=2, preload=False)
        clock.shared.sync()  # as a consumer does before its first claim
        started: list[DelayedJob] = []
        consumer.fetch_redis.claims.start = started.extend  # type: ignore[method-assign]
        yield consumer, started
    finally:
        registry.remove(OneAtATime.name)


def due(count: int) -> list[DelayedJob]:
    """Jobs due in this order, off their lane (as if popped, before the claim)."""
    jobs = delayjobs.schedule_many(
        [
            {"job_type": OneAtATime.name, "run_at": timezone.now() - timedelta(seconds=10 - n)}
            for n in range(count)
        ]
    )
    get_store().client.delete(due_key(LANE))
    return jobs


def held_ids() -> list[int]:
    client = get_store().client
    return [int(pk) for pk in client.zrange(held_key(LANE, OneAtATime.name), 0, -1)]


def ended(job: DelayedJob) -> Outcome:
    now = timezone.now()
    return Outcome(job=job, worker_id=job.worker_id, started_at=now, finished_at=now)


def status(job: DelayedJob) -> str:
    return DelayedJob.objects.get(pk=job.pk).status


def test_the_freed_slot_goes_to_the_next_held_job_with_the_outcome_that_freed_it(
    consumer: tuple[Consumer, list[DelayedJob]],
) -> None:
    consumer_, started = consumer
    first, second, third = due(3)
    claims = consumer_.fetch_redis.claims
    jobs, held = claim_limited(claims, [first.pk, second.pk, third.pk], park=True)
    assert [job.pk for job in jobs] == [first.pk] and held == {second.pk, third.pk}
    assert held_ids() == [second.pk, third.pk]
    assert consumer_.contended.covers(jobs[0])  # jobs wait for its slot

    recorder = consumer_.recorder
    recorder.put(ended(jobs[0]))
    assert recorder.routed and recorder.pending == 1
    assert fill_freed_slots(consumer_.fetch_redis, recorder) == 1
    # One transaction: the outcome written, the earliest held job claimed by this consumer.
    assert status(first) == JobStatus.SUCCEEDED
    assert JobAttempt.objects.get(job_id=first.pk).outcome == AttemptOutcome.SUCCEEDED
    assert [job.pk for job in started] == [first.pk, second.pk]
    assert status(second) == JobStatus.RUNNING
    assert held_ids() == [third.pk] and recorder.pending == 0

    recorder.put(ended(started[-1]))
    assert fill_freed_slots(consumer_.fetch_redis, recorder) == 1
    assert [job.pk for job in started][-1] == third.pk and held_ids() == []
    # The last one's slot: nobody waits for it any more, so the key is no longer contended.
    recorder.put(ended(started[-1]))
    assert fill_freed_slots(consumer_.fetch_redis, recorder) == 0
    assert status(third) == JobStatus.SUCCEEDED
    assert not consumer_.contended.covers(started[-1])  # its next outcome: the recorder's


def lane_ids() -> set[int]:
    return set(get_store().members(LANE))


def running_and_held(consumer: Consumer) -> tuple[DelayedJob, DelayedJob]:
    """Two jobs claimed together: the first started, the second held for its slot."""
    first, second = due(2)
    claim_limited(consumer.fetch_redis.claims, [first.pk, second.pk], park=True)
    return first, second


def test_an_outcome_that_cannot_be_written_goes_to_the_recorder_and_the_job_back_to_its_lane(
    consumer: tuple[Consumer, list[DelayedJob]],
) -> None:
    consumer_, started = consumer
    first, second = running_and_held(consumer_)
    DelayedJob.objects.filter(pk=first.pk).delete()  # deleted while it ran: its attempt fails
    recorder = consumer_.recorder
    recorder.put(ended(started[0]))
    with pytest.raises(Exception, match=r"(?i)foreign key"):
        fill_freed_slots(consumer_.fetch_redis, recorder)
    # Nothing claimed, nothing lost: the outcome is the recorder's (which drops it, as it
    # drops any it cannot write), the held job due again in its lane.
    assert [job.pk for job in started] == [first.pk] and status(second) == JobStatus.SCHEDULED
    assert held_ids() == [] and lane_ids() == {second.pk}
    assert not recorder.routed and recorder.pending == 1
    recorder.start()
    recorder.stop()
    assert recorder.pending == 0


def test_a_slot_this_consumer_cannot_fill_is_released_to_the_lanes_consumers(
    consumer: tuple[Consumer, list[DelayedJob]],
) -> None:
    consumer_, started = consumer
    first, second = running_and_held(consumer_)
    pauses.pause(job_type=OneAtATime.name)
    consumer_.pauses.reload()
    consumer_.recorder.put(ended(started[0]))
    assert fill_freed_slots(consumer_.fetch_redis, consumer_.recorder) == 0
    assert status(first) == JobStatus.SUCCEEDED
    assert held_ids() == [] and lane_ids() == {second.pk}  # moved, for whoever may run it


def test_a_stopping_consumer_leaves_the_outcomes_and_their_slots_to_the_recorder(
    consumer: tuple[Consumer, list[DelayedJob]],
) -> None:
    consumer_, started = consumer
    first, second = running_and_held(consumer_)
    recorder = consumer_.recorder
    recorder.put(ended(started[0]))
    assert recorder.routed
    recorder.start()
    recorder.stop()  # as the consumer's shutdown does
    assert status(first) == JobStatus.SUCCEEDED and recorder.pending == 0
    assert held_ids() == [] and lane_ids() == {second.pk}
