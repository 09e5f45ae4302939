"""Core benchmark of delayjobs on real PostgreSQL and Redis: delayjobs alone.

Workloads, each run ``--runs`` times (medians reported), from a clean database and Redis:

- ``spread``: 1,000 jobs spread evenly over 10 seconds, one consumer already waiting:
  lateness (attempt start minus ``run_at``) p50/p95/p99/max. Target: p99 < 10 ms.
- ``burst``: 10,000 jobs due at the same instant, one consumer: drain time from the first
  attempt's start to the last attempt's end, and jobs per second. Target: >= 3,000 jobs/s.
- ``schedule``: ``schedule()`` called in a loop vs one ``schedule_many()`` for the same
  jobs: jobs per second and the ratio. Target: schedule_many at least 10x faster.

Jobs are created through the public API; the consumer is ``manage.py run_delay_consumer``
in a subprocess; every number comes from the ``JobAttempt`` rows delayjobs writes itself.

Each job runs the body chosen with ``--body`` (``benchmarks.bodies``; default ``noop``,
nothing at all).

Usage, from the repository root: ``python -m benchmarks.core [--runs 3] [--concurrency 10]
[--body noop|redis|orm|http|sleep10]``.
Results: a Markdown table on stdout, and ``build/benchmarks/core-latest.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks import OUTPUT_DIR, bodies, harness
from benchmarks.delay_jobs import BENCH_JOB_TYPE, BENCH_QUEUE

TARGET_P99_MS = 10.0
TARGET_JOBS_PER_SECOND = 3000.0
TARGET_SCHEDULE_RATIO = 10.0
WORKLOADS = ("spread", "burst", "schedule")


@dataclass(frozen=True)
class Config:
    runs: int = 3
    concurrency: tuple[int, ...] = (10,)
    workloads: tuple[str, ...] = WORKLOADS
    spread_jobs: int = 1000
    spread_seconds: float = 10.0
    burst_jobs: int = 10_000
    schedule_jobs: int = 1000
    lead_seconds: float = 2.0  # before the first run_at, plus time to schedule: _lead()
    timeout_seconds: float = 180.0
    conn_max_age: str = "0"  # Django's default; "none" for persistent connections
    durable: bool = True  # PostgreSQL flushes each commit to disk, as in production
    body: str = bodies.DEFAULT  # what each job does (benchmarks.bodies)
    output_dir: Path = OUTPUT_DIR


@dataclass
class RunResult:
    """One run of the spread or burst workload."""

    jobs: int
    scheduling_seconds: float
    lead_margin_seconds: float  # first run_at minus the end of scheduling (>0: in time)
    completed: bool
    lateness_ms: dict[str, float | None]
    missing: int
    duplicates: int
    drain_seconds: float | None
    jobs_per_second: float | None
    recorded_jobs_per_second: float | None
    jobs_per_claim: float | None  # mean jobs won per claim (one UPDATE + one SELECT)
    jobs_per_record: float | None  # mean jobs written per recorder transaction


@dataclass
class WorkloadResult:
    workload: str
    concurrency: int
    runs: list[RunResult] = field(default_factory=list)

    def median(self, pick: Callable[[RunResult], float | None]) -> float | None:
        return harness.median([pick(run) for run in self.runs])

    def summary(self) -> dict[str, Any]:
        return {
            "jobs": self.runs[0].jobs if self.runs else 0,
            "lateness_ms": {
                name: self.median(lambda run, name=name: run.lateness_ms[name])
                for name in ("p50", "p95", "p99", "max")
            },
            "missing_total": sum(run.missing for run in self.runs),
            "duplicates_total": sum(run.duplicates for run in self.runs),
            "incomplete_runs": sum(not run.completed for run in self.runs),
            "drain_seconds": self.median(lambda run: run.drain_seconds),
            "jobs_per_second": self.median(lambda run: run.jobs_per_second),
            "recorded_jobs_per_second": self.median(lambda run: run.recorded_jobs_per_second),
            "jobs_per_claim": self.median(lambda run: run.jobs_per_claim),
            "jobs_per_record": self.median(lambda run: run.jobs_per_record),
            "min_lead_margin_seconds": min((r.lead_margin_seconds for r in self.runs), default=0),
        }


@dataclass
class ScheduleRun:
    jobs: int
    loop_seconds: float
    many_seconds: float

    @property
    def loop_rate(self) -> float:
        return self.jobs / self.loop_seconds

    @property
    def many_rate(self) -> float:
        return self.jobs / self.many_seconds


# Workloads ------------------------------------------------------------------------------


def run_timed_workload(workload: str, config: Config, concurrency: int, run_dir: Path) -> RunResult:
    """One run of ``spread`` or ``burst``: clean state, consumer up, schedule, wait, measure."""
    harness.reset_state()
    if workload == "spread":
        jobs, offsets, paced = config.spread_jobs, _spread_offsets(config), config.spread_seconds
    else:
        jobs, offsets, paced = config.burst_jobs, [0.0] * config.burst_jobs, 0.0
    log_path = run_dir / f"consumer-{workload}-{concurrency}-{time.monotonic_ns()}.log"
    with harness.Consumer(concurrency, log_path).start(BENCH_QUEUE):
        first_due, scheduled_by, seconds = _schedule_at_offsets(offsets, _lead(config, jobs))
        completed = harness.wait_until_final(jobs, paced + config.timeout_seconds)
    return _measure(jobs, seconds, (first_due - scheduled_by).total_seconds(), completed)


def _spread_offsets(config: Config) -> list[float]:
    step = config.spread_seconds / config.spread_jobs
    return [index * step for index in range(config.spread_jobs)]


def _lead(config: Config, jobs: int) -> float:
    """Seconds from now to the first run_at: enough for schedule_many to commit first."""
    return config.lead_seconds + jobs / 5000


def _schedule_at_offsets(offsets: Sequence[float], lead: float) -> tuple[datetime, datetime, float]:
    """schedule_many() one job per offset after now + lead; (first run_at, end, seconds)."""
    from django.utils import timezone

    import delayjobs

    first_due = timezone.now() + timedelta(seconds=lead)
    specs = [
        {"job_type": BENCH_JOB_TYPE, "run_at": first_due + timedelta(seconds=offset)}
        for offset in offsets
    ]
    started = time.perf_counter()
    delayjobs.schedule_many(specs)
    seconds = time.perf_counter() - started
    return first_due, timezone.now(), seconds


def _measure(jobs: int, scheduling: float, margin: float, completed: bool) -> RunResult:
    found = harness.collect_executions()
    drain = recorded = None
    if found.first_start and found.last_finish:
        drain = (found.last_finish - found.first_start).total_seconds()
    if found.first_start and found.last_recorded:
        recorded = (found.last_recorded - found.first_start).total_seconds()
    executed = len(found.lateness_ms) - found.duplicates
    return RunResult(
        jobs=jobs,
        scheduling_seconds=scheduling,
        lead_margin_seconds=margin,
        completed=completed,
        lateness_ms=harness.lateness_summary(found.lateness_ms),
        missing=found.missing,
        duplicates=found.duplicates,
        drain_seconds=drain,
        jobs_per_second=executed / drain if drain else None,
        recorded_jobs_per_second=executed / recorded if recorded else None,
        jobs_per_claim=executed / found.claim_batches if found.claim_batches else None,
        jobs_per_record=executed / found.record_batches if found.record_batches else None,
    )


def run_schedule_workload(jobs: int) -> ScheduleRun:
    """schedule() in a loop (autocommit, as a view would) vs one schedule_many()."""
    import delayjobs

    delay = timedelta(minutes=30)  # like the unpaid order: outside the Redis window
    harness.reset_state()
    started = time.perf_counter()
    for _ in range(jobs):
        delayjobs.schedule(BENCH_JOB_TYPE, delay=delay)
    loop_seconds = time.perf_counter() - started
    harness.reset_state()
    specs = [{"job_type": BENCH_JOB_TYPE, "delay": delay} for _ in range(jobs)]
    started = time.perf_counter()
    delayjobs.schedule_many(specs)
    return ScheduleRun(jobs, loop_seconds, time.perf_counter() - started)


# Orchestration --------------------------------------------------------------------------


def run_all(config: Config, run_dir: Path) -> tuple[list[WorkloadResult], list[ScheduleRun]]:
    timed: list[WorkloadResult] = []
    for workload in ("spread", "burst"):
        if workload not in config.workloads:
            continue
        for concurrency in config.concurrency:
            result = WorkloadResult(workload, concurrency)
            for index in range(config.runs):
                run = run_timed_workload(workload, config, concurrency, run_dir)
                _progress(f"{workload} c={concurrency} run {index + 1}: {_brief(run)}")
                result.runs.append(run)
            timed.append(result)
    scheduling: list[ScheduleRun] = []
    if "schedule" in config.workloads:
        for index in range(config.runs):
            run = run_schedule_workload(config.schedule_jobs)
            _progress(
                f"schedule run {index + 1}: loop {run.loop_rate:.0f}/s, "
                f"schedule_many {run.many_rate:.0f}/s"
            )
            scheduling.append(run)
    return timed, scheduling


def _brief(run: RunResult) -> str:
    late = run.lateness_ms
    rate = f", {run.jobs_per_second:.0f} jobs/s" if run.jobs_per_second else ""
    return (
        f"p50 {_fmt(late['p50'])} ms, p99 {_fmt(late['p99'])} ms, max {_fmt(late['max'])} ms"
        f"{rate}, missing {run.missing}, duplicates {run.duplicates}"
    )


def _warn_if_busy(load: float, cpus: int) -> None:
    if load > cpus / 2:
        print(
            f"  warning: 1-min load average {load} on {cpus} CPU before starting; other work "
            f"on this machine will distort the numbers.",
            flush=True,
        )


def _progress(message: str) -> None:
    print(f"  {message}", flush=True)


# Report ---------------------------------------------------------------------------------


def build_report(
    config: Config,
    machine: dict[str, Any],
    timed: list[WorkloadResult],
    scheduling: list[ScheduleRun],
) -> dict[str, Any]:
    schedule_summary = None
    if scheduling:
        loop_rate = harness.median([run.loop_rate for run in scheduling])
        many_rate = harness.median([run.many_rate for run in scheduling])
        schedule_summary = {
            "jobs": scheduling[0].jobs,
            "loop_jobs_per_second": loop_rate,
            "many_jobs_per_second": many_rate,
            "ratio": many_rate / loop_rate if loop_rate and many_rate else None,
            "runs": [
                {**asdict(run), "loop_rate": run.loop_rate, "many_rate": run.many_rate}
                for run in scheduling
            ],
        }
    return {
        "machine": machine,
        "config": {**asdict(config), "output_dir": str(config.output_dir)},
        "targets": {
            "spread_p99_lateness_ms_below": TARGET_P99_MS,
            "burst_jobs_per_second_at_least": TARGET_JOBS_PER_SECOND,
            "schedule_many_ratio_at_least": TARGET_SCHEDULE_RATIO,
        },
        "workloads": [
            {
                "workload": result.workload,
                "concurrency": result.concurrency,
                "median": result.summary(),
                "runs": [asdict(run) for run in result.runs],
            }
            for result in timed
        ],
        "scheduling": schedule_summary,
    }


def render_markdown(report: dict[str, Any]) -> str:
    machine, config = report["machine"], report["config"]
    load_before, load_after = machine["load_average_at_start"][0], machine["load_average_at_end"][0]
    lines = [
        "# delayjobs core benchmark",
        "",
        f"{machine['date']} · commit {machine['commit']} · {machine['nproc']} CPU "
        f"({machine['cpu_model']}) · Python {machine['python']} · Django {machine['django']} · "
        f"PostgreSQL {machine['postgresql']} · Redis {machine['redis']} · "
        f"CONN_MAX_AGE {config['conn_max_age']} · PostgreSQL "
        f"{'durable (fsync on)' if config['durable'] else 'fsync off'} · 1-min load average "
        f"{load_before} before, {load_after} after · "
        f"medians of {config['runs']} run(s), one consumer process · job body "
        f"`{config.get('body', bodies.DEFAULT)}`",
        "",
        *_timed_table(report["workloads"]),
        *_schedule_table(report["scheduling"]),
        *_targets_table(report),
    ]
    return "\n".join(lines) + "\n"


def _timed_table(workloads: list[dict[str, Any]]) -> list[str]:
    if not workloads:
        return []
    lines = [
        "| workload | concurrency | jobs | lateness p50 ms | p95 ms | p99 ms | max ms "
        "| missing | duplicates | drain s | jobs/s executed | jobs/s recorded "
        "| jobs per claim | jobs per record |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for entry in workloads:
        summary, late = entry["median"], entry["median"]["lateness_ms"]
        if entry["workload"] == "spread":  # paced by run_at: drain and rate say nothing
            summary = {**summary, "drain_seconds": None, "jobs_per_second": None}
            summary["recorded_jobs_per_second"] = None
        lines.append(
            f"| {entry['workload']} | {entry['concurrency']} | {summary['jobs']} "
            f"| {_fmt(late['p50'])} | {_fmt(late['p95'])} | {_fmt(late['p99'])} "
            f"| {_fmt(late['max'])} | {summary['missing_total']} "
            f"| {summary['duplicates_total']} | {_fmt(summary['drain_seconds'], 2)} "
            f"| {_fmt(summary['jobs_per_second'], 0)} "
            f"| {_fmt(summary['recorded_jobs_per_second'], 0)} "
            f"| {_fmt(summary['jobs_per_claim'])} | {_fmt(summary['jobs_per_record'])} |"
        )
    lines += [
        "",
        "Lateness: `JobAttempt.lateness` (attempt start minus `run_at`). Drain: first attempt "
        "start to last attempt end; *recorded* runs to the last job row marked finished. "
        "Missing and duplicates are totals over all runs. The spread workload is paced by "
        "`run_at`, so it has no drain rate.",
        "",
    ]
    return lines


def _schedule_table(scheduling: dict[str, Any] | None) -> list[str]:
    if not scheduling:
        return []
    return [
        "| scheduling | jobs | jobs/s |",
        "|---|--:|--:|",
        f"| `schedule()` in a loop | {scheduling['jobs']} "
        f"| {_fmt(scheduling['loop_jobs_per_second'], 0)} |",
        f"| `schedule_many()` | {scheduling['jobs']} "
        f"| {_fmt(scheduling['many_jobs_per_second'], 0)} |",
        f"| ratio | | {_fmt(scheduling['ratio'], 1)}x |",
        "",
    ]


def _targets_table(report: dict[str, Any]) -> list[str]:
    rows: list[tuple[str, float | None, bool]] = []
    for entry in report["workloads"]:
        summary, label = entry["median"], f"c={entry['concurrency']}"
        clean = summary["missing_total"] == 0 and summary["duplicates_total"] == 0
        if entry["workload"] == "spread":
            p99 = summary["lateness_ms"]["p99"]
            met = clean and p99 is not None and p99 < TARGET_P99_MS
            rows.append((f"spread p99 lateness < {TARGET_P99_MS:.0f} ms ({label})", p99, met))
        else:
            rate = summary["jobs_per_second"]
            met = clean and rate is not None and rate >= TARGET_JOBS_PER_SECOND
            rows.append((f"burst >= {TARGET_JOBS_PER_SECOND:.0f} jobs/s ({label})", rate, met))
    if report["scheduling"]:
        ratio = report["scheduling"]["ratio"]
        met = ratio is not None and ratio >= TARGET_SCHEDULE_RATIO
        rows.append((f"schedule_many >= {TARGET_SCHEDULE_RATIO:.0f}x a loop", ratio, met))
    lines = ["| target | measured | met |", "|---|--:|:-:|"]
    lines += [
        f"| {name} | {_fmt(value, 1)} | {'yes' if met else '**no**'} |" for name, value, met in rows
    ]
    return [*lines, ""]


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def write_results(report: dict[str, Any], markdown: str, output_dir: Path) -> None:
    """Write core-latest.json and .md atomically (a .tmp file renamed into place)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("core-latest.json", json.dumps(report, indent=2, default=str) + "\n"),
        ("core-latest.md", markdown),
    ):
        temporary = output_dir / f"{name}.tmp"
        temporary.write_text(text)
        temporary.replace(output_dir / name)


