"""Recurrences: ``Every`` aligned to the epoch, ``Cron`` on a zone's wall clock across DST
changes, and what is wrong with a bad one, said in words. No database, no Redis.

The DST days: Europe/Berlin springs forward on 2026-03-29 (02:00 CET -> 03:00 CEST) and
falls back on 2026-10-25 (03:00 CEST -> 02:00 CET); America/New_York on 2026-03-08 and
2026-11-01. A daily job at a time the spring-forward skips runs once, right after the
change; at a time the fall-back repeats, once, the first time (as Debian's cron does). A
job of every hour runs in both passes through the repeated hour: that is cron.
"""

from __future__ import annotations

import zoneinfo
from datetime import UTC, date, datetime, time, timedelta

import pytest

import delayjobs
from delayjobs.recurring.rules import (
    MAX_INTERVAL,
    Cron,
    Every,
    Misfire,
    Recurrence,
    cron_problem,
    format_interval,
    misfire_problem,
    timezone_problem,
)

US = timedelta(microseconds=1)
BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
T = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def local_day(day: date, tz: str) -> tuple[datetime, datetime]:
    """The UTC bounds of a zone's calendar day: [its midnight, the next midnight)."""
    zone = zoneinfo.ZoneInfo(tz)
    start = datetime.combine(day, time(), tzinfo=zone).astimezone(UTC)
    end = datetime.combine(day + timedelta(days=1), time(), tzinfo=zone).astimezone(UTC)
    return start, end


def ticks_on(recurrence: Recurrence, day: date, tz: str) -> list[datetime]:
    """The ticks within a zone's calendar day."""
    start, end = local_day(day, tz)
    return recurrence.ticks_between(start - US, end, 1000)


def wall(tick: datetime, tz: str) -> tuple[str, str | None]:
    """A tick as the zone's wall clock shows it, and the zone's abbreviation then."""
    local = tick.astimezone(zoneinfo.ZoneInfo(tz))
    return local.strftime("%Y-%m-%d %H:%M:%S"), local.tzname()


# Every: aligned to the epoch --------------------------------------------------------------


def test_every_ticks_at_multiples_of_its_interval_since_the_epoch() -> None:
    every = Every(minutes=5)
    assert every.interval == timedelta(minutes=5)
    assert every.problem == ""
    assert every.ticks_between(utc(2026, 11, 26, 8, 3, 12), utc(2026, 11, 26, 8, 20), 10) == [
        utc(2026, 11, 26, 8, 5),
        utc(2026, 11, 26, 8, 10),
        utc(2026, 11, 26, 8, 15),
    ]
    # An odd interval too: every 7 s counted from 1970-01-01T00:00:00Z.
    for tick in Every(seconds=7).ticks_between(T, T + timedelta(minutes=3), 100):
        assert (tick - EPOCH) % timedelta(seconds=7) == timedelta(0), tick
    assert Every(hours=24).next_after(utc(2026, 3, 29, 0, 30)) == utc(2026, 3, 30)
    assert Every(seconds=1.5).ticks_between(utc(1970, 1, 1), utc(1970, 1, 1, 0, 0, 5), 10) == [
        EPOCH + timedelta(seconds=1.5 * n) for n in (1, 2, 3)
    ]


def test_every_ignores_the_zone_of_the_moment_it_is_asked_about() -> None:
    moment = utc(2026, 3, 29, 0, 59, 58)  # the spring-forward in Berlin is two seconds away
    in_berlin = moment.astimezone(zoneinfo.ZoneInfo(BERLIN))
    every = Every(seconds=1)
    assert every.ticks_between(in_berlin, moment + timedelta(seconds=5), 10) == [
        moment + timedelta(seconds=n) for n in (1, 2, 3, 4)
    ]
    for tick in every.ticks_between(in_berlin, moment + timedelta(seconds=5), 10):
        assert tick.tzinfo is UTC


