"""Recurring schedules: ticks made into jobs by the pre-loader, one per tick, and misfires.

In-process, on the test database and the real Redis. ``materialise_schedules`` is the
pre-loader's step: these tests call it with the ``now`` a pass would have, stepping it
through days (DST) or running it from several threads with skewed clocks (hosts). What a
consumer decides of a late tick is tested through a real claim, execution and record.
Pause, resume and a deploy's restart read the shared clock (the database's now): those
tests run at the real time.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

import pytest
from django.db import connections

import delayjobs
from delayjobs import transitions
from delayjobs.core import clock
from delayjobs.engine.execution import run_claimed
from delayjobs.exceptions import InvalidJob
from delayjobs.jobtypes import registry
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus, Schedule
from delayjobs.recurring.definitions import (
    next_ticks,
    recent_jobs,
    restart_ticks,
    sync_code_schedules,
    tick_key,
)
from delayjobs.recurring.rules import Cron, Every
from delayjobs.recurring.ticks import TICKS_PER_PASS, materialise_schedules, runs_though_late
from delayjobs.transitions import Outcome
from tests.models import Execution
from tests.utils import wait_for

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 26, 8, 0, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)
SCRIPTED = "tests.scripted"


class Ticking(delayjobs.JobType):
    name = "tests.ticking"
    recurrence = delayjobs.Every(seconds=10)

    def execute(self, job: DelayedJob) -> None:
        pass


class Nightly(delayjobs.JobType):
    """A daily job at 02:30 in Berlin: a time the spring-forward skips and the fall-back
    repeats."""

    name = "tests.nightly"
    recurrence = delayjobs.Cron("30 2 * * *", tz="Europe/Berlin")

    def execute(self, job: DelayedJob) -> None:
        pass


@pytest.fixture
def ticking() -> Iterator[type[Ticking]]:
    registry.add(Ticking)
    yield Ticking
    registry.remove(Ticking.name)
    Ticking.recurrence = delayjobs.Every(seconds=10)
    Ticking.misfire = "once"
    Ticking.misfire_grace = None


@pytest.fixture
def nightly() -> Iterator[type[Nightly]]:
    registry.add(Nightly)
    yield Nightly
    registry.remove(Nightly.name)


def make(now: datetime, window: float = 60) -> int:
    errors: list[str] = []
    made = materialise_schedules(now, now + timedelta(seconds=window), errors)
    assert errors == []
    return made


def ticks() -> list[datetime]:
    return list(DelayedJob.objects.order_by("run_at").values_list("run_at", flat=True))


def assert_one_job_per_tick(name: str) -> list[datetime]:
    """Every job of ``name`` holds its tick's key, and no tick has two; the ticks, in order."""
    jobs = list(DelayedJob.objects.filter(key__startswith=f"schedule:{name}@"))
    for job in jobs:
        assert job.key == tick_key(name, job.run_at)
    doubled = {at: n for at, n in Counter(job.run_at for job in jobs).items() if n > 1}
    assert doubled == {}, f"ticks with more than one job: {doubled}"
    return sorted(job.run_at for job in jobs)


def database_schedule(name: str = "db.every-2s", **fields: object) -> Schedule:
    """An operator's schedule of ``tests.scripted`` (``source = database``)."""
    defaults: dict[str, object] = {
        "source": "database",
        "job_type": SCRIPTED,
        "interval": timedelta(seconds=2),
        "materialised_until": T0,
    }
    return Schedule.objects.create(name=name, **{**defaults, **fields})


def run_due() -> list[Outcome]:
    """What a consumer does with the due jobs, one at a time in due order: claim, execute,
    record. Real time: whether a job is too late is decided at the shared clock's now."""
    outcomes = []
    due = DelayedJob.objects.filter(status=JobStatus.SCHEDULED, run_at__lte=clock.now())
    for pk in due.order_by("run_at", "id").values_list("pk", flat=True):
        for row in transitions.claim(
            [pk],
            worker_id="worker-a",
            now=clock.now(),
            job_types=registry.names(),
            leases={},
            default_lease=timedelta(minutes=1),
        ):
            outcome = run_claimed(row, "worker-a")
            transitions.record_outcomes([outcome])
            outcomes.append(outcome)
    return outcomes


