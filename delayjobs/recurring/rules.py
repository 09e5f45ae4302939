"""Recurrences: when a recurring job type (or an operator's schedule) has a tick.

``Every(minutes=5)`` ticks at instants aligned to the Unix epoch (:00, :05, ...), whatever
the time zone; ``Cron("0 8 * * MON-FRI", tz="Europe/Berlin")`` ticks when the expression
matches the wall clock of its zone, as Debian's cron does across DST changes (computed by
cronsim: a time the spring-forward skips runs once, right after the change; a time the
fall-back repeats runs once, the first time). Every tick is an aware UTC datetime.

Constructing one never raises: what is wrong is kept in ``problem`` and reported where the
user meets it, by a system check for a job type's ``recurrence``, by a form error for a
schedule edited in the admin. Nothing ticks from a recurrence with a problem.
"""

from __future__ import annotations

import itertools
import math
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from cronsim import CronSim, CronSimError

#: The shortest interval: a tick is a job row, a Redis entry and an execution.
MIN_INTERVAL = timedelta(seconds=1)
#: The longest: past it, tick arithmetic nears the end of the calendar.
MAX_INTERVAL = timedelta(days=3660)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class Misfire:
    """What happens to a tick missed by more than its grace (the fleet was down)."""

    SKIP = "skip"  # missed ticks do not run
    ONCE = "once"  # of the missed ticks, only the latest runs (late)
    ALL = "all"  # every missed tick runs, late, in order

    CHOICES = (SKIP, ONCE, ALL)