def test_every_ticks_after_is_strictly_after_and_last_at_or_before_is_inclusive() -> None:
    every = Every(seconds=10)
    assert every.next_after(T - US) == T
    assert every.next_after(T) == T + timedelta(seconds=10)
    assert every.last_at_or_before(T) == T
    assert every.last_at_or_before(T - US) == T - timedelta(seconds=10)
    assert every.last_at_or_before(T + timedelta(seconds=9.999999)) == T
    # Before the epoch: the same grid, extended backwards.
    before = utc(1969, 12, 31, 23, 59, 55)
    assert every.next_after(before) == EPOCH
    assert every.last_at_or_before(before) == utc(1969, 12, 31, 23, 59, 50)


def test_ticks_between_excludes_both_ends_and_keeps_to_the_limit() -> None:
    every = Every(seconds=1)
    assert every.ticks_between(T, T + timedelta(seconds=3), 100) == [
        T + timedelta(seconds=1),
        T + timedelta(seconds=2),
    ]
    assert every.ticks_between(T, T + timedelta(hours=1), 5) == [
        T + timedelta(seconds=n) for n in range(1, 6)
    ]
    assert every.ticks_between(T, T, 100) == []
    assert every.ticks_between(T, T + timedelta(seconds=1), 100) == []
    assert every.ticks_between(T, T + timedelta(hours=1), 0) == []


def test_every_describes_itself() -> None:
    assert Every(minutes=90).describe() == "every 1h 30m"
    assert Every(days=1, seconds=5).describe() == "every 1d 5s"
    assert Every(seconds=1.5).describe() == "every 1.5s"
    assert format_interval(timedelta(0)) == "0s"


@pytest.mark.parametrize(
    "every",
    [Every(seconds=1), Every(days=MAX_INTERVAL.days), Every(hours=1, minutes=30), Every(days=0.5)],
)
def test_every_within_the_bounds_has_no_problem(every: Every) -> None:
    assert every.problem == ""


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"seconds": 0.5}, "An interval must be from 1 second to 3660 days; got 0.5s."),
        ({"seconds": 0.999999}, "got 0.999999s."),
        ({}, "An interval must be from 1 second to 3660 days; got 0s."),
        ({"seconds": 0}, "got 0s."),
        ({"days": 3661}, "An interval must be from 1 second to 3660 days; got 3661d."),
        ({"days": 10**30}, "An interval must be from 1 second to 3660 days; got days=10000"),
        ({"days": 1e300}, "got days=1e+300."),
        ({"seconds": -1}, "Every() takes finite, non-negative numbers; got seconds=-1."),
        ({"minutes": -0.5, "hours": -1}, "got minutes=-0.5, hours=-1."),
        ({"seconds": True}, "got seconds=True."),
        ({"seconds": "5"}, "got seconds='5'."),
        ({"seconds": None}, "got seconds=None."),
        ({"seconds": float("nan")}, "got seconds=nan."),
        ({"seconds": float("inf")}, "got seconds=inf."),
    ],
)
def test_a_bad_interval_is_kept_as_a_problem_never_raised(
    kwargs: dict[str, object], words: str
) -> None:
    every = Every(**kwargs)  # type: ignore[arg-type]
    assert words in every.problem


# Cron: the wall clock of its zone ----------------------------------------------------------


def test_cron_is_utc_by_default_and_reads_names_ranges_and_steps() -> None:
    weekdays = Cron("0 8 * * MON-FRI", tz=BERLIN)
    # The week of Monday 2026-11-23, in winter time (CET, UTC+1).
    week = weekdays.ticks_between(utc(2026, 11, 23), utc(2026, 11, 30), 100)
    assert week == [utc(2026, 11, day, 7) for day in range(23, 28)]
    assert Cron("*/20 9-10 * * *").ticks_between(T, T + timedelta(days=1), 100) == [
        utc(2026, 11, 26, hour, minute) for hour in (9, 10) for minute in (0, 20, 40)
    ]
    assert Cron("0 8 * * MON-FRI", tz=BERLIN).describe() == "cron '0 8 * * MON-FRI' (Europe/Berlin)"


