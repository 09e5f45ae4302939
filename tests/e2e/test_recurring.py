"""End to end: recurring schedules run by real ``run_delay_consumer`` processes, each with
its pre-loader in-process (PRELOAD_INTERVAL 1 s, PRELOAD_WINDOW 5 s in tests/settings.py).

No beat process: every consumer's pre-loader makes the ticks' jobs, and the schedule's
cursor keeps it to one job per tick. The schedules here are operators' (``source =
database``) of ``tests.scripted``, which writes an ``Execution`` row each time it runs: the
ledger compared against the ticks. Every wait is for an event (rows in the database, a
process's exit, the clock passing a moment); no timing threshold is asserted beyond "not
early" and "not missed".
"""

from __future__ import annotations

import signal
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from django.db import connection

from delayjobs.conf import settings
from delayjobs.core import clock
from delayjobs.models import DelayedJob, JobAttempt, JobStatus, Schedule
from delayjobs.recurring.definitions import tick_key
from delayjobs.recurring.rules import Every
from tests.conftest import ConsumerFactory, ConsumerProcess
from tests.consumers import ACTIVE, check_alive
from tests.models import Execution
from tests.utils import wait_for

pytestmark = [pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

SCRIPTED = "tests.scripted"


def make_schedule(name: str, interval: timedelta, **fields: object) -> Schedule:
    """An operator's schedule of ``tests.scripted``, ticking from now on."""
    return Schedule.objects.create(
        name=name,
        source="database",
        job_type=SCRIPTED,
        interval=interval,
        materialised_until=clock.now(),
        **fields,
    )


def start_fleet(consumer_process: ConsumerFactory, *names: str) -> list[ConsumerProcess]:
    return [consumer_process("--concurrency", "4", "--worker-id", name) for name in names]


def stop_fleet(consumers: Sequence[ConsumerProcess]) -> None:
    """SIGTERM each (they finish what runs, then exit) and wait for every exit."""
    for consumer in consumers:
        consumer.send_signal(signal.SIGTERM)
    for consumer in consumers:
        assert consumer.wait(timeout=60) == 0, consumer.output()


def schedule_jobs(name: str) -> list[DelayedJob]:
    return list(DelayedJob.objects.filter(key__startswith=f"schedule:{name}@").order_by("run_at"))


def executions_by_job() -> dict[int, list[Execution]]:
    ran: dict[int, list[Execution]] = {}
    for execution in Execution.objects.order_by("started_at"):
        ran.setdefault(execution.job_id, []).append(execution)
    return ran


def first_attempts(jobs: Sequence[DelayedJob]) -> dict[int, JobAttempt]:
    """Each job's first attempt row (where and when it started, how late)."""
    rows = JobAttempt.objects.filter(job__in=list(jobs), number=1)
    return {attempt.job_id: attempt for attempt in rows}


def assert_each_tick_once_and_none_early(name: str, interval: timedelta) -> list[DelayedJob]:
    """Of all the schedule's jobs: each holds its own tick's key, on the schedule's grid;
    no tick has two jobs, none ran twice or before its tick. Returns the jobs, in order."""
    jobs = schedule_jobs(name)
    grid = Every(seconds=interval.total_seconds())
    for job in jobs:
        assert job.key == tick_key(name, job.run_at)
        assert grid.last_at_or_before(job.run_at) == job.run_at, f"{job.run_at} is off the grid"
    doubled = {at: n for at, n in Counter(job.run_at for job in jobs).items() if n > 1}
    assert doubled == {}, f"ticks with more than one job: {doubled}"
    by_job = executions_by_job()
    twice = {job.run_at: len(by_job[job.pk]) for job in jobs if len(by_job.get(job.pk, [])) > 1}
    assert twice == {}, f"ticks that ran more than once: {twice}"
    attempts = first_attempts(jobs)
    for job in jobs:
        for execution in by_job.get(job.pk, []):
            assert execution.started_at >= job.run_at, f"tick {job.run_at} ran early"
        if job.pk in attempts:
            assert attempts[job.pk].started_at >= job.run_at, f"tick {job.run_at} began early"
    return jobs


def lateness_summary(latenesses: Sequence[timedelta]) -> str:
    seconds = sorted(late.total_seconds() for late in latenesses)
    p99 = seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))]
    median = seconds[len(seconds) // 2]
    return (
        f"lateness over {len(seconds)} ticks: median {median * 1000:.2f} ms, "
        f"p99 {p99 * 1000:.2f} ms, max {seconds[-1] * 1000:.2f} ms"
    )


# A minute of ticks, two consumers ----------------------------------------------------------


def test_two_consumers_run_each_tick_of_a_minute_exactly_once(
    consumer_process: ConsumerFactory,
) -> None:
    if connection.vendor == "sqlite":
        # A minute of wall time, spent once: the cursor that makes one job per tick is
        # tested on SQLite in tests/integration/test_recurring.py (concurrent pre-loaders),
        # and the fleet restart below runs two consumers on it.
        pytest.skip("a minute of ticks runs on PostgreSQL; SQLite has the restart test")
    consumers = start_fleet(consumer_process, "consumer-a", "consumer-b")
    interval = timedelta(seconds=1)
    schedule = make_schedule("e2e.every-second", interval)
    assert schedule.materialised_until is not None
    # The first tick comes part of a second after the schedule: the next is the first
    # whose whole second it existed. From there, sixty.
    first = Every(seconds=1).next_after(schedule.materialised_until) + interval
    minute = [first + n * interval for n in range(60)]
    keys = {tick_key(schedule.name, tick): tick for tick in minute}

    def minute_done() -> bool:
        check_alive(consumers)
        ended = DelayedJob.objects.filter(key__in=list(keys)).exclude(status__in=ACTIVE)
        return ended.count() >= len(keys)

    try:
        wait_for(minute_done, timeout=180, interval=0.25)
    except AssertionError:
        left = Counter(
            DelayedJob.objects.filter(key__in=list(keys)).values_list("status", flat=True)
        )
        logs = "\n".join(consumer.output()[-3000:] for consumer in consumers)
        raise AssertionError(f"the minute's ticks did not all end: {dict(left)}\n{logs}") from None
    stop_fleet(consumers)

    jobs = assert_each_tick_once_and_none_early(schedule.name, interval)
    in_minute = [job for job in jobs if job.key in keys]
    assert sorted(job.run_at for job in in_minute) == minute, "a tick of the minute has no job"
    by_job = executions_by_job()
    attempts = first_attempts(in_minute)
    lateness = [attempts[job.pk].lateness for job in in_minute if job.pk in attempts]
    summary = lateness_summary(lateness) if lateness else "no attempt recorded"
    sys.stdout.write(f"two consumers, one schedule at 1 s: {summary}\n")  # pytest -s shows it
    grace = settings.MISFIRE_GRACE
    for job in in_minute:
        assert job.status == JobStatus.SUCCEEDED, f"tick {job.run_at}: {job.status}; {summary}"
        assert job.attempts == 1, f"tick {job.run_at}: {job.attempts} attempts; {summary}"
        assert len(by_job.get(job.pk, [])) == 1, f"tick {job.run_at} did not run once; {summary}"
        assert job.pk in attempts, f"tick {job.run_at} has no attempt row; {summary}"
        assert attempts[job.pk].lateness < grace, f"tick {job.run_at} was missed; {summary}"
    workers = {attempts[job.pk].worker_id for job in in_minute}
    assert workers <= {"consumer-a", "consumer-b"}, workers


# A fleet stopped, then started again --------------------------------------------------------

INTERVAL = timedelta(seconds=2)
GRACE = timedelta(seconds=1.5)
GRID = Every(seconds=INTERVAL.total_seconds())


def wait_ran(name: str, count: int, consumers: Sequence[ConsumerProcess]) -> None:
    def ran() -> bool:
        check_alive(consumers)
        jobs = DelayedJob.objects.filter(key__startswith=f"schedule:{name}@")
        return Execution.objects.filter(job_id__in=jobs.values("pk")).count() >= count

    wait_for(ran, timeout=60, interval=0.1, message=f"{count} ticks of {name} never ran")


def wait_ended_through(name: str, tick: datetime, consumers: Sequence[ConsumerProcess]) -> None:
    """Wait until the job of ``tick`` exists and it and every earlier one have ended."""
    key = tick_key(name, tick)

    def ended() -> bool:
        check_alive(consumers)
        jobs = DelayedJob.objects.filter(key__startswith=f"schedule:{name}@", run_at__lte=tick)
        return jobs.filter(key=key).exists() and not jobs.filter(status__in=ACTIVE).exists()

    try:
        wait_for(ended, timeout=90, interval=0.1)
    except AssertionError:
        jobs = DelayedJob.objects.filter(key__startswith=f"schedule:{name}@", run_at__lte=tick)
        left = jobs.filter(status__in=ACTIVE).values_list("pk", "run_at", "status", "attempts")
        logs = "\n".join(consumer.output()[-3000:] for consumer in consumers)
        raise AssertionError(
            f"the ticks through {tick} did not all end (now {clock.now()}; not ended: "
            f"{list(left)})\n{logs}"
        ) from None


@dataclass(frozen=True)
class BeforeTheStop:
    """What one schedule had done when the fleet went down."""

    ran: list[datetime]  # ticks whose job ran
    cursor: datetime  # the ticks up to here had their jobs made


def before_the_stop(schedule: Schedule) -> BeforeTheStop:
    ran = [
        job.run_at
        for job in schedule_jobs(schedule.name)
        if Execution.objects.filter(job_id=job.pk).exists()
    ]
    schedule.refresh_from_db()
    assert schedule.materialised_until is not None and schedule.materialised_until > max(ran)
    return BeforeTheStop(ran=ran, cursor=schedule.materialised_until)


POLICIES = ("skip", "once", "all")


def test_a_fleet_stopped_and_started_again_applies_each_misfire_policy(
    consumer_process: ConsumerFactory,
) -> None:
    """One schedule per policy, one fleet: stopped, down past several ticks and the grace,
    started again. The three share the stop and the restart (a third of the wall time)."""
    schedules = {
        misfire: make_schedule(
            f"e2e.restart-{misfire}", INTERVAL, misfire=misfire, misfire_grace=GRACE
        )
        for misfire in POLICIES
    }

    # Up: a few ticks of each run.
    fleet = start_fleet(consumer_process, "first-a", "first-b")
    for schedule in schedules.values():
        wait_ran(schedule.name, 3, fleet)
    stop_fleet(fleet)

    # Down. The jobs of the ticks up to each cursor were made before it went down (the
    # window); the ticks after it will have none when it comes back. Down long enough
    # that ticks of both kinds are missed by more than the grace.
    before = {misfire: before_the_stop(schedule) for misfire, schedule in schedules.items()}
    back_at = max(b.cursor for b in before.values()) + 3 * INTERVAL + GRACE + timedelta(seconds=0.5)
    wait_for(lambda: clock.now() >= back_at, timeout=60, message="the clock stood still")
    restart = clock.now()

    # Up again, until the ticks some seconds after the restart have run.
    fleet = start_fleet(consumer_process, "second-a", "second-b")
    after = GRID.next_after(restart + timedelta(seconds=6))
    for schedule in schedules.values():
        wait_ended_through(schedule.name, after, fleet)
    stop_fleet(fleet)

    for misfire, schedule in schedules.items():
        check_misfire_policy(misfire, schedule.name, before[misfire], restart, after)


def check_misfire_policy(
    misfire: str, name: str, before: BeforeTheStop, restart: datetime, after: datetime
) -> None:
    grid = GRID
    ran_before, cursor = before.ran, before.cursor
    last_ran = max(ran_before)
    missed = grid.ticks_between(last_ran, restart - GRACE, 100)
    made_before = [tick for tick in missed if tick <= cursor]
    never_made = [tick for tick in missed if tick > cursor]
    assert made_before and len(never_made) >= 3, (misfire, made_before, never_made)

    jobs = assert_each_tick_once_and_none_early(name, INTERVAL)
    by_tick = {job.run_at: job for job in jobs}
    ran = {job.run_at for job in jobs if Execution.objects.filter(job_id=job.pk).exists()}
    attempts = first_attempts(jobs)
    lateness = {job.run_at: attempts[job.pk].lateness for job in jobs if job.pk in attempts}
    statuses = {tick: by_tick[tick].status if tick in by_tick else None for tick in missed}
    context = f"{misfire}: missed {missed}, cursor {cursor}, restart {restart}: {statuses}"

    if misfire == "skip":
        # None of the missed ticks runs: those made before are expired, the others never made.
        assert not ran & set(missed), context
        for tick in made_before:
            assert by_tick[tick].status == JobStatus.EXPIRED, context
        assert not set(never_made) & set(by_tick), context
        # What did run, ran within the grace.
        for tick in ran:
            assert lateness[tick] <= GRACE, f"{tick} ran {lateness[tick]} late under skip"
    elif misfire == "once":
        # The made-before ones are not the latest missed: expired. Of the never-made ones,
        # the pre-loader's first pass back makes the latest only.
        for tick in made_before:
            assert by_tick[tick].status == JobStatus.EXPIRED, context
        assert len(set(never_made) & set(by_tick)) <= 1, context
        # The ticks missed when that pass ran (it made the first jobs after the restart):
        # of them, the latest alone runs, late, as the one catch-up. Unless its turn came
        # only once the next tick was past the grace too: then that one is the latest
        # missed, and runs in its place (late: a catch-up all the same).
        first_pass = min(job.created_at for job in jobs if job.created_at >= restart)
        missed_then = grid.ticks_between(last_ran, first_pass - GRACE, 100)
        latest = missed_then[-1]
        caught_up = sorted(ran & set(missed_then))
        context += f"; first pass back {first_pass}, ran {sorted(ran)}"
        if latest in ran:
            assert caught_up == [latest], f"not one catch-up: {caught_up}; {context}"
            assert lateness[latest] > GRACE, context
        else:
            assert caught_up == [], f"catch-ups {caught_up}; {context}"
            assert by_tick[latest].status == JobStatus.EXPIRED, context
            instead = min(tick for tick in ran if tick > latest)
            assert lateness[instead] > GRACE, f"no catch-up ran; {context}"
            for tick in grid.ticks_between(latest, instead, 100):
                assert by_tick[tick].status == JobStatus.EXPIRED, context
    else:
        # Every tick runs, the missed ones late, each once: none is missing from the first
        # to the last.
        expected = grid.ticks_between(min(ran_before) - INTERVAL, after + INTERVAL, 1000)
        assert sorted(tick for tick in ran if tick <= after) == expected, context
        for tick in missed:
            assert by_tick[tick].status == JobStatus.SUCCEEDED, context
            assert lateness[tick] > GRACE, context