# One job per tick --------------------------------------------------------------------------


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


def test_a_database_schedule_with_an_interval_ticks_like_a_code_one() -> None:
    database_schedule(payload={"from": "the admin"}, misfire="all")
    assert make(T0, window=10) == 4
    jobs = list(DelayedJob.objects.order_by("run_at"))
    assert [job.run_at for job in jobs] == [T0 + 2 * n * SECOND for n in range(1, 5)]
    for job in jobs:
        assert (job.job_type, job.payload, job.queue) == (
            SCRIPTED,
            {"from": "the admin"},
            "default",
        )
        assert job.key == tick_key("db.every-2s", job.run_at)
        assert job.max_lateness is None  # misfire="all": late ticks run, however late
    assert Schedule.objects.get().materialised_until == T0 + 8 * SECOND
    assert make(T0, window=10) == 0  # T0 + 10 is the window's end, not in it
    assert make(T0 + SECOND, window=10) == 1
    assert make(T0 + 2 * SECOND, window=10) == 0  # T0 + 12 is the end now
    assert assert_one_job_per_tick("db.every-2s") == ticks()


def test_a_database_schedule_without_a_cursor_starts_at_the_pass() -> None:
    database_schedule(materialised_until=None)
    assert make(T0 + 0.5 * SECOND, window=3) == 1  # T0 + 2 only: T0 is before the pass
    assert ticks() == [T0 + 2 * SECOND]


def test_schedules_that_cannot_tick_are_reported_and_make_nothing(ticking: type[Ticking]) -> None:
    database_schedule("db.unknown-type", job_type="tests.nope")
    database_schedule("db.bad-cron", interval=None, cron="61 * * * *")
    database_schedule("db.bad-zone", interval=None, cron="0 8 * * *", timezone="Mars/Base")
    database_schedule("db.paused", enabled=False)
    database_schedule("tests.ticking", enabled=False)  # the code's name, taken in the admin
    errors: list[str] = []
    assert materialise_schedules(T0, T0 + timedelta(minutes=1), errors) == 0
    assert sorted(errors) == sorted(
        [
            "Job type 'tests.ticking' has a recurrence, but the schedule named 'tests.ticking' "
            "was made in the admin; rename or delete that one so the code's can tick.",
            "schedule db.unknown-type: Unknown job type 'tests.nope' (not registered in this "
            "process).",
            "schedule db.bad-cron: '61 * * * *' is not a valid cron expression: Bad minute.",
            "schedule db.bad-zone: Unknown time zone 'Mars/Base': use an IANA name such as "
            "'Europe/Berlin'.",
        ]
    )
    assert not DelayedJob.objects.exists()
    # tests.ticking's own row is the admin's: the code did not take it over.
    assert Schedule.objects.get(name="tests.ticking").source == "database"


