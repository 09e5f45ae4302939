"""The supervisor's decisions on a child's exit (restart, back-off, done, stop), and how the
command counts and names its processes. No process is forked here: the exits are told to
the supervisor as its loop would tell them; tests/e2e/test_supervisor.py runs the real
thing."""

from __future__ import annotations

import logging
import time

import pytest
from django.core.management import CommandError

from delayjobs.engine.supervisor import (
    EXIT_CONFIG,
    RESTART_BACKOFF_CAP,
    STABLE_AFTER,
    Child,
    Supervisor,
    describe_status,
    usable_cpus,
)
from delayjobs.management.commands.run_delay_consumer import how_many, worker_names


def no_child(slot: int) -> int:
    raise AssertionError("no child runs in these tests")


def exits(supervisor: Supervisor, slot: int, code: int, *, ran: float = 0.0) -> float | None:
    """Child ``slot`` exited with ``code`` after ``ran`` seconds: the seconds its restart
    waits (None: it is not started again)."""
    supervisor.child_exited(Child(slot, pid=4242, started=time.monotonic() - ran), code)
    restarted = supervisor.slots[slot]
    return None if restarted.restart_at is None else restarted.waited


def test_a_child_that_ran_a_while_is_started_again_at_once_whatever_came_before() -> None:
    supervisor = Supervisor(2, no_child)
    for _ in range(5):
        exits(supervisor, 1, 1)
    assert exits(supervisor, 1, -9, ran=STABLE_AFTER + 1) == 0.0
    assert supervisor.slots[1].quick_deaths == 0


def test_a_child_that_dies_at_start_again_and_again_waits_longer_each_time() -> None:
    supervisor = Supervisor(2, no_child)
    delays = [exits(supervisor, 2, 1) for _ in range(10)]
    assert delays[0] == 0.0  # the first death may be bad luck
    # Equal jitter: between half the ceiling and the ceiling, which doubles up to the cap.
    for delay, ceiling in zip(delays[1:], [1, 2, 4, 8, 16, 32, 60, 60, 60], strict=True):
        assert delay is not None
        assert ceiling / 2 <= delay <= ceiling
    assert max(d for d in delays if d is not None) <= RESTART_BACKOFF_CAP.total_seconds()
    assert supervisor.slots[1].restart_at is None  # the other slot is left alone


def test_each_restart_is_logged_as_a_warning_with_the_exit_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    supervisor = Supervisor(2, no_child)
    with caplog.at_level(logging.WARNING, logger="delayjobs.supervisor"):
        exits(supervisor, 2, -9)
        exits(supervisor, 2, 3)
    first, second = caplog.records
    assert first.levelno == second.levelno == logging.WARNING
    assert first.getMessage() == (
        "Consumer process 2 of 2 (pid 4242) exited (killed by SIGKILL); starting it again now."
    )
    assert second.getMessage().startswith(
        "Consumer process 2 of 2 (pid 4242) exited (exit code 3); starting it again in "
    )


def test_a_child_that_cannot_start_as_configured_stops_the_supervisor() -> None:
    supervisor = Supervisor(2, no_child)
    assert exits(supervisor, 1, EXIT_CONFIG) is None
    assert supervisor.stopping


def test_a_stop_cancels_the_restarts_waiting_and_exits_end_the_slots() -> None:
    supervisor = Supervisor(2, no_child)
    exits(supervisor, 1, 1)
    exits(supervisor, 1, 1)
    supervisor.stop("SIGTERM")
    assert supervisor.slots[1].restart_at is None
    assert exits(supervisor, 2, 0) is None
    assert supervisor.slots[2].final == 0


def test_in_burst_mode_a_child_that_exits_is_done() -> None:
    supervisor = Supervisor(2, no_child, burst=True)
    assert exits(supervisor, 1, 0) is None
    assert exits(supervisor, 2, 1) is None
    assert (supervisor.slots[1].final, supervisor.slots[2].final) == (0, 1)


def test_exit_statuses_in_words() -> None:
    assert describe_status(0) == "exit code 0"
    assert describe_status(3) == "exit code 3"
    assert describe_status(-9) == "killed by SIGKILL"


def test_auto_is_one_process_with_celery_and_a_number_is_that_number() -> None:
    # One per CPU otherwise, but one on SQLite: tests/e2e/test_supervisor.py, which runs on
    # both databases (these tests have SQLite settings).
    assert usable_cpus() >= 1
    assert how_many("auto", "celery") == 1
    assert how_many("auto", "local", burst=True) == 1  # a drain, in the caller's process
    assert how_many(3, "local") == 3
    assert how_many(3, "local", burst=True) == 3


def test_a_worker_id_names_each_process() -> None:
    assert worker_names(None, 3) == [None, None, None]
    assert worker_names("w", 1) == ["w"]
    assert worker_names("w", 3) == ["w-1", "w-2", "w-3"]
    with pytest.raises(CommandError, match=r"--worker-id 'w+\.\.\. \(process 1\): use 1-255"):
        worker_names("w" * 254, 2)
    with pytest.raises(CommandError, match="--worker-id 42: use 1-255"):
        worker_names(42, 2)
