"""The one clock (delayjobs.core.clock): the database server's, kept by the monotonic clock."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from delayjobs.core import clock
from delayjobs.core.clock import SharedClock, read_database_time
from delayjobs.engine.execution import wait_until
from delayjobs.models import Consumer
from tests.integration.test_stats import consumer

pytestmark = pytest.mark.django_db

SKEW = 60.0


def real_ns() -> int:
    """The host's clock as C reads it: what a skewed Python clock does not change."""
    return time.clock_gettime_ns(time.CLOCK_REALTIME)


@pytest.fixture
def fast_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's wall clock, as Python reads it, a minute fast."""
    real_time, real_time_ns, real_now = time.time, time.time_ns, timezone.now
    monkeypatch.setattr(time, "time", lambda: real_time() + SKEW)
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + int(SKEW * 1e9))
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=SKEW))
    yield
    # The process's shared clock, if a test synced it here, would otherwise report this
    # host a minute fast to the tests after it.
    monkeypatch.undo()
    clock.shared.sync()


def test_the_database_server_clock_is_read():
    # On this one host the server's clock is the host's: the reading is the real time.
    before = real_ns() / 1e9
    server = read_database_time()
    after = real_ns() / 1e9
    assert before - 0.002 <= server <= after  # SQLite's 'now' has millisecond steps


def test_a_fast_host_keeps_the_servers_time_and_reports_its_offset(fast_host):
    shared = SharedClock()
    offset = shared.sync()
    assert offset == pytest.approx(-SKEW, abs=0.5)
    assert shared.now() == pytest.approx(datetime.now(UTC), abs=timedelta(seconds=0.5))


def test_the_shared_clock_is_never_ahead_of_the_servers():
    shared = SharedClock()
    for _ in range(3):
        shared.sync()
        for _ in range(200):
            # Read ours first: the server's, read after it, can only be later or equal.
            ours = shared.time_ns()
            assert ours <= real_ns()


def test_waiting_for_a_due_time_ignores_a_wall_clock_jump(fast_host):
    clock.shared.sync()
    due = clock.time_ns() + 50_000_000  # 50 ms from now, on the server's clock
    wait_until(due)
    # The wall clock reads a minute ahead: a wait on it would have returned at once.
    assert real_ns() >= due


def test_an_unreadable_clock_falls_back_to_the_hosts_and_warns_once(caplog):
    calls = 0

    def unreadable() -> float:
        nonlocal calls
        calls += 1
        raise NotImplementedError("no server clock query for this database")

    shared = SharedClock(read_server=unreadable, interval=3600)
    with caplog.at_level(logging.WARNING, logger="delayjobs.clock"):
        first = shared.time_ns()
        second = shared.time_ns()
    assert abs(first - time.time_ns()) < 1_000_000_000
    assert second >= first
    assert shared.offset() is None
    # Asked once, not on every look at the time, and said once.
    assert calls == 1
    assert len([r for r in caplog.records if "Could not read" in r.message]) == 1


def test_a_reading_is_redone_once_it_is_old():
    readings = []

    def server() -> float:
        readings.append(time.time())
        return readings[-1]

    shared = SharedClock(read_server=server, interval=0.0)
    shared.sync()
    assert shared.due()
    count = len(readings)
    shared.time_ns()  # stale at once with a zero interval: read again
    assert len(readings) > count


def live_consumer(worker_id: str, offset: float | None) -> Consumer:
    return consumer(worker_id, timezone.now(), clock_offset=offset)


def test_status_shows_each_consumers_offset_and_flags_a_broken_clock():
    live_consumer("w-good", 0.0004)
    live_consumer("w-fast", -60.0)
    out = io.StringIO()
    call_command("delayjobs_status", stdout=out)
    lines = out.getvalue().splitlines()
    good = next(line for line in lines if line.startswith("  w-good "))
    fast = next(line for line in lines if line.startswith("  w-fast "))
    assert good.endswith("; clock offset +0.000 s")
    assert "clock offset -60.000 s (WARNING: this host's clock is off" in fast
    out = io.StringIO()
    call_command("delayjobs_status", "--json", stdout=out)
    consumers = {row["worker_id"]: row for row in json.loads(out.getvalue())["consumers"]}
    assert consumers["w-fast"]["clock_offset"] == -60.0
    assert consumers["w-fast"]["clock_skewed"] is True
    assert consumers["w-good"]["clock_skewed"] is False


def test_the_dashboard_flags_a_broken_clock(admin_client):
    live_consumer("w-fast", -60.0)
    page = admin_client.get(reverse("admin:delayjobs_delayedjob_dashboard")).content.decode()
    assert "-60.000 s" in page
    assert "clock off" in page