# Daylight saving time --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "last", "change", "expected"),
    [
        # Spring forward: 02:30 does not exist; it runs at 03:00 CEST (01:00 UTC).
        (date(2026, 3, 26), date(2026, 4, 1), date(2026, 3, 29), datetime(2026, 3, 29, 1, 0)),
        # Fall back: 02:30 comes twice; it runs the first time, CEST (00:30 UTC).
        (date(2026, 10, 22), date(2026, 10, 28), date(2026, 10, 25), datetime(2026, 10, 25, 0, 30)),
    ],
)
def test_a_0230_berlin_job_is_made_once_a_day_through_a_dst_change(
    nightly: type[Nightly], first: date, last: date, change: date, expected: datetime
) -> None:
    berlin = Cron("30 2 * * *", tz="Europe/Berlin").zone
    start = datetime(first.year, first.month, first.day, tzinfo=berlin).astimezone(UTC)
    sync_code_schedules()
    Schedule.objects.update(materialised_until=start)
    # Passes every 20 minutes with an hour's window: each tick is made before it is due.
    now = start
    while now.astimezone(berlin).date() <= last:
        make(now, window=3600)
        now += timedelta(minutes=20)
    made = assert_one_job_per_tick("tests.nightly")
    days = [tick.astimezone(berlin).date() for tick in made]
    assert days == [first + timedelta(days=n) for n in range((last - first).days + 1)]
    [on_the_day] = [tick for tick in made if tick.astimezone(berlin).date() == change]
    assert on_the_day == expected.replace(tzinfo=UTC)
    for tick in made:
        assert tick.astimezone(berlin).strftime("%H:%M") in {"02:30", "03:00"}


def test_a_cursor_in_the_repeated_hour_does_not_make_the_first_pass_tick_again(
    nightly: type[Nightly],
) -> None:
    """A schedule made, resumed or restarted at 02:10 CET on the fall-back night, after
    02:30 CEST ran: its cursor is then. cronsim, asked from there, gave 02:30 CEST as the
    next tick: the pass made nothing and stayed there, and a day later made that tick's
    job again (it ran twice) along with the next day's."""
    sync_code_schedules()
    Schedule.objects.update(materialised_until=datetime(2026, 10, 25, 1, 10, tzinfo=UTC))
    now = datetime(2026, 10, 25, 1, 10, tzinfo=UTC)
    while now < datetime(2026, 10, 27, 3, tzinfo=UTC):
        make(now, window=3600)
        now += timedelta(minutes=20)
    assert assert_one_job_per_tick("tests.nightly") == [
        datetime(2026, 10, 26, 1, 30, tzinfo=UTC),
        datetime(2026, 10, 27, 1, 30, tzinfo=UTC),
    ]


# Several pre-loaders at once --------------------------------------------------------------


def preload_from_threads(offsets: list[float], passes: int, step: float, window: float) -> int:
    """Run ``passes`` passes in each of ``len(offsets)`` threads, all at once: thread ``i``
    at ``T0 + n * step + offsets[i]`` (a host whose clock is that far off). Then one more
    pass, alone, as far ahead as the furthest: a pass that found a row held by another
    skipped it (SKIP LOCKED), and the next one makes what it left. Returns the ticks the
    threads made."""
    start = threading.Barrier(len(offsets))
    errors: list[str] = []
    failures: list[BaseException] = []
    made: list[int] = []

    def host(offset: float) -> None:
        try:
            start.wait(timeout=30)
            for n in range(passes):
                now = T0 + timedelta(seconds=n * step + offset)
                made.append(materialise_schedules(now, now + timedelta(seconds=window), errors))
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=host, args=(offset,)) for offset in offsets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a pre-loader thread hung"
    assert failures == []
    assert errors == []
    last = T0 + timedelta(seconds=(passes - 1) * step + max(offsets))
    make(last, window)
    return sum(made)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "offsets",
    [[0, 0, 0, 0], [0, 2, -2, 1.3], [-2, -1.5, 0.25, 2]],
    ids=["same clock", "skewed clocks", "more skew"],
)
@pytest.mark.parametrize("misfire", ["skip", "once", "all"])
def test_pre_loaders_on_several_hosts_make_each_tick_once(
    ticking: type[Ticking], offsets: list[float], misfire: str
) -> None:
    ticking.recurrence = delayjobs.Every(seconds=1)
    ticking.misfire = misfire
    sync_code_schedules()
    Schedule.objects.update(materialised_until=T0)
    passes, step, window = 30, 0.5, 5.0
    made = preload_from_threads(offsets, passes, step, window)
    # The furthest window reached: the last pass of the host furthest ahead.
    reach = T0 + timedelta(seconds=(passes - 1) * step + max(offsets) + window)
    expected = Every(seconds=1).ticks_between(T0, reach, 1000)
    assert assert_one_job_per_tick("tests.ticking") == expected
    assert made > len(expected) / 2  # most made while the hosts raced, not after
    assert Schedule.objects.get().materialised_until == expected[-1]
    assert set(DelayedJob.objects.values_list("status", flat=True)) == {JobStatus.SCHEDULED}