def test_cron_ticks_after_is_strictly_after_and_last_at_or_before_is_inclusive() -> None:
    cron = Cron("* * * * *")
    assert cron.next_after(T - US) == T
    assert cron.next_after(T) == T + timedelta(minutes=1)
    assert cron.next_after(T + timedelta(seconds=0.5)) == T + timedelta(minutes=1)
    assert cron.last_at_or_before(T) == T
    assert cron.last_at_or_before(T - US) == T - timedelta(minutes=1)
    assert cron.last_at_or_before(T + timedelta(seconds=59)) == T


def test_a_six_field_cron_has_a_seconds_field_first() -> None:
    cron = Cron("*/15 * * * * *")
    assert cron.problem == ""
    assert cron.ticks_between(T - US, T + timedelta(minutes=1), 100) == [
        T + timedelta(seconds=s) for s in (0, 15, 30, 45)
    ]
    assert cron.next_after(T) == T + timedelta(seconds=15)
    assert cron.last_at_or_before(T + timedelta(seconds=14.9)) == T
    # In a zone: 08:00:30 Berlin time, every day.
    daily = Cron("30 0 8 * * *", tz=BERLIN)
    assert daily.next_after(T) == utc(2026, 11, 27, 7, 0, 30)


def test_daily_0230_berlin_runs_once_on_the_spring_forward_day_right_after_the_change() -> None:
    cron = Cron("30 2 * * *", tz=BERLIN)
    [tick] = ticks_on(cron, date(2026, 3, 29), BERLIN)
    # 02:30 does not exist that night: the job runs at 03:00 CEST, when the clock jumps.
    assert tick == utc(2026, 3, 29, 1, 0)
    assert wall(tick, BERLIN) == ("2026-03-29 03:00:00", "CEST")
    # The days around it: 02:30 in their own offsets.
    assert ticks_on(cron, date(2026, 3, 28), BERLIN) == [utc(2026, 3, 28, 1, 30)]
    assert ticks_on(cron, date(2026, 3, 30), BERLIN) == [utc(2026, 3, 30, 0, 30)]


def test_daily_0230_berlin_runs_once_on_the_fall_back_day_the_first_time() -> None:
    cron = Cron("30 2 * * *", tz=BERLIN)
    [tick] = ticks_on(cron, date(2026, 10, 25), BERLIN)
    # 02:30 comes twice (CEST, then CET): the job runs at the first.
    assert tick == utc(2026, 10, 25, 0, 30)
    assert wall(tick, BERLIN) == ("2026-10-25 02:30:00", "CEST")
    assert ticks_on(cron, date(2026, 10, 24), BERLIN) == [utc(2026, 10, 24, 0, 30)]
    assert ticks_on(cron, date(2026, 10, 26), BERLIN) == [utc(2026, 10, 26, 1, 30)]


@pytest.mark.parametrize(
    ("tz", "first", "last"),
    [
        (BERLIN, date(2026, 3, 20), date(2026, 4, 5)),
        (BERLIN, date(2026, 10, 18), date(2026, 11, 1)),
    ],
)
def test_a_daily_cron_ticks_once_a_day_through_a_dst_change(
    tz: str, first: date, last: date
) -> None:
    cron = Cron("30 2 * * *", tz=tz)
    start, _ = local_day(first, tz)
    _, end = local_day(last, tz)
    ticks = cron.ticks_between(start, end, 1000)
    days = [tick.astimezone(zoneinfo.ZoneInfo(tz)).date() for tick in ticks]
    assert days == [first + timedelta(days=n) for n in range((last - first).days + 1)]


