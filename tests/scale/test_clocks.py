"""Consumers whose host clocks are off, or jump, on one shared database clock.

Each consumer here runs with its Python wall clock (``time.time``, ``timezone.now``) shifted
by ``tests.skewed_clock``; the ledger job records its start with the host's real clock,
which on this one host is also the database server's. delayjobs must take every due and
lease decision on the database server's clock (``delayjobs.core.clock``): no job may start
before its run_at by the real clock, and no consumer may take over a lease that another
still renews. Before that clock, a consumer 3 s fast started jobs up to 3 s early, and one
30 s fast took over live leases.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.consumers import check_alive
from tests.faults.harness import Execution, FaultRun, RunFactory, percentiles
from tests.skewed_clock import SKEW_FILE_ENV

#: Long jobs: most of their 3 s lease (LedgerJob.time_to_run), renewed by the heartbeat.
LONG_JOBS = 20
LONG_WORK_MS = 2500
#: Short jobs due 40 ms apart: the load under which skewed host clocks started jobs early.
SHORT_JOBS = 150
SHORT_SPREAD = 6.0
CONCURRENCY = 20
#: How early a start may be (5 ms); with the database's clock, starts are never early at all.
EARLY_BOUND = 0.005


def skew_file(directory: Path, name: str, seconds: float) -> Path:
    path = directory / f"{name}.skew"
    set_skew(path, seconds)
    return path


def set_skew(path: Path, seconds: float) -> None:
    """Make the consumer reading ``path`` see its clock jump to this offset."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(f"{seconds:+}\n")
    temporary.replace(path)


def schedule_load(run: FaultRun) -> None:
    """Long jobs first (they hold leases while the rest runs), then short ones."""
    run.schedule(LONG_JOBS, start_in=1.0, work_ms=LONG_WORK_MS)
    run.schedule(SHORT_JOBS, start_in=1.5, spread=SHORT_SPREAD, work_ms=5)


def earliness(run: FaultRun, executions: list[Execution]) -> list[float]:
    """Per execution, how long before its run_at it started (negative: after)."""
    return [run.run_at[e.job_id] - e.started for e in executions if e.job_id in run.run_at]


def check_timing(run: FaultRun, executions: list[Execution]) -> None:
    early = earliness(run, executions)
    worst = max(early)
    run.check(
        worst <= EARLY_BOUND,
        f"a job started {worst * 1000:.3f} ms before its run_at by the server's clock",
    )
    run.figures.update(
        most_early_ms=round(worst * 1000, 3),
        lateness_s=percentiles([-value for value in early]),
    )


def wait_offsets(
    run: FaultRun, workers: list[str], timeout: float = 30.0
) -> dict[str, float | None]:
    """The offsets once every one of ``workers`` has reported one: a consumer writes its
    heartbeat row after its first claim, which may come after it listens."""
    deadline = time.monotonic() + timeout
    measured = offsets(run)
    while any(measured.get(worker) is None for worker in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
        measured = offsets(run)
    return measured


def offsets(run: FaultRun) -> dict[str, float | None]:
    """Each live consumer's clock offset as its heartbeat row reports it."""
    rows = run.query('SELECT worker_id, clock_offset FROM "delayjobs_consumer"')
    return dict(rows)


def test_consumers_60_s_fast_and_slow_start_nothing_early_and_keep_leases(
    fault_run: RunFactory, tmp_path: Path
) -> None:
    run = fault_run("clock-skew", "Consumers 60 s fast and 60 s slow on one database clock")
    fast = run.start_consumer(
        "fast-60s",
        concurrency=CONCURRENCY,
        env={SKEW_FILE_ENV: str(skew_file(tmp_path, "fast", +60))},
    )
    slow = run.start_consumer(
        "slow-60s",
        concurrency=CONCURRENCY,
        env={SKEW_FILE_ENV: str(skew_file(tmp_path, "slow", -60))},
    )
    run.wait_listening([fast, slow])
    measured = wait_offsets(run, ["fast-60s", "slow-60s"])
    # The heartbeat row says how far each host's clock is from the server's.
    fast_offset, slow_offset = measured.get("fast-60s"), measured.get("slow-60s")
    run.check(
        fast_offset is not None and abs(fast_offset + 60) < 1,
        f"the fast consumer's offset reads {fast_offset}, not about -60 s",
    )
    run.check(
        slow_offset is not None and abs(slow_offset - 60) < 1,
        f"the slow consumer's offset reads {slow_offset}, not about +60 s",
    )

    schedule_load(run)
    run.wait_final([fast, slow])
    check_alive([fast, slow])
    # No fault: no consumer lost a lease, so not one job may run twice.
    executions = run.verify(in_flight=())
    check_timing(run, executions)
    workers = {e.worker for e in executions}
    run.check(workers == {"fast-60s", "slow-60s"}, f"only {sorted(workers)} ran jobs")
    run.finish(
        fault="two consumers, one host clock 60 s fast and one 60 s slow (Python's wall "
        f"clock shifted); {LONG_JOBS} jobs of 2.5 s on a 3 s lease and {SHORT_JOBS} jobs "
        "due 40 ms apart",
        measured_offsets_s={worker: round(value or 0.0, 4) for worker, value in measured.items()},
    )


def test_a_clock_that_jumps_during_the_run(fault_run: RunFactory, tmp_path: Path) -> None:
    run = fault_run("clock-jump", "A consumer clock that jumps +60 s, then -60 s, mid-run")
    jumps = skew_file(tmp_path, "jumpy", 0)
    jumpy = run.start_consumer("jumpy", concurrency=CONCURRENCY, env={SKEW_FILE_ENV: str(jumps)})
    steady = run.start_consumer("steady", concurrency=CONCURRENCY)
    run.wait_listening([jumpy, steady])

    schedule_load(run)
    # Mid-run, while the long jobs hold their leases: forward a minute, then back two.
    run.wait_executions(LONG_JOBS + 20, [jumpy, steady])
    set_skew(jumps, +60)
    run.wait_executions(LONG_JOBS + 70, [jumpy, steady])
    set_skew(jumps, -60)
    run.wait_final([jumpy, steady])
    check_alive([jumpy, steady])

    executions = run.verify(in_flight=())
    check_timing(run, executions)
    run.check(
        any(e.worker == "jumpy" for e in executions), "the consumer whose clock jumped ran nothing"
    )
    run.finish(
        fault="one of two consumers has its Python wall clock jump +60 s, then to -60 s, "
        f"while {LONG_JOBS} jobs of 2.5 s hold 3 s leases and {SHORT_JOBS} jobs come due "
        "40 ms apart"
    )
