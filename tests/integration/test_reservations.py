"""Reservations of a limit's room (``delayjobs.transitions.reservations``) on the real
database: when a limited claim reserves, what the others count, and a Hypothesis state
machine where one consumer spends its reservations with the plain claim while another
takes the limited claim, against the limits themselves.

Time is the tests' own: the claim's ``at`` replaces the database's clock and the
consumer's ledger (``ReservedRoom``) reads the same moving clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import delayjobs
from delayjobs import transitions
from delayjobs.api.limits import limit_usage
from delayjobs.core import clock
from delayjobs.engine.reserved import ReservedRoom
from delayjobs.jobtypes import JobType, registry
from delayjobs.models import DelayedJob, JobStatus, LimitReservation, LimitStart
from delayjobs.transitions import Outcome, record_outcomes
from delayjobs.transitions.reservations import ROOM_FACTOR, SLOTS_TTL, SLOTS_USE
from tests.integration.test_limiter import T, token

pytestmark = pytest.mark.django_db

LEASE = timedelta(minutes=5)
CONCURRENCY = 10
RATE = 15
STARTS_RATE = 10
PER = 1.0
#: What the reserving consumer asks for.
WANT = 2
#: The binding limit of the machine's job types: the jobs an example starts with.
LIMIT = 10


class Roomy(JobType):
    """Room enough to reserve in: 10 running, 15 starts a second."""

    name = "tests.reservations.roomy"
    queue = "limits"
    global_concurrency = CONCURRENCY
    rate_limit = delayjobs.Rate(RATE, per=timedelta(seconds=PER))

    def execute(self, job: DelayedJob) -> None:
        return None


class Starts(JobType):
    """The rate binds first: 10 starts a second, 100 running."""

    name = "tests.reservations.starts"
    queue = "limits"
    global_concurrency = 100
    rate_limit = delayjobs.Rate(STARTS_RATE, per=timedelta(seconds=PER))

    def execute(self, job: DelayedJob) -> None:
        return None


class Slots(JobType):
    """A concurrency and no rate."""

    name = "tests.reservations.slots"
    queue = "limits"
    global_concurrency = 100

    def execute(self, job: DelayedJob) -> None:
        return None


KEY = Roomy.name


@pytest.fixture(autouse=True)
def types() -> Iterator[None]:
    for cls in (Roomy, Starts, Slots):
        registry.add(cls)
    yield
    for cls in (Roomy, Starts, Slots):
        registry.remove(cls.name)


def due(job_type: str = Roomy.name) -> DelayedJob:
    return delayjobs.schedule(job_type, run_at=timezone.now() - timedelta(seconds=10))


#: What every claim of these tests shares.
TERMS: dict[str, Any] = {
    "job_types": [Roomy.name, Starts.name, Slots.name],
    "leases": {},
    "default_lease": LEASE,
}


def limited(
    ids: list[int], at: float, *, reserve: int = 0, holder: str = "", worker: str = "w"
) -> transitions.LimitedClaim:
    return transitions.claim_limited(
        ids, worker_id=worker, now=token(), at=at, reserve=reserve, holder=holder, **TERMS
    )


def plain(ids: list[int], keys: list[str], worker: str) -> list[DelayedJob]:
    return transitions.claim(ids, worker_id=worker, now=token(), limit_keys=keys, **TERMS)


def finish(jobs: list[DelayedJob]) -> None:
    now = timezone.now()
    record_outcomes(
        [Outcome(job=job, worker_id=job.worker_id, started_at=now, finished_at=now) for job in jobs]
    )


def test_a_claim_with_plenty_of_room_reserves_and_the_others_count_it() -> None:
    first = due()
    # 9 of 10 slots and 14 of 15 starts left: at least ROOM_FACTOR x 1 of each.
    result = limited([first.pk], at=T, reserve=1, holder="h1")
    reservation = result.reserved[KEY]
    assert (reservation.slots, reservation.starts) == (1, 1)
    row = LimitReservation.objects.get(limit_key=KEY, holder="h1")
    assert (row.slots, row.until) == (1, pytest.approx(T + SLOTS_TTL))
    # The reserved start counts from the end of the time it may be spent.
    stamps = sorted(LimitStart.objects.filter(limit_key=KEY).values_list("started", "count"))
    assert stamps == [(pytest.approx(T), 1), (pytest.approx(T + reservation.starts_for), 1)]
    # Another consumer: 1 running and 1 reserved of 10 slots, 2 of 15 starts.
    others = [due() for _ in range(20)]
    second = limited([job.pk for job in others], at=T + 0.01, worker="other")
    assert len(second.jobs) == CONCURRENCY - 1 - 1
    assert second.reserved == {}


def test_no_reservation_near_the_limit_or_where_a_job_was_held() -> None:
    # 10 slots: after one claimed, 9 left, fewer than ROOM_FACTOR x 4.
    assert limited([due().pk], at=T, reserve=4, holder="h").reserved == {}
    assert not LimitReservation.objects.exists()
    finish(list(DelayedJob.objects.filter(status=JobStatus.RUNNING)))
    # Held: the rate's starts are spent.
    jobs = [due() for _ in range(RATE + 1)]
    for job in jobs[:RATE]:
        finish(limited([job.pk], at=T + 0.1).jobs)
    result = limited([jobs[RATE].pk], at=T + 0.2, reserve=1, holder="h")
    assert result.held and result.reserved == {}


def test_a_reservation_counts_until_it_ends_and_its_holder_may_replace_it() -> None:
    limited([due(Slots.name).pk], at=T, reserve=10, holder="h")
    assert limited([due(Slots.name).pk], at=T + 1, reserve=10, holder="h").reserved
    assert LimitReservation.objects.get(holder="h").until == pytest.approx(T + 1 + SLOTS_TTL)
    blockers = [due(Slots.name) for _ in range(100)]
    # 2 running, 10 reserved: 88 of 100 left while it lives, 98 once it has ended.
    assert len(limited([j.pk for j in blockers], at=T + 1 + SLOTS_TTL - 0.01).jobs) == 88
    assert len(limited([j.pk for j in blockers], at=T + 1 + SLOTS_TTL + 0.01).jobs) == 10
    transitions.drop_reservations("h")
    assert not LimitReservation.objects.exists()


def test_the_usage_shows_reserved_slots_beside_the_running_ones() -> None:
    limited([due(Slots.name).pk], at=time.time(), reserve=10, holder="h")
    (usage,) = [u for u in limit_usage(timezone.now()) if u.group == Slots.name]
    assert (usage.running, usage.reserved, usage.shown_running) == (
        1,
        10,
        "1 + 10 reserved / 100",
    )


def test_the_plain_claim_of_reserved_keys_takes_only_their_rows() -> None:
    roomy, slots = due(), due(Slots.name)
    won = plain([roomy.pk, slots.pk], [Slots.name], worker="w")
    assert [job.pk for job in won] == [slots.pk]


class ReservingMachine(RuleBasedStateMachine):
    """Consumer "r" reserves and spends its reservations as a consumer does
    (``ReservedRoom``); consumer "o" takes the limited claim alone. Whatever they do, the
    running rows never exceed the concurrency, and the jobs started in any window of the
    rate never exceed its count. A subclass names the job type, whose limits it checks."""

    job_type: type[JobType] = Roomy

    @initialize()
    def start(self) -> None:
        DelayedJob.objects.all().delete()
        LimitStart.objects.all().delete()
        LimitReservation.objects.all().delete()
        self.at = T
        self.room = ReservedRoom(want=WANT, clock=lambda: self.at)
        self.waiting: list[int] = []
        self.running: dict[int, DelayedJob] = {}
        self.starts: list[float] = []
        self.reserved_claims = 0
        # Every example starts with a reservation held (the room is all free) and a limit's
        # worth of jobs waiting, so that even the short examples Hypothesis favours (the only
        # ones, once CI derandomizes it) take the reserved path next to a full limit.
        self.schedule(LIMIT + WANT)
        self.reserving_consumer_claims(1)
        assert self.room.keys_for(1) == [self.job_type.name]

    @rule(count=st.integers(1, 8))
    def schedule(self, count: int) -> None:
        self.waiting += [due(self.job_type.name).pk for _ in range(count)]

    def _took(self, jobs: list[DelayedJob]) -> None:
        taken = {job.pk for job in jobs}
        self.waiting = [pk for pk in self.waiting if pk not in taken]
        self.running.update({job.pk: job for job in jobs})
        self.starts += [self.at] * len(jobs)

    @precondition(lambda self: self.waiting)
    @rule(count=st.integers(1, WANT))
    def reserving_consumer_claims(self, count: int) -> None:
        ids = self.waiting[:count]
        if keys := self.room.keys_for(len(ids)):
            jobs = plain(ids, keys, worker="r")
            self.room.spend(jobs)
            self.reserved_claims += bool(jobs)
        else:
            since = self.room.now()
            result = limited(ids, at=self.at, reserve=WANT, holder=self.room.holder, worker="r")
            self.room.add(result.reserved, since=since)
            jobs = result.jobs
        self._took(jobs)

    @precondition(lambda self: self.waiting)
    @rule(count=st.integers(1, LIMIT))
    def other_consumer_claims(self, count: int) -> None:
        self._took(limited(self.waiting[:count], at=self.at, worker="o").jobs)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish_one(self, data: st.DataObject) -> None:
        job = self.running.pop(data.draw(st.sampled_from(sorted(self.running))))
        finish([job])
        self.room.finished([job])

    @rule(seconds=st.sampled_from([0.01, 0.05, 0.3, 1.0, SLOTS_USE]))
    def advance(self, seconds: float) -> None:
        self.at += seconds

    @invariant()
    def the_limits_hold(self) -> None:
        if not hasattr(self, "room"):
            return
        concurrency = self.job_type.global_concurrency
        rate = self.job_type.rate_limit
        assert concurrency is not None and rate is not None
        running = DelayedJob.objects.filter(limit_key=self.job_type.name, status=JobStatus.RUNNING)
        assert running.count() == len(self.running) <= concurrency
        per = rate.per.total_seconds()
        for i, start in enumerate(self.starts):
            assert len([s for s in self.starts[i:] if s < start + per]) <= rate.count

    def teardown(self) -> None:
        # Not an assertion of every example: that the machine reached the reserved path.
        reached.append(getattr(self, "reserved_claims", 0))


reached: list[int] = []


class StartsBindMachine(ReservingMachine):
    job_type = Starts


@pytest.mark.parametrize(
    "machine",
    [ReservingMachine, StartsBindMachine],
    ids=["concurrency binds", "rate binds"],
)
def test_reserved_and_limited_claims_together_never_exceed_the_limits(
    machine: type[ReservingMachine],
) -> None:
    # Room for a reservation to happen.
    assert ROOM_FACTOR * WANT < LIMIT == min(CONCURRENCY, STARTS_RATE)
    reached.clear()
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=30,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
    assert sum(reached) > 0, "no example claimed under a reservation"


class Ample(JobType):
    """Limits far above any load: a consumer's claims reserve in it."""

    name = "tests.reservations.ample"
    queue = "limits"
    global_concurrency = 100_000
    rate_limit = delayjobs.Rate(100_000, per=timedelta(seconds=1))

    def execute(self, job: DelayedJob) -> None:
        return None


def test_a_consumer_claims_from_its_reservation_and_returns_every_job_it_started() -> None:
    from delayjobs.engine.consumer import Consumer
    from delayjobs.engine.limited import claim_limited

    registry.add(Ample)
    try:
        consumer = Consumer(queues=["limits"], concurrency=2, preload=False)
        clock.shared.sync()  # as a consumer does before its first claim
        claims = consumer.fetch_database.claims
        started: list[DelayedJob] = []
        claims.start = started.extend  # type: ignore[method-assign]  # run nothing here
        jobs = [due(Ample.name) for _ in range(3)]
        first, held = claim_limited(claims, [jobs[0].pk], park=False)
        assert claims.reserved.keys_for(2) == [Ample.name] and not held
        rest, held = claim_limited(claims, [jobs[1].pk, jobs[2].pk], park=False)
        assert [job.pk for job in first + rest] == [job.pk for job in started]
        assert sorted(job.pk for job in rest) == [jobs[1].pk, jobs[2].pk] and not held
        assert [job.limit_wait for job in rest] == [timedelta(0)] * 2
    finally:
        registry.remove(Ample.name)