def test_an_hourly_cron_runs_in_both_passes_through_the_repeated_hour() -> None:
    hourly = Cron("0 * * * *", tz=BERLIN)
    fall = ticks_on(hourly, date(2026, 10, 25), BERLIN)
    assert len(fall) == 25
    twos = [tick for tick in fall if tick.astimezone(zoneinfo.ZoneInfo(BERLIN)).hour == 2]
    assert twos == [utc(2026, 10, 25, 0), utc(2026, 10, 25, 1)]
    assert [wall(tick, BERLIN) for tick in twos] == [
        ("2026-10-25 02:00:00", "CEST"),
        ("2026-10-25 02:00:00", "CET"),
    ]
    assert fall == [utc(2026, 10, 24, 22) + timedelta(hours=n) for n in range(25)]
    spring = ticks_on(hourly, date(2026, 3, 29), BERLIN)
    assert len(spring) == 23
    assert 2 not in {tick.astimezone(zoneinfo.ZoneInfo(BERLIN)).hour for tick in spring}


def test_new_york_dst_days() -> None:
    # Spring forward (02:00 EST -> 03:00 EDT): 02:30 runs once, at 03:00 EDT.
    skipped = Cron("30 2 * * *", tz=NEW_YORK)
    [tick] = ticks_on(skipped, date(2026, 3, 8), NEW_YORK)
    assert wall(tick, NEW_YORK) == ("2026-03-08 03:00:00", "EDT")
    assert tick == utc(2026, 3, 8, 7, 0)
    # Fall back (02:00 EDT -> 01:00 EST): 01:30 comes twice and runs once, the first time.
    repeated = Cron("30 1 * * *", tz=NEW_YORK)
    [tick] = ticks_on(repeated, date(2026, 11, 1), NEW_YORK)
    assert wall(tick, NEW_YORK) == ("2026-11-01 01:30:00", "EDT")
    assert tick == utc(2026, 11, 1, 5, 30)
    # 02:30 is not repeated that night (01:00-02:00 is): it is simply at EST.
    assert ticks_on(skipped, date(2026, 11, 1), NEW_YORK) == [utc(2026, 11, 1, 7, 30)]
    # Every hour: 25 hours, 01:00 twice.
    hourly = ticks_on(Cron("0 * * * *", tz=NEW_YORK), date(2026, 11, 1), NEW_YORK)
    assert [wall(t, NEW_YORK) for t in hourly].count(("2026-11-01 01:00:00", "EDT")) == 1
    assert [wall(t, NEW_YORK) for t in hourly].count(("2026-11-01 01:00:00", "EST")) == 1
    assert len(hourly) == 25


@pytest.mark.parametrize(
    ("expression", "tz", "night"),
    [
        ("30 2 * * *", BERLIN, utc(2026, 10, 24, 23)),
        ("15 2,3 * * *", BERLIN, utc(2026, 10, 24, 23)),
        ("0 * * * *", BERLIN, utc(2026, 10, 24, 23)),
        ("*/20 * * * *", BERLIN, utc(2026, 10, 24, 23)),
        ("30 2 * * *", BERLIN, utc(2026, 3, 28, 23)),
        ("30 1 * * *", NEW_YORK, utc(2026, 11, 1, 4)),
        ("45 1,2 * * *", "Australia/Sydney", utc(2026, 4, 4, 14)),
        ("*/30 * * * * *", BERLIN, utc(2026, 10, 25, 0, 58)),
    ],
)
def test_from_any_moment_of_a_dst_night_the_next_and_last_ticks_are_right(
    expression: str, tz: str, night: datetime
) -> None:
    """Asked from a moment in the second pass through a repeated hour, cronsim reads the
    wall clock: it gave the first pass's tick as the next one (earlier than the moment) and
    stepped back past it for the last one. The pre-loader's cursor can be such a moment
    (a schedule made or resumed then): the tick was made twice, a day late."""
    cron = Cron(expression, tz=tz)
    # Walked over the night in steps of about a minute (a second, with a seconds field).
    scale = 1 / 60 if expression.count(" ") == 5 else 1
    span, step = timedelta(hours=4 * scale), timedelta(seconds=67 * scale)
    ahead = timedelta(days=1) if scale == 1 else timedelta(minutes=5)
    # Every tick from well before the night: cronsim walks these without surprise.
    reference = cron.ticks_between(night - 6 * span, night + span + 2 * ahead, 10_000)
    moment = night
    while moment < night + span:
        expected_next = next(tick for tick in reference if tick > moment)
        expected_last = [tick for tick in reference if tick <= moment][-1]
        assert cron.next_after(moment) == expected_next, moment
        assert cron.last_at_or_before(moment) == expected_last, moment
        assert cron.ticks_between(moment, moment + ahead, 10_000) == [
            tick for tick in reference if moment < tick < moment + ahead
        ], moment
        moment += step