@pytest.mark.django_db(transaction=True)
def test_pre_loaders_of_many_schedules_at_once(ticking: type[Ticking]) -> None:
    """Threads racing over several schedules: each schedule's ticks once, none lost."""
    ticking.recurrence = delayjobs.Every(seconds=1)
    sync_code_schedules()
    Schedule.objects.update(materialised_until=T0)
    for n in range(4):
        database_schedule(f"db.s{n}", interval=timedelta(seconds=n + 1), misfire="all")
    preload_from_threads([0, 1, -1], passes=20, step=0.5, window=5)
    reach = T0 + timedelta(seconds=19 * 0.5 + 1 + 5)
    assert assert_one_job_per_tick("tests.ticking") == Every(seconds=1).ticks_between(
        T0, reach, 1000
    )
    for n in range(4):
        assert assert_one_job_per_tick(f"db.s{n}") == Every(seconds=n + 1).ticks_between(
            T0, reach, 1000
        )


# Misfires: ticks never made into jobs (the pre-loader was down) ---------------------------


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


def test_a_tick_exactly_at_the_grace_is_not_missed(ticking: type[Ticking]) -> None:
    ticking.misfire = "skip"
    ticking.misfire_grace = timedelta(seconds=10)
    sync_code_schedules()
    Schedule.objects.update(materialised_until=T0)
    make(T0 + timedelta(seconds=20), window=1)  # :10 is exactly 10 s late: still on time
    assert ticks() == [T0 + timedelta(seconds=10), T0 + timedelta(seconds=20)]


@pytest.mark.parametrize(
    ("misfire", "passes"),
    [
        # 2,500 s down, a tick a second, a grace of 60 s and a 5 s window.
        ("skip", [65]),  # T0-60 ... T0+4: those still within the grace
        ("once", [66]),  # and T0-61, the latest missed
        ("all", [1000, 1000, 504]),  # every one since T0-2499, 1000 per pass
    ],
)
def test_a_long_downtime_under_each_policy(
    ticking: type[Ticking], misfire: str, passes: list[int]
) -> None:
    ticking.recurrence = delayjobs.Every(seconds=1)
    ticking.misfire = misfire
    sync_code_schedules()
    Schedule.objects.update(materialised_until=T0 - timedelta(seconds=2500))
    made = [make(T0, window=5) for _ in passes]
    assert made == passes
    assert make(T0, window=5) == 0  # caught up
    first = {"skip": -60, "once": -61, "all": -2499}[misfire]
    expected = [T0 + n * SECOND for n in range(first, 5)]
    assert assert_one_job_per_tick("tests.ticking") == expected
    assert max(passes) <= TICKS_PER_PASS
    lateness = set(DelayedJob.objects.values_list("max_lateness", flat=True))
    assert lateness == ({None} if misfire == "all" else {timedelta(seconds=60)})


def test_all_continues_from_its_cursor_when_the_clock_moves_meanwhile(
    ticking: type[Ticking],
) -> None:
    ticking.recurrence = delayjobs.Every(seconds=1)
    ticking.misfire = "all"
    sync_code_schedules()
    Schedule.objects.update(materialised_until=T0 - timedelta(seconds=1500))
    assert make(T0, window=5) == 1000
    assert make(T0 + timedelta(seconds=30), window=5) == 534  # T0-499 ... T0+34
    assert assert_one_job_per_tick("tests.ticking") == [T0 + n * SECOND for n in range(-1499, 35)]


# Misfires: ticks made before the fleet went down, decided by the consumer ---------------