# Command line ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.core", description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="runs per workload (default 3)")
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[10],
        help="consumer --concurrency values to measure (default 10)",
    )
    parser.add_argument(
        "--workload", choices=WORKLOADS, nargs="+", default=list(WORKLOADS), dest="workloads"
    )
    parser.add_argument("--spread-jobs", type=int, default=1000)
    parser.add_argument("--spread-seconds", type=float, default=10.0)
    parser.add_argument("--burst-jobs", type=int, default=10_000)
    parser.add_argument("--schedule-jobs", type=int, default=1000)
    parser.add_argument(
        "--conn-max-age",
        default="0",
        help="Django CONN_MAX_AGE of the benchmark database, seconds or 'none' (default 0, "
        "Django's default)",
    )
    parser.add_argument(
        "--no-fsync",
        action="store_false",
        dest="durable",
        help="run PostgreSQL without fsync (faster, unlike production; default: durable)",
    )
    parser.add_argument(
        "--body",
        choices=bodies.BODIES,
        default=bodies.DEFAULT,
        help=f"what each job does: {bodies.HELP}",
    )
    parser.add_argument("--output-dir", type=Path, default=OUTPUT_DIR)
    args = parser.parse_args(argv)
    return Config(
        runs=args.runs,
        concurrency=tuple(args.concurrency),
        workloads=tuple(args.workloads),
        spread_jobs=args.spread_jobs,
        spread_seconds=args.spread_seconds,
        burst_jobs=args.burst_jobs,
        schedule_jobs=args.schedule_jobs,
        conn_max_age=args.conn_max_age,
        durable=args.durable,
        body=args.body,
        output_dir=args.output_dir,
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    os.environ[harness.CONN_MAX_AGE_ENV] = config.conn_max_age
    bodies.select(config.body)
    with (
        harness.services(durable=config.durable),
        tempfile.TemporaryDirectory(prefix="delayjobs-bench-") as tmp,
    ):
        harness.setup_django()
        machine = harness.machine_info()
        print(
            f"Benchmarking on {machine['nproc']} CPU, PostgreSQL {machine['postgresql']}, "
            f"Redis {machine['redis']}:",
            flush=True,
        )
        _warn_if_busy(machine["load_average_at_start"][0], machine["nproc"] or 1)
        with bodies.prepared([config.body]):
            timed, scheduling = run_all(config, Path(tmp))
    machine["load_average_at_end"] = harness.load_average()
    report = build_report(config, machine, timed, scheduling)
    markdown = render_markdown(report)
    write_results(report, markdown, config.output_dir)
    print()
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
