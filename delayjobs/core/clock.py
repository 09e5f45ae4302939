"""One clock for every host: the database server's.

A job's due time, a lease's expiry and a job's lateness are compared across hosts: a row
claimed on one host is reaped by another once its lease has passed. A host's wall clock
can be off by seconds or minutes (a VM resumed from pause, a container without time sync)
and can jump, so no such decision reads it. Instead a process reads the database server's
clock (the jobs' database: every consumer shares it, and it is there even when Redis is
not), and between readings counts the time passed with its own monotonic clock, which
neither jumps nor follows the wall clock's settings.

A reading is the best of a few queries: the one with the shortest round trip, taken as
the server's time when its answer arrived, so this clock is never ahead of the server's
and behind it by at most that round trip (well under a millisecond on a LAN). Consumers
read at start and then every ``SYNC_INTERVAL`` (on their heartbeat), which bounds the
drift of the monotonic clock from the server's to milliseconds even where time sync is
broken (tens of ppm); any other process reads on its first use, and again when it next
asks once its reading is two intervals old.

``offset()`` is how far this host's wall clock is behind the server's (positive: the
server is ahead), for the consumer's heartbeat row, ``delayjobs_status`` and metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import connections

from delayjobs.conf import settings
from delayjobs.models import jobs_database

# The old path: users' LOGGING names it.
logger = logging.getLogger("delayjobs.clock")

#: Seconds between readings of a long-running process.
SYNC_INTERVAL = 60.0
#: Queries per reading: the one with the shortest round trip is kept.
SAMPLES = 3
_NS = 1_000_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: The server's time now, as seconds since the epoch, per database vendor. clock_timestamp()
#: and SYSDATE() change during a transaction (now() would repeat its start). SQLite's file
#: lives on the host that runs it: its clock is that host's (as C sees it, not Python).
SERVER_TIME_SQL = {
    "postgresql": "SELECT EXTRACT(EPOCH FROM clock_timestamp())",
    "sqlite": "SELECT (julianday('now') - 2440587.5) * 86400.0",
    "mysql": "SELECT UNIX_TIMESTAMP(SYSDATE(6))",
}


def read_database_time() -> float:
    """The jobs' database server's clock, as seconds since the epoch."""
    connection = connections[jobs_database()]
    sql = SERVER_TIME_SQL.get(connection.vendor)
    if sql is None:
        raise NotImplementedError(f"no server clock query for {connection.vendor}")
    with connection.cursor() as cursor:
        cursor.execute(sql)
        (value,) = cursor.fetchone()
    return float(Decimal(value)) if not isinstance(value, float) else value


class SharedClock:
    """The database server's clock, kept between readings by this host's monotonic clock."""

    def __init__(
        self, read_server: Callable[[], float] = read_database_time, interval: float = SYNC_INTERVAL
    ) -> None:
        self._read_server = read_server
        self.interval = interval
        # (server's ns, monotonic ns) at the reading: server now = server's ns + monotonic
        # ns since. One attribute, swapped whole, so a reader never mixes two readings (and
        # needs no lock: the time is read several times per job).
        self._base: tuple[int, int] | None = None
        self._offset: float | None = None
        # time.monotonic_ns() of the last try to read (None: never tried).
        self._attempted_ns: int | None = None
        self._unreadable_warned = False

    def sync(self) -> float | None:
        """Read the server's clock now; return this host's offset (None if unreadable)."""
        best: tuple[int, int, int, int] | None = None  # (round trip, server, monotonic, wall)
        # Also when the read fails: a database that is down is asked again an interval
        # later, not on every look at the time.
        self._attempted_ns = time.monotonic_ns()
        try:
            for _ in range(SAMPLES):
                before = time.monotonic_ns()
                server_ns = round(self._read_server() * _NS)
                after = time.monotonic_ns()
                wall_ns = time.time_ns()
                if best is None or after - before < best[0]:
                    best = (after - before, server_ns, after, wall_ns)
        except Exception as exc:  # a database down, or no clock query for it: the host's
            self._unreadable(exc)
            return self._offset
        assert best is not None
        _round_trip, server_ns, after, wall_ns = best
        self._unreadable_warned = False  # readable again: warn of the next outage
        # The server read its clock at some moment of the round trip, at the latest when
        # the answer arrived: counting from there, this clock is never ahead of the
        # server's (so never starts a job early), and behind by at most the shortest
        # round trip.
        self._base = (server_ns, after)
        self._offset = (server_ns - wall_ns) / _NS
        return self._offset

    def due(self) -> bool:
        """Whether the last reading is older than ``interval`` (or there is none)."""
        attempted = self._attempted_ns
        return attempted is None or time.monotonic_ns() - attempted >= self.interval * _NS

    def time_ns(self) -> int:
        """The server's time now, in nanoseconds since the epoch."""
        now = time.monotonic_ns()
        attempted = self._attempted_ns
        if attempted is None or now - attempted > 2 * self.interval * _NS:
            # Never read, or stale: nobody reads it on a schedule here (a consumer does, on
            # its heartbeat, so that its job threads never query for the time).
            self.sync()
            now = time.monotonic_ns()
        base = self._base
        if base is None:
            return time.time_ns()  # unreadable so far: this host's clock (warned once)
        return base[0] + (now - base[1])

    def time(self) -> float:
        """The server's time now, in seconds since the epoch."""
        return self.time_ns() / _NS

    def now(self) -> datetime:
        """The server's time now, as an aware UTC datetime (what ``timezone.now()`` gives)."""
        # Exact to the microsecond (as a datetime stores it), truncated: never later than
        # time_ns(), which a float timestamp's rounding could make it.
        return _EPOCH + timedelta(microseconds=self.time_ns() // 1000)

    def offset(self) -> float | None:
        """Seconds this host's wall clock is behind the server's, at the last reading."""
        return self._offset

    def _unreadable(self, exc: BaseException) -> None:
        if not self._unreadable_warned:
            self._unreadable_warned = True
            logger.warning(
                "Could not read the database server's clock (%s): using this host's clock "
                "until it can be read. Due times and leases are only as right as it is.",
                exc,
            )


def report_offset(offset: float | None, worker_id: str) -> None:
    """Log a consumer's offset: a warning if it is over ``CLOCK_OFFSET_WARNING``."""
    if offset is None:
        return
    limit = settings.CLOCK_OFFSET_WARNING.total_seconds()
    if abs(offset) > limit:
        logger.warning(
            "Consumer %s: this host's clock is %.3f s %s the database server's (more than "
            "%g s). Due times and leases use the server's clock, so jobs still run on time; "
            "fix this host's time synchronisation (NTP) all the same.",
            worker_id,
            abs(offset),
            "behind" if offset > 0 else "ahead of",
            limit,
        )
    else:
        logger.info("Consumer %s: clock offset to the database server %+.4f s.", worker_id, offset)


#: The process's shared clock.
shared = SharedClock()


def now() -> datetime:
    """The shared time (the database server's), as an aware UTC datetime."""
    return shared.now()


def time_ns() -> int:
    """The shared time in nanoseconds since the epoch."""
    return shared.time_ns()


def epoch() -> float:
    """The shared time in seconds since the epoch."""
    return shared.time()