def test_once_runs_only_the_latest_missed_tick_already_made(ticking: type[Ticking]) -> None:
    ticking.misfire_grace = timedelta(seconds=5)
    sync_code_schedules()
    Schedule.objects.update(materialised_until=T0)
    make(T0)
    jobtype = registry.get(Ticking.name)
    jobs = {job.run_at: job for job in DelayedJob.objects.all()}
    for job in jobs.values():
        job.attempts = 1
    later = T0 + timedelta(seconds=57)  # :50 is the latest missed tick (grace 5 s)
    assert [runs_though_late(job, jobtype, later) for _at, job in sorted(jobs.items())] == [
        False,
        False,
        False,
        False,
        True,
    ]
    # A retry or a lease's rerun is no tick any more: it runs, however late.
    first = jobs[T0 + timedelta(seconds=10)]
    first.attempts = 2
    assert runs_though_late(first, jobtype, later)
    # Unless the job type's own max_lateness says otherwise: that one is never overridden.
    ticking.max_lateness = timedelta(seconds=30)
    try:
        assert not runs_though_late(first, jobtype, later)  # 47 s late
        assert runs_though_late(jobs[T0 + timedelta(seconds=50)], jobtype, later)  # 7 s
    finally:
        del ticking.max_lateness


def yearly_ticks(count: int) -> list[datetime]:
    """The latest ``count`` New Years (00:00 UTC) at least a minute ago, in order."""
    yearly = Cron("0 0 1 1 *")
    latest = yearly.last_at_or_before(clock.now() - timedelta(seconds=61))
    assert latest is not None
    years = [latest.replace(year=latest.year - n) for n in range(count)]
    return sorted(years)


@pytest.mark.django_db(transaction=True)  # run_claimed closes old connections, as per job
@pytest.mark.parametrize(
    ("misfire", "runs"),
    [("skip", []), ("once", [3]), ("all", [0, 1, 2, 3])],
)
def test_ticks_made_before_the_fleet_went_down_run_by_the_policy(
    misfire: str, runs: list[int]
) -> None:
    """Four New Years' jobs, each made in its time by a pre-loader pass, none run (the
    consumers were down ever since): a consumer now runs what the policy says."""
    years = yearly_ticks(4)
    database_schedule(
        "db.new-year",
        interval=None,
        cron="0 0 1 1 *",
        misfire=misfire,
        misfire_grace=timedelta(seconds=60),
        materialised_until=years[0] - timedelta(days=1),
    )
    for tick in years:
        make(tick + timedelta(seconds=30), window=5)  # each made in time
    assert ticks() == years

    outcomes = run_due()

    jobs = list(DelayedJob.objects.order_by("run_at"))
    assert [job.run_at for job in jobs] == years
    assert len(outcomes) == 4
    expected = [JobStatus.SUCCEEDED if n in runs else JobStatus.EXPIRED for n in range(len(years))]
    assert [job.status for job in jobs] == expected
    ran = {jobs[n].pk for n in runs}
    assert set(Execution.objects.values_list("job_id", flat=True)) == ran
    assert Execution.objects.count() == len(runs)
    attempts = dict(JobAttempt.objects.values_list("job_id", "outcome"))
    assert attempts == {
        job.pk: AttemptOutcome.SUCCEEDED if job.pk in ran else AttemptOutcome.EXPIRED
        for job in jobs
    }


@pytest.mark.parametrize(
    ("misfire", "grace", "expected"),
    [
        ("once", timedelta(seconds=30), timedelta(seconds=30)),
        ("once", timedelta(minutes=5), timedelta(minutes=1)),
        ("skip", None, timedelta(minutes=1)),  # MISFIRE_GRACE, 60 s: the same
        ("all", timedelta(seconds=30), timedelta(minutes=1)),
    ],
)
def test_a_tick_job_is_held_to_the_shorter_of_the_grace_and_its_types_max_lateness(
    misfire: str, grace: timedelta | None, expected: timedelta
) -> None:
    database_schedule(job_type="tests.expiring", misfire=misfire, misfire_grace=grace)
    make(T0, window=5)
    assert set(DelayedJob.objects.values_list("max_lateness", flat=True)) == {expected}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("misfire", ["once", "all"])
