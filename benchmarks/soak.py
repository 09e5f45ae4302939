"""W7, the soak: minutes at a steady fraction of W2's capacity, with pruning running.

One consumer (``manage.py run_delay_consumer``) runs jobs scheduled at a steady rate, each
second's jobs spread evenly over that second and scheduled a few seconds ahead, while
``prune_delay_jobs`` deletes what finished minutes ago, as a production cron would. Each
minute reports the lateness of the jobs that started in it (from delayjobs' own attempt
rows, read before the pruning deletes them), the consumer's RSS, and the jobs tables' and
indexes' size with their dead tuples: p99 drift from the first minute to the last, RSS
flat or growing, and how much bloat autovacuum leaves behind.

Usage: ``python -m benchmarks.soak [--minutes 10] [--rate JOBS_PER_S | --fraction 0.7]
[--body noop|redis|orm|http|sleep10]``.
Without ``--rate`` it first measures W2 capacity (a burst of 20,000 due jobs) and runs at
``--fraction`` of it. Results: ``build/benchmarks/soak-latest.{json,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks import OUTPUT_DIR, bodies, core, harness
from benchmarks.delay_jobs import BENCH_JOB_TYPE, BENCH_QUEUE

LEAD = 3.0  # seconds between scheduling a second's jobs and the first of them being due
PRUNE_EVERY = 60.0
PRUNE_OLDER_THAN = "3m"  # finished jobs kept this long, so each minute is read before
READ_DELAY = 5.0  # after a minute ends, before its attempts are read (all recorded)


@dataclass
class Minute:
    minute: int
    jobs: int
    lateness_ms: dict[str, float | None]
    rss_mb: float
    jobs_table_mb: float
    jobs_indexes_mb: float
    attempts_table_mb: float
    dead_tuples: int
    live_tuples: int
    autovacuums: int


@dataclass
class SoakResult:
    rate: float
    minutes: int
    concurrency: int
    capacity: float | None
    per_minute: list[Minute] = field(default_factory=list)
    missing: int = 0
    prune_runs: int = 0

    def summary(self) -> dict[str, Any]:
        first, last = self.per_minute[0], self.per_minute[-1]
        p99_first, p99_last = first.lateness_ms["p99"], last.lateness_ms["p99"]
        drift = (p99_last - p99_first) / p99_first if p99_first and p99_last else None
        return {
            "p99_first_minute_ms": p99_first,
            "p99_last_minute_ms": p99_last,
            "p99_drift": drift,
            "max_ms_overall": max(m.lateness_ms["max"] or 0 for m in self.per_minute),
            "rss_first_mb": first.rss_mb,
            "rss_last_mb": last.rss_mb,
            "jobs_table_mb_first_last": (first.jobs_table_mb, last.jobs_table_mb),
            "jobs_indexes_mb_first_last": (first.jobs_indexes_mb, last.jobs_indexes_mb),
            "dead_tuples_last": last.dead_tuples,
            "missing": self.missing,
        }


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def table_stats() -> dict[str, float | int]:
    """Sizes (MB) of the job and attempt tables and the job table's indexes, with dead
    and live tuples and the autovacuum count, from PostgreSQL's statistics."""
    from django.db import connection

    from delayjobs.models import DelayedJob, JobAttempt

    jobs, attempts = DelayedJob._meta.db_table, JobAttempt._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_table_size(%s), pg_indexes_size(%s), pg_table_size(%s), "
            "n_dead_tup, n_live_tup, autovacuum_count FROM pg_stat_user_tables "
            "WHERE relname = %s",
            [jobs, jobs, attempts, jobs],
        )
        table, indexes, attempts_size, dead, live, vacuums = cursor.fetchone()
    mb = 1024 * 1024
    return {
        "jobs_table_mb": table / mb,
        "jobs_indexes_mb": indexes / mb,
        "attempts_table_mb": attempts_size / mb,
        "dead_tuples": dead,
        "live_tuples": live,
        "autovacuums": vacuums,
    }


def minute_lateness(start: datetime, minute: int) -> tuple[int, dict[str, float | None]]:
    """Lateness of the attempts of jobs due in minute ``minute`` of the soak."""
    from delayjobs.models import JobAttempt

    begin = start + timedelta(minutes=minute)
    values = JobAttempt.objects.filter(
        job__run_at__gte=begin, job__run_at__lt=begin + timedelta(minutes=1)
    ).values_list("lateness", flat=True)
    late = [value.total_seconds() * 1000 for value in values]
    return len(late), harness.lateness_summary(late)


def schedule_second(first_due: datetime, rate: int) -> None:
    import delayjobs

    step = timedelta(seconds=1 / rate)
    delayjobs.schedule_many(
        [{"job_type": BENCH_JOB_TYPE, "run_at": first_due + step * index} for index in range(rate)]
    )


class Pruner(threading.Thread):
    """``prune_delay_jobs --older-than 3m`` once a minute, as a cron would."""

    def __init__(self, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="soak-pruner")
        self.stop_event = stop
        self.runs = 0

    def run(self) -> None:
        from django.core.management import call_command
        from django.db import connection

        while not self.stop_event.wait(PRUNE_EVERY):
            call_command("prune_delay_jobs", f"--older-than={PRUNE_OLDER_THAN}", verbosity=0)
            self.runs += 1
        connection.close()


