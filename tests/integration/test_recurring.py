"""Recurring schedules: ticks made into jobs by the pre-loader, one per tick, and misfires."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

import delayjobs
from delayjobs.api.schedules import sync_code_schedules, tick_key
from delayjobs.engine.recurring import materialise_schedules, runs_though_late
from delayjobs.models import DelayedJob, JobStatus, Schedule
from delayjobs.spec.jobtypes import registry

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 26, 8, 0, 0, tzinfo=UTC)


class Ticking(delayjobs.JobType):
    name = "tests.ticking"
    recurrence = delayjobs.Every(seconds=10)

    def execute(self, job: DelayedJob) -> None:
        pass


@pytest.fixture
def ticking() -> Iterator[type[Ticking]]:
    registry.add(Ticking)
    yield Ticking
    registry.remove(Ticking.name)
    Ticking.misfire = "once"
    Ticking.misfire_grace = None


def make(now: datetime, window: float = 60) -> int:
    errors: list[str] = []
    made = materialise_schedules(now, now + timedelta(seconds=window), errors)
    assert errors == []
    return made


def ticks() -> list[datetime]:
    return list(DelayedJob.objects.order_by("run_at").values_list("run_at", flat=True))


def test_each_tick_of_the_window_becomes_one_job(ticking: type[Ticking]) -> None:
    sync_code_schedules()
    Schedule.objects.update(materialised_until=T0)
    assert make(T0) == 5  # :10 ... :50; :00 is the cursor, 60 is the window's end
    assert make(T0) == 0
    assert make(T0 + timedelta(seconds=5)) == 1  # :60 entered the window
    assert make(T0 + timedelta(seconds=10)) == 0  # :70 is its end, not in it
    assert ticks() == [T0 + timedelta(seconds=10 * n) for n in range(1, 7)]
    job = DelayedJob.objects.get(run_at=T0 + timedelta(seconds=10))
    assert job.key == tick_key("tests.ticking", job.run_at)
    assert job.max_lateness == timedelta(seconds=60)


@pytest.mark.parametrize(
    ("misfire", "expected"),
    [
        ("skip", []),
        ("once", [T0 + timedelta(seconds=50)]),
        ("all", [T0 + timedelta(seconds=10 * n) for n in range(1, 6)]),
    ],
)
def test_missed_ticks_follow_the_misfire_policy(
    ticking: type[Ticking], misfire: str, expected: list[datetime]
) -> None:
    ticking.misfire = misfire
    ticking.misfire_grace = timedelta(seconds=5)
    sync_code_schedules()
    Schedule.objects.update(materialised_until=T0)
    now = T0 + timedelta(seconds=60)  # :10 ... :50 missed, :60 within grace
    make(now, window=1)
    assert ticks() == [*expected, T0 + timedelta(seconds=60)]


def test_once_runs_only_the_latest_missed_tick_already_made(ticking: type[Ticking]) -> None:
    ticking.misfire_grace = timedelta(seconds=5)
    sync_code_schedules()
    Schedule.objects.update(materialised_until=T0)
    make(T0)
    jobs = {job.run_at: job for job in DelayedJob.objects.all()}
    for job in jobs.values():
        job.attempts = 1
    later = T0 + timedelta(seconds=57)  # :50 is the latest missed tick (grace 5 s)
    assert [runs_though_late(job, later) for _at, job in sorted(jobs.items())] == [
        False,
        False,
        False,
        False,
        True,
    ]


def test_a_paused_schedule_cancels_its_made_ticks_and_makes_none(ticking: type[Ticking]) -> None:
    sync_code_schedules()
    Schedule.objects.update(materialised_until=T0)
    make(T0)
    delayjobs.pause_schedule("tests.ticking", by="ops")
    assert set(DelayedJob.objects.values_list("status", flat=True)) == {JobStatus.CANCELLED}
    assert make(T0 + timedelta(seconds=100)) == 0
    delayjobs.resume_schedule("tests.ticking")
    assert Schedule.objects.get().enabled