def test_no_policy_runs_a_tick_past_its_types_own_max_lateness(misfire: str) -> None:
    """tests.expiring is pointless a minute late: the catch-up of "once" and the late
    ticks of "all" end expired all the same."""
    years = yearly_ticks(2)
    database_schedule(
        "db.new-year",
        job_type="tests.expiring",
        interval=None,
        cron="0 0 1 1 *",
        misfire=misfire,
        misfire_grace=timedelta(minutes=5),
        materialised_until=years[0] - timedelta(days=1),
    )
    for tick in years:
        make(tick + timedelta(seconds=30), window=5)
    assert len(run_due()) == 2
    assert set(DelayedJob.objects.values_list("status", flat=True)) == {JobStatus.EXPIRED}
    assert not Execution.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_catch_up_never_made_runs_once_and_a_failed_one_is_retried() -> None:
    """Under once, the pre-loader makes the latest missed tick when it comes back; the
    consumer runs it though late. Its retry is due at its retry time: not late, it runs."""
    years = yearly_ticks(3)
    database_schedule(
        "db.new-year",
        interval=None,
        cron="0 0 1 1 *",
        misfire="once",
        misfire_grace=timedelta(seconds=60),
        materialised_until=years[0] - timedelta(days=1),
        payload={"fail_attempts": [1]},
    )
    make(clock.now(), window=5)  # back after years: the latest missed tick only
    [job] = DelayedJob.objects.all()
    assert job.run_at == years[-1]
    assert job.max_lateness == timedelta(seconds=60)

    [first] = run_due()
    assert first.retry_at is not None, first.error
    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.SCHEDULED, 1)
    wait_for(lambda: clock.now() >= job.run_at, timeout=10, message="the retry never came due")
    [second] = run_due()
    assert second.error == ""
    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.SUCCEEDED, 2)
    assert list(Execution.objects.order_by("attempt").values_list("attempt", flat=True)) == [1, 2]
    assert make(clock.now(), window=5) == 0  # nothing more to catch up


# Pause, resume, a deploy ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_pause_cancels_coming_ticks_and_resume_ticks_from_then_on(ticking: type[Ticking]) -> None:
    start = clock.now()
    sync_code_schedules()
    Schedule.objects.update(materialised_until=start - timedelta(seconds=30))
    make(start - timedelta(seconds=30), window=60)  # (start - 30 s, start + 30 s)
    made = ticks()
    assert len(made) == 6
    # The ticks before now ran: the one nearest now is still running.
    run_due()
    earliest = DelayedJob.objects.filter(status=JobStatus.SCHEDULED).earliest("run_at")
    claimed_at = clock.now()
    [running] = transitions.claim(
        [earliest.pk],
        worker_id="worker-a",
        now=claimed_at,
        job_types=registry.names(),
        leases={},
        default_lease=timedelta(minutes=1),
        # Claimed ahead, as a consumer's CLAIM_AHEAD does; or, on a machine slow enough
        # that its tick came due since run_due() looked, claimed late.
        ahead=max(earliest.run_at - claimed_at, timedelta(0)) + SECOND,
    )
    before = Counter(DelayedJob.objects.values_list("status", flat=True))

    paused = delayjobs.pause_schedule("tests.ticking", by="ops")
    assert (paused.enabled, paused.paused_by) == (False, "ops")
    assert paused.paused_at is not None and start <= paused.paused_at <= clock.now()
    after = Counter(DelayedJob.objects.values_list("status", flat=True))
    # Only the scheduled ones are cancelled: what ran stays, the running one runs on.
    assert after[JobStatus.CANCELLED] == before[JobStatus.SCHEDULED]
    assert after[JobStatus.RUNNING] == 1
    assert after[JobStatus.SUCCEEDED] == before[JobStatus.SUCCEEDED]
    running.refresh_from_db()
    assert running.status == JobStatus.RUNNING
    # Paused, however far the clock moves: no tick is made.
    assert make(start + timedelta(days=3)) == 0
    assert next_ticks(Schedule.objects.get(), 3)  # it still says when it would tick
    # Pausing again changes nothing (the first pause's time and author stay).
    again = delayjobs.pause_schedule("tests.ticking", by="someone else")
    assert (again.paused_at, again.paused_by) == (paused.paused_at, "ops")

    resumed_at = clock.now()
    row = delayjobs.resume_schedule("tests.ticking")
    assert (row.enabled, row.paused_at, row.paused_by) == (True, None, "")
    assert row.materialised_until is not None
    assert resumed_at <= row.materialised_until <= clock.now()
    now = clock.now()
    make(now, window=60)
    # Ticks from the resume on: none of the paused time, each with one active job (the
    # running one's tick is not made again).
    expected = Every(seconds=10).ticks_between(row.materialised_until, now + 60 * SECOND, 100)
    active = DelayedJob.objects.active()
    assert sorted(active.values_list("run_at", flat=True)) == sorted({*expected, running.run_at})
    assert max(Counter(active.values_list("key", flat=True)).values()) == 1