class Recurrence:
    """Base of ``Every`` and ``Cron``: the ticks of a schedule."""

    problem: str

    def ticks_after(self, moment: datetime) -> Iterator[datetime]:
        """Ticks strictly after ``moment`` (aware), in order, as UTC datetimes."""
        raise NotImplementedError

    def next_after(self, moment: datetime) -> datetime:
        return next(self.ticks_after(moment))

    def ticks_between(self, start: datetime, end: datetime, limit: int) -> list[datetime]:
        """At most ``limit`` ticks in ``(start, end)``, in order."""
        ticks = itertools.takewhile(lambda tick: tick < end, self.ticks_after(start))
        return list(itertools.islice(ticks, limit))

    def last_at_or_before(self, moment: datetime) -> datetime | None:
        """The latest tick at or before ``moment`` (None if there is none)."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Every(Recurrence):
    """A tick every ``interval``, aligned to the epoch: ``Every(minutes=5)`` ticks at :00,
    :05, ..., ``Every(hours=24)`` at midnight UTC. At least one second."""

    seconds: float = 0
    minutes: float = 0
    hours: float = 0
    days: float = 0
    interval: timedelta = field(init=False, compare=False, repr=False)
    problem: str = field(init=False, compare=False, repr=False, default="")

    def __post_init__(self) -> None:
        values = {"seconds": self.seconds, "minutes": self.minutes, "hours": self.hours}
        values["days"] = self.days
        # NaN and infinity too: timedelta() raises ValueError or OverflowError for them.
        bad = [f"{name}={v!r}" for name, v in values.items() if not _is_non_negative(v)]
        interval = timedelta(0)
        if bad:
            problem = interval_problem(None, bad)
        else:
            try:
                interval = timedelta(**values)
            except OverflowError:  # more days than a timedelta holds, far past the bound
                problem = (
                    f"An interval must be from 1 second to {MAX_INTERVAL.days} days; got "
                    f"{', '.join(f'{name}={v!r}' for name, v in values.items() if v)}."
                )
            else:
                problem = interval_problem(interval)
        object.__setattr__(self, "interval", interval)
        object.__setattr__(self, "problem", problem)

    def ticks_after(self, moment: datetime) -> Iterator[datetime]:
        step = self.interval // _MICROSECOND
        elapsed = (moment - _EPOCH) // _MICROSECOND
        index = elapsed // step + 1
        while True:
            yield _EPOCH + timedelta(microseconds=index * step)
            index += 1

    def last_at_or_before(self, moment: datetime) -> datetime | None:
        step = self.interval // _MICROSECOND
        return _EPOCH + timedelta(microseconds=(moment - _EPOCH) // _MICROSECOND // step * step)

    def describe(self) -> str:
        return f"every {format_interval(self.interval)}"


@dataclass(frozen=True)
class Cron(Recurrence):
    """A tick whenever the cron ``expression`` matches the wall clock of ``tz`` (an IANA
    name; default UTC). Five fields (minute hour day month weekday), or six with seconds
    first; names (``MON-FRI``, ``JAN``), ranges, lists and steps, as cronsim reads them."""

    expression: str
    tz: str = "UTC"
    problem: str = field(init=False, compare=False, repr=False, default="")

    def __post_init__(self) -> None:
        object.__setattr__(self, "problem", cron_problem(self.expression, self.tz))

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.tz)

    def ticks_after(self, moment: datetime) -> Iterator[datetime]:
        # cronsim walks wall-clock time in the zone and resolves DST gaps and folds. From
        # a moment in the second pass through a repeated hour (the fall-back), it reads
        # the wall clock and may first give that hour's tick of the first pass, which is
        # earlier than the moment: such ticks are not "after" it.
        for tick in CronSim(self.expression, moment.astimezone(self.zone)):
            utc = tick.astimezone(UTC)
            if utc > moment:
                yield utc

    def last_at_or_before(self, moment: datetime) -> datetime | None:
        # cronsim also walks backwards; its start is exclusive, hence the microsecond.
        start = (moment + _MICROSECOND).astimezone(self.zone)
        try:
            tick = next(CronSim(self.expression, start, reverse=True)).astimezone(UTC)
        except StopIteration:
            return None
        # From a moment in the second pass through a repeated hour, cronsim steps back by
        # the wall clock, past that hour's tick of the first pass: walk forward to it.
        for later in self.ticks_after(tick):
            if later > moment:
                break
            tick = later
        return tick

    def describe(self) -> str:
        return f"cron {self.expression!r} ({self.tz})"


def interval_problem(interval: timedelta | None, bad: list[str] | None = None) -> str:
    """What is wrong with an interval ("" if nothing)."""
    if bad:
        return f"Every() takes finite, non-negative numbers; got {', '.join(bad)}."
    if interval is None or not MIN_INTERVAL <= interval <= MAX_INTERVAL:
        return (
            f"An interval must be from 1 second to {MAX_INTERVAL.days} days; got "
            f"{format_interval(interval) if interval is not None else 'none'}."
        )
    return ""


def cron_problem(expression: object, tz: object) -> str:
    """What is wrong with a cron expression and its time zone ("" if nothing)."""
    if problem := timezone_problem(tz):
        return problem
    if not isinstance(expression, str) or not expression.strip():
        return f"A cron expression must be a non-empty string; got {expression!r}."
    try:
        next(CronSim(expression, datetime.now(UTC)))
    except CronSimError as exc:
        return f"{expression!r} is not a valid cron expression: {exc}."
    except StopIteration:
        return f"{expression!r} never matches a date (e.g. 30 February)."
    return ""


def timezone_problem(tz: object) -> str:
    if not isinstance(tz, str) or not tz:
        return f"A time zone must be an IANA name such as 'Europe/Berlin'; got {tz!r}."
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return f"Unknown time zone {tz!r}: use an IANA name such as 'Europe/Berlin'."
    return ""


def misfire_problem(misfire: object) -> str:
    if misfire not in Misfire.CHOICES:
        return f"misfire must be one of {', '.join(map(repr, Misfire.CHOICES))}; got {misfire!r}."
    return ""


def format_interval(interval: timedelta) -> str:
    """``timedelta(minutes=90)`` as "1h 30m"; fractions of a second as seconds."""
    total = interval.total_seconds()
    if total != int(total) or total < 1:
        return f"{total:g}s"
    days, rest = divmod(int(total), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    return " ".join(f"{value}{unit}" for value, unit in parts if value) or "0s"


def _is_non_negative(value: object) -> bool:
    """An int or float from 0 to a finite number (not a bool, NaN or infinity)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < math.inf
