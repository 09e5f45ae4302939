"""``transitions.claim_due``: claiming due jobs straight from the database (Redis-down mode)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

import delayjobs
from delayjobs import transitions
from delayjobs.engine.slots import Slots
from delayjobs.jobtypes import registry
from delayjobs.models import DelayedJob, JobStatus
from delayjobs.transitions import Candidate
from tests.utils import row_locked

pytestmark = pytest.mark.django_db

LEASE = timedelta(seconds=30)


def job_at(seconds: float, job_type: str = "tests.scripted", **kwargs) -> DelayedJob:
    return delayjobs.schedule(
        job_type, run_at=timezone.now() + timedelta(seconds=seconds), **kwargs
    )


def claim_due(
    limit: int = 10,
    *,
    queues: tuple[str, ...] = ("default", "other"),
    choose=lambda candidates: candidates,
    now: datetime | None = None,
) -> list[DelayedJob]:
    return transitions.claim_due(
        queues=list(queues),
        job_types=registry.names(),
        limit=limit,
        choose=choose,
        worker_id="worker-a",
        now=now or timezone.now(),
        leases={},
        default_lease=LEASE,
    )


def test_claims_due_jobs_in_due_order_up_to_the_limit():
    due = [job_at(-seconds) for seconds in (1, 3, 2)]
    job_at(60)  # not due
    claimed = claim_due(limit=2)
    # The two most overdue, as running rows with a lease.
    assert [job.pk for job in claimed] == [due[1].pk, due[2].pk]
    assert {job.status for job in claimed} == {JobStatus.RUNNING}
    assert [job.pk for job in claim_due()] == [due[0].pk]
    assert claim_due() == []


def test_claims_only_the_given_queues_and_skips_other_statuses():
    default = job_at(-1)
    other = job_at(-1, "tests.noop")  # queue "other"
    cancelled = job_at(-1)
    delayjobs.cancel(cancelled)
    assert [job.pk for job in claim_due(queues=("other",))] == [other.pk]
    assert [job.pk for job in claim_due()] == [default.pk]


def test_choose_decides_which_candidates_are_claimed():
    jobs = [job_at(-1) for _ in range(3)]
    seen: list[list[Candidate]] = []

    def only_the_last(candidates: list[Candidate]) -> list[Candidate]:
        seen.append(candidates)
        return candidates[-1:]

    claimed = claim_due(choose=only_the_last)
    assert [job.pk for job in claimed] == [jobs[-1].pk]
    assert seen == [[Candidate(job.pk, "default", "tests.scripted") for job in jobs]]
    # Those not chosen stay scheduled, untouched.
    assert DelayedJob.objects.filter(status=JobStatus.SCHEDULED).count() == 2


def test_slots_choose_keeps_within_the_limits_of_each_queue_and_type():
    slots = Slots(3, queue_limits={"slow": 1}, type_limits={"tests.limited": 1})
    wanted = [
        Candidate(1, "slow", "tests.slow_queue"),
        Candidate(2, "slow", "tests.slow_queue"),
        Candidate(3, "default", "tests.limited"),
        Candidate(4, "default", "tests.limited"),
        Candidate(5, "default", "tests.scripted"),
        Candidate(6, "default", "tests.scripted"),
    ]
    fit, over = slots.choose(wanted)
    assert [c.pk for c in fit] == [1, 3, 5]
    assert [c.pk for c in over] == [2, 4, 6]

    slots.take("slow", "tests.slow_queue")
    assert slots.queue_room("slow") == 0
    assert slots.open_types(["tests.limited", "tests.scripted"]) == [
        "tests.limited",
        "tests.scripted",
    ]
    slots.take("default", "tests.limited")
    assert slots.open_types(["tests.limited", "tests.scripted"]) == ["tests.scripted"]
    assert slots.free() == 1
    slots.release("slow", "tests.slow_queue")
    assert slots.queue_room("slow") == 1
    assert slots.free() == 2


@pytest.mark.django_db(transaction=True)
def test_a_row_locked_by_a_caller_is_skipped_not_waited_for():
    locked, free = job_at(-2), job_at(-1)
    if not connection.features.has_select_for_update_skip_locked:
        assert connection.vendor == "sqlite"
        pytest.skip("SQLite locks the whole database for writes: there is no row lock to skip")
    with row_locked(DelayedJob, locked.pk):
        assert [job.pk for job in claim_due()] == [free.pk]
    assert [job.pk for job in claim_due()] == [locked.pk]