def test_pausing_an_unknown_schedule_says_so() -> None:
    with pytest.raises(InvalidJob, match="No schedule named 'nope'"):
        delayjobs.pause_schedule("nope")
    with pytest.raises(InvalidJob, match="No schedule named 'nope'"):
        delayjobs.resume_schedule("nope")


def test_a_paused_database_schedule_makes_nothing_until_resumed() -> None:
    row = database_schedule()
    make(T0, window=10)
    delayjobs.pause_schedule(row)
    assert set(DelayedJob.objects.values_list("status", flat=True)) == {JobStatus.CANCELLED}
    assert make(T0 + timedelta(hours=1)) == 0
    delayjobs.resume_schedule(row)
    row.refresh_from_db()
    assert row.enabled and row.materialised_until is not None
    make(row.materialised_until, window=10)
    expected = Every(seconds=2).ticks_between(
        row.materialised_until, row.materialised_until + 10 * SECOND, 10
    )
    assert len(expected) == 5
    assert sorted(DelayedJob.objects.active().values_list("run_at", flat=True)) == expected


def test_a_deploy_that_changes_the_interval_doubles_no_tick(ticking: type[Ticking]) -> None:
    """The ticks already made (up to the window ahead) stay; the new interval ticks from
    the cursor on, which only moves forward."""
    sync_code_schedules()
    Schedule.objects.update(materialised_until=T0)
    make(T0, window=60)  # :10 ... :50 at the old interval
    old = set(DelayedJob.objects.values_list("pk", flat=True))

    ticking.recurrence = delayjobs.Every(seconds=15)  # the deploy
    assert make(T0 + 5 * SECOND, window=60) == 1  # :60, the new interval's after :50

    row = Schedule.objects.get()
    assert row.interval == timedelta(seconds=15)
    assert row.materialised_until == T0 + 60 * SECOND
    assert set(DelayedJob.objects.filter(pk__in=old).values_list("status", flat=True)) == {
        JobStatus.SCHEDULED
    }
    assert make(T0 + 40 * SECOND, window=60) == 2  # :75 and :90
    assert assert_one_job_per_tick("tests.ticking") == [
        T0 + n * SECOND for n in (10, 20, 30, 40, 50, 60, 75, 90)
    ]