def test_the_repeated_hour_regression_at_its_plainest() -> None:
    cron = Cron("30 2 * * *", tz=BERLIN)
    second_pass = utc(2026, 10, 25, 1, 10)  # 02:10 CET, after 02:30 CEST (00:30 UTC) ran
    assert wall(second_pass, BERLIN) == ("2026-10-25 02:10:00", "CET")
    assert cron.next_after(second_pass) == utc(2026, 10, 26, 1, 30)
    assert cron.last_at_or_before(second_pass) == utc(2026, 10, 25, 0, 30)
    assert cron.ticks_between(second_pass, utc(2026, 10, 26), 10) == []


# What is wrong, in words ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("* * * *", "'* * * *' is not a valid cron expression: Wrong number of fields."),
        ("* * * * * * *", "Wrong number of fields"),
        ("61 * * * *", "'61 * * * *' is not a valid cron expression: Bad minute."),
        ("* 24 * * *", "Bad hour"),
        ("0 0 31 4 *", "Bad day-of-month"),
        ("0 0 * 13 *", "Bad month"),
        ("0 0 * * FOO", "Bad day-of-week"),
        ("*/0 * * * *", "Bad minute"),
        ("@reboot", "is not a valid cron expression"),
        ("", "A cron expression must be a non-empty string; got ''."),
        ("   ", "A cron expression must be a non-empty string; got '   '."),
        (None, "A cron expression must be a non-empty string; got None."),
        (5, "A cron expression must be a non-empty string; got 5."),
    ],
)
def test_a_bad_cron_expression_is_said_in_words(expression: object, words: str) -> None:
    cron = Cron(expression, tz=BERLIN)  # type: ignore[arg-type]
    assert words in cron.problem
    assert cron.problem == cron_problem(expression, BERLIN)


@pytest.mark.parametrize(
    ("tz", "words"),
    [
        ("Mars/Olympus_Mons", "Unknown time zone 'Mars/Olympus_Mons': use an IANA name"),
        ("Europe/Berlin ", "Unknown time zone 'Europe/Berlin '"),
        ("../../etc/passwd", "Unknown time zone '../../etc/passwd'"),
        ("", "A time zone must be an IANA name such as 'Europe/Berlin'; got ''."),
        (None, "got None."),
        (zoneinfo.ZoneInfo(BERLIN), "got zoneinfo.ZoneInfo(key='Europe/Berlin')."),
    ],
)
def test_an_unknown_time_zone_is_said_in_words(tz: object, words: str) -> None:
    cron = Cron("0 8 * * *", tz=tz)  # type: ignore[arg-type]
    assert words in cron.problem
    assert words in timezone_problem(tz)


@pytest.mark.parametrize("tz", ["UTC", BERLIN, NEW_YORK, "Asia/Kolkata", "Australia/Lord_Howe"])
def test_iana_zones_are_accepted(tz: str) -> None:
    assert Cron("0 8 * * *", tz=tz).problem == ""
    assert timezone_problem(tz) == ""


def test_the_zone_is_checked_before_the_expression() -> None:
    assert Cron("nonsense", tz="Nowhere/Land").problem.startswith("Unknown time zone")


def test_misfire_policies() -> None:
    assert Misfire.CHOICES == ("skip", "once", "all")
    for policy in Misfire.CHOICES:
        assert misfire_problem(policy) == ""
    assert misfire_problem("never") == (
        "misfire must be one of 'skip', 'once', 'all'; got 'never'."
    )
    assert misfire_problem(None) != ""
    assert misfire_problem("ONCE") != ""


def test_the_public_names_are_the_spec_classes() -> None:
    assert delayjobs.Every is Every
    assert delayjobs.Cron is Cron