def soak(minutes: int, rate: int, concurrency: int, run_dir: Path) -> SoakResult:
    from django.utils import timezone

    harness.reset_state()
    result = SoakResult(rate=rate, minutes=minutes, concurrency=concurrency, capacity=None)
    stop = threading.Event()
    pruner = Pruner(stop)
    log_path = run_dir / "consumer-soak.log"
    with harness.Consumer(concurrency, log_path).start(BENCH_QUEUE) as consumer:
        start = timezone.now() + timedelta(seconds=LEAD)
        started = time.monotonic()
        pruner.start()
        next_read = 0
        for second in range(minutes * 60):
            # Each second's jobs are scheduled LEAD seconds before the first is due.
            harness_sleep_until(started + second)
            schedule_second(start + timedelta(seconds=second), rate)
            if second >= (next_read + 1) * 60 + READ_DELAY:
                result.per_minute.append(read_minute(start, next_read, consumer.pid))
                next_read += 1
        harness_sleep_until(started + minutes * 60 + LEAD + READ_DELAY)
        while next_read < minutes:
            result.per_minute.append(read_minute(start, next_read, consumer.pid))
            next_read += 1
        stop.set()
        pruner.join()
    result.prune_runs = pruner.runs
    result.missing = minutes * 60 * rate - sum(m.jobs for m in result.per_minute)
    return result


def read_minute(start: datetime, minute: int, pid: int) -> Minute:
    jobs, lateness = minute_lateness(start, minute)
    minute_result = Minute(
        minute=minute + 1, jobs=jobs, lateness_ms=lateness, rss_mb=rss_mb(pid), **table_stats()
    )
    print(
        f"  minute {minute + 1}: {jobs} jobs, p50 {fmt(lateness['p50'])} p99 "
        f"{fmt(lateness['p99'])} max {fmt(lateness['max'])} ms, RSS {minute_result.rss_mb:.1f} MB, "
        f"jobs table {minute_result.jobs_table_mb:.1f} MB + indexes "
        f"{minute_result.jobs_indexes_mb:.1f} MB, dead tuples {minute_result.dead_tuples}",
        flush=True,
    )
    return minute_result


def harness_sleep_until(moment: float) -> None:
    delay = moment - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def measure_capacity(concurrency: int, run_dir: Path) -> float:
    """W2-like: jobs per second draining 20,000 due jobs with one consumer."""
    config = core.Config(burst_jobs=20_000)
    run = core.run_timed_workload("burst", config, concurrency, run_dir)
    if not run.jobs_per_second:
        raise RuntimeError("the capacity burst did not complete")
    return run.jobs_per_second


def render(result: SoakResult, machine: dict[str, Any]) -> str:
    summary = result.summary()
    lines = [
        "# W7 soak",
        "",
        f"{result.minutes} minutes at {result.rate} jobs/s"
        + (f" (capacity {result.capacity:.0f} jobs/s)" if result.capacity else "")
        + f", job body `{bodies.selected()}`, one consumer at --concurrency "
        f"{result.concurrency}, prune_delay_jobs "
        f"--older-than {PRUNE_OLDER_THAN} every {PRUNE_EVERY:.0f} s ({result.prune_runs} runs). "
        f"Machine: {machine.get('cpu_model', '?')}, {machine.get('nproc', '?')} CPUs.",
        "",
        "| minute | jobs | p50 ms | p99 ms | max ms | RSS MB | jobs table MB | indexes MB "
        "| attempts MB | dead tuples | autovacuums |",
        "| --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |",
    ]
    for m in result.per_minute:
        late = m.lateness_ms
        lines.append(
            f"| {m.minute} | {m.jobs} | {fmt(late['p50'])} | {fmt(late['p99'])} | "
            f"{fmt(late['max'])} | {m.rss_mb:.1f} | {m.jobs_table_mb:.1f} | "
            f"{m.jobs_indexes_mb:.1f} | {m.attempts_table_mb:.1f} | {m.dead_tuples} | "
            f"{m.autovacuums} |"
        )
    drift = summary["p99_drift"]
    lines += [
        "",
        f"p99 first minute {fmt(summary['p99_first_minute_ms'])} ms, last "
        f"{fmt(summary['p99_last_minute_ms'])} ms: drift "
        + ("-" if drift is None else f"{drift:+.1%}")
        + f"; RSS {summary['rss_first_mb']:.1f} -> {summary['rss_last_mb']:.1f} MB; "
        f"missing {summary['missing']}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--rate", type=int, help="jobs per second (default: measured)")
    parser.add_argument("--fraction", type=float, default=0.7, help="of measured capacity")
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--body", choices=bodies.BODIES, default=bodies.DEFAULT, help=bodies.HELP)
    parser.add_argument("--output-dir", type=Path, default=OUTPUT_DIR)
    args = parser.parse_args()
    if args.minutes < 2:
        parser.error("--minutes: at least 2, to compare a first and a last minute")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate: a positive number of jobs per second")
    if not 0 < args.fraction <= 1:
        parser.error("--fraction: between 0 and 1")
    run_dir = Path(tempfile.mkdtemp(prefix="delayjobs-soak-"))
    bodies.select(args.body)
    with harness.services(durable=True), contextlib.ExitStack() as stack:
        harness.setup_django()
        stack.enter_context(bodies.prepared([args.body]))
        machine = harness.machine_info()
        capacity = None
        rate = args.rate
        if rate is None:
            capacity = measure_capacity(args.concurrency, run_dir)
            rate = int(capacity * args.fraction)
            print(f"  capacity {capacity:.0f} jobs/s: soaking at {rate} jobs/s", flush=True)
        result = soak(args.minutes, rate, args.concurrency, run_dir)
        result.capacity = capacity
    text = render(result, machine)
    print(text)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "soak-latest.md").write_text(text)
    report = {"machine": machine, "summary": result.summary(), **asdict(result)}
    (args.output_dir / "soak-latest.json").write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