def test_a_rolling_deploy_with_two_definitions_doubles_no_tick(ticking: type[Ticking]) -> None:
    """Old and new processes side by side, each writing its own definition every pass:
    whatever the interval of the pass, it makes the ticks after the cursor, none twice."""
    sync_code_schedules()
    Schedule.objects.update(materialised_until=T0)
    cursors = []
    for n in range(40):
        ticking.recurrence = delayjobs.Every(seconds=10 if n % 2 else 15)
        make(T0 + n * 7 * SECOND, window=30)
        cursors.append(Schedule.objects.get().materialised_until)
    assert cursors == sorted(cursors), "the cursor went back"
    made = assert_one_job_per_tick("tests.ticking")
    assert made == sorted(set(made))
    for tick in made:
        assert (tick - T0) % (10 * SECOND) == timedelta(0) or (tick - T0) % (15 * SECOND) == (
            timedelta(0)
        )
    # No gap longer than the longer interval: no tick was lost in the back and forth.
    gaps = {later - earlier for earlier, later in itertools.pairwise(made)}
    assert max(gaps) <= 15 * SECOND


@pytest.mark.django_db(transaction=True)
def test_restart_ticks_after_an_edit_cancels_coming_ticks_and_doubles_none() -> None:
    """An operator changes a schedule's interval in the admin: the jobs of its coming
    ticks made under the old one are cancelled, and it ticks anew from then on."""
    start = clock.now()
    row = database_schedule("db.edited", interval=10 * SECOND)
    Schedule.objects.filter(pk=row.pk).update(materialised_until=start - 30 * SECOND)
    make(start - 30 * SECOND, window=60)
    ran = {outcome.job.pk for outcome in run_due()}  # the ticks up to now
    assert ran
    old = set(DelayedJob.objects.filter(status=JobStatus.SCHEDULED).values_list("pk", flat=True))
    assert old

    Schedule.objects.filter(pk=row.pk).update(interval=15 * SECOND)
    edited_at = clock.now()
    restarted = restart_ticks("db.edited")
    assert restarted.materialised_until is not None
    assert edited_at <= restarted.materialised_until <= clock.now()
    make(clock.now(), window=60)

    # The jobs of the old interval's coming ticks are cancelled; those that ran stay.
    assert set(DelayedJob.objects.filter(pk__in=old).values_list("status", flat=True)) == {
        JobStatus.CANCELLED
    }
    assert set(DelayedJob.objects.filter(pk__in=ran).values_list("status", flat=True)) == {
        JobStatus.SUCCEEDED
    }
    # The new interval's ticks from the edit on, one active job each, none before it.
    reach = Schedule.objects.get(pk=row.pk).materialised_until
    assert reach is not None
    expected = Every(seconds=15).ticks_between(restarted.materialised_until, reach + SECOND, 100)
    active = DelayedJob.objects.active()
    assert sorted(active.values_list("run_at", flat=True)) == expected
    assert (
        sorted(DelayedJob.objects.exclude(pk__in=old | ran).values_list("run_at", flat=True))
        == expected
    )
    live = Counter(DelayedJob.objects.exclude(status="cancelled").values_list("key", flat=True))
    assert max(live.values()) == 1


def test_recent_jobs_are_the_latest_ticks_newest_first(ticking: type[Ticking]) -> None:
    now = clock.now()
    sync_code_schedules()
    Schedule.objects.update(materialised_until=now - timedelta(seconds=60))
    make(now - timedelta(seconds=60), window=120)  # the last minute's ticks and the next's
    row = Schedule.objects.get()
    every = Every(seconds=10)
    # Asked at the clock's now: a tick may pass meanwhile, whence two right answers.
    before = every.last_at_or_before(clock.now())
    recent = [job.run_at for job in recent_jobs(row, 3)]
    coming = next_ticks(row, 2)
    after = every.last_at_or_before(clock.now())
    assert before is not None and after is not None
    assert recent in ([at - 10 * n * SECOND for n in range(3)] for at in (before, after))
    assert coming in ([at + 10 * SECOND, at + 20 * SECOND] for at in (before, after))
    assert recent_jobs(row, 0) == []
