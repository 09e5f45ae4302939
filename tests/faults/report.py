"""Render docs/reliability.md from the fault suite's latest results.

    python -m tests.faults.report [--results RESULTS_JSON] [--output MARKDOWN]

The defaults are build/faults/results.json (or $DELAYJOBS_FAULTS_RESULTS) and
docs/reliability.md.

Standard library only: it reads the JSON that the suite wrote (tests/faults/results.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.faults.results import REPO_ROOT, results_path

DEFAULT_OUTPUT = REPO_ROOT / "docs" / "reliability.md"
ORDER = "abcdefg"


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _secs(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.2f} s"


def _spread(value: Any) -> str:
    """Percentiles in seconds, shown in milliseconds."""
    if not value:
        return "n/a"
    return " · ".join(f"{name} {value[name] * 1000:,.1f} ms" for name in ("p50", "p99", "max"))


def _mapping(value: Any) -> str:
    return ", ".join(f"{key} {_count(n)}" for key, n in sorted(value.items()))


#: Scenario figures shown in its table, in this order, when present: key, label, format.
ROWS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("scheduled", "jobs scheduled", _count),
    ("scheduled_during_outage", "of which scheduled while Redis was down", _count),
    ("cancelled", "cancelled before they were due", _count),
    ("cancelled_ran", "cancelled jobs that ran (must be 0)", _count),
    ("executions", "executions in the ledger", _count),
    ("lost", "**lost** (scheduled, not cancelled, never ran; must be 0)", _count),
    ("duplicates", "duplicate executions (beyond one per job)", _count),
    ("duplicates_explained_by_lease_expiry", "of which repeat a lease-expired attempt", _count),
    ("in_flight_bound", "in flight in the faulted consumers (bound on duplicates)", _count),
    (
        "outcomes_committed_after_kill",
        "of which recorded by the killed consumer's last, in-flight commit",
        _count,
    ),
    ("running_at_snapshot", "running rows just before the cut", _count),
    ("attempts_run_twice", "attempts executed twice (must be 0)", _count),
    ("started_before_run_at", "executions started before run_at (must be 0)", _count),
    ("final_statuses", "final rows", _mapping),
    ("executions_per_worker", "executions per consumer", _mapping),
    ("scheduled_jobs_at_fault", "jobs still scheduled at the flush", _count),
    ("jobs_due_during_outage", "jobs due during the outage", _count),
    (
        "jobs_due_during_outage_run_after_redis_returned",
        "of which waited for Redis (must be 0)",
        _count,
    ),
    ("executions_during_outage", "executions while Redis was down", _count),
    ("lateness_during_outage_s", "lateness of jobs due during the outage", _spread),
    ("database_mode_lines", "'claiming due jobs from the database' lines", _mapping),
    ("lateness_after_fault_s", "lateness of jobs due after the fault", _spread),
    ("running_at_sigterm", "jobs running at SIGTERM (all finished)", _count),
    ("started_after_sigterm", "jobs started after SIGTERM (the claim it interrupted)", _count),
    ("drained_and_exited_after_s", "SIGTERM to exit 0", _secs),
    ("postgres_start_s", "PostgreSQL start until it accepted connections", _secs),
    ("killed_jobs_rerun_after_s", "kill to the last killed job run again", _secs),
    ("executions_resumed_after_s", "fault to executions resuming", _secs),
    ("drain_s", "due instant to the last job started", _secs),
    ("jobs_per_second", "jobs per second, four consumers", _count),
    ("start_after_schedule_returned_s", "start after schedule() returned", _spread),
    ("start_after_schedule_many_returned_s", "start after schedule_many() returned", _spread),
    ("recovery_s", "**time to recover**", _secs),
    ("all_final_after_s", "fault (or due instant) to every row final", _secs),
    ("total_seconds", "scenario run time", _secs),
]


def render(data: dict[str, Any]) -> str:
    scenarios = [data["scenarios"][key] for key in ORDER if key in data["scenarios"]]
    if not scenarios:
        raise SystemExit("no scenario results: run `pytest -m faults tests/faults` first")
    lines = [
        "# Reliability under faults",
        "",
        "What happens to scheduled jobs when consumers are killed and Redis or PostgreSQL",
        "fail under load, measured by the fault-injection suite (`tests/faults/`) with real",
        "consumer processes, a real Redis and a real PostgreSQL. This page is generated from",
        "the suite's latest run:",
        "",
        "```bash",
        "DELAYJOBS_TEST_DB=postgres .venv/bin/python -m pytest -m faults tests/faults",
        ".venv/bin/python -m tests.faults.report   # build/faults/results.json -> this page",
        "```",
        "",
        "## Latest run",
        "",
        *_environments(scenarios),
        "",
        "| scenario | scheduled | cancelled | lost | duplicates (bound) | time to recover "
        "| all rows final after | checks |",
        "|---|--:|--:|--:|--:|--:|--:|:-:|",
        *[_summary_row(figures) for figures in scenarios],
        "",
        "*Duplicates* are executions beyond a job's first; the bound is what was in flight in",
        "the consumers the fault hit. *Time to recover* is defined per scenario below.",
        "",
    ]
    for figures in scenarios:
        lines += _section(figures)
    lines += METHOD.splitlines()
    return "\n".join(lines) + "\n"


def _environments(scenarios: Sequence[dict[str, Any]]) -> list[str]:
    """One line per distinct environment (one, unless scenarios were run separately)."""
    seen: dict[str, list[str]] = {}
    for figures in scenarios:
        env = figures["environment"]
        line = (
            f"{env['date']} · commit {env['commit']} · {env['nproc']} CPU ({env['cpu_model']}) · "
            f"{env['platform']} · Python {env['python']} · Django {env['django']} · "
            f"PostgreSQL {env['postgresql']} (fsync off) · Redis {env['redis']} · 1-min load "
            f"average {env['load_average'][0]} at the start"
        )
        seen.setdefault(line, []).append(figures["scenario"])
    if len(seen) == 1:
        return list(seen)
    return [f"- scenarios {', '.join(keys)}: {line}" for line, keys in seen.items()]


def _summary_row(figures: dict[str, Any]) -> str:
    return (
        f"| [{figures['scenario']}. {figures['title']}](#{_anchor(figures)}) "
        f"| {_count(figures['scheduled'])} | {_count(figures['cancelled'])} "
        f"| **{figures['lost']}** | {figures['duplicates']} ({figures['in_flight_bound']}) "
        f"| {_secs(figures.get('recovery_s'))} | {_secs(figures.get('all_final_after_s'))} "
        f"| {'pass' if figures['passed'] else '**FAIL**'} |"
    )


def _anchor(figures: dict[str, Any]) -> str:
    """GitHub's anchor of the section heading."""
    text = f"{figures['scenario']}. {figures['title']}".lower()
    kept = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def _section(figures: dict[str, Any]) -> list[str]:
    lines = [
        f"## {figures['scenario']}. {figures['title']}",
        "",
        f"Fault: {figures['fault']}.",
        "",
        "| | |",
        "|---|--:|",
    ]
    lines += [f"| {label} | {fmt(figures[key])} |" for key, label, fmt in ROWS if key in figures]
    lines += [
        "",
        f"Duplicates: {figures['duplicate_cause']}.",
        "",
        f"Time to recover: {figures['recovery_means']}.",
        "",
    ]
    if figures["problems"]:
        lines += ["**Failed checks:**", ""]
        lines += [f"- {problem}" for problem in figures["problems"]]
        lines.append("")
    return lines


METHOD = """## Method

**Servers.** The suite starts its own PostgreSQL 15 (a throwaway cluster, fsync off) and
Redis 6.2 (no persistence) on loopback ports, migrates the database with
`manage.py migrate`, and stops both by pid at the end; they are separate from the
servers of the main test run. Consumers are `manage.py run_delay_consumer --queue faults
--concurrency 10` processes (with the pre-loader inside, every second, window 5 s).
Jobs are scheduled and cancelled through the public API (`schedule`, `schedule_many`,
`cancel`) by a separate driver process (`tests/faults/driver.py`), as an application
would; the checks read the database directly.

**The ledger.** The job type `faults.ledger` (`tests/faults/jobs.py`) appends one line
`job_id attempt worker started_at` to a file per execution, with one `write()` on an
`O_APPEND` descriptor (atomic, so concurrent writers never interleave), then works
5 to 20 ms. A file, not a table, so that it keeps counting while the database or Redis
is down. Its lease (`time_to_run`) is 3 s, so jobs of a dead consumer come back within
seconds; consumers renew it by heartbeat while a job runs.

**Faults.**
- a: SIGKILL of one of two consumers by pid; a new consumer is started at once.
- b: `FLUSHALL` on the Redis server.
- c: Redis stopped with SIGTERM by pid, 30 s later a new server on the same port, empty.
  While it is down, 500 more jobs are scheduled and 300 are cancelled.
- d: PostgreSQL fast shutdown (SIGINT to the postmaster by pid), started again 5 s later
  on the same data directory and port. Nothing restarts the consumers.
- e: no fault: 20,000 jobs due at the same instant, four consumers.
- f: SIGTERM to the only consumer; a new one is started once it has exited.
- g: no fault: jobs whose `run_at` is already past, without the pre-loader and with an
  idle timeout of an hour, so only the hand-off at `schedule()` can make them run.

Each fault strikes in the thick of the load (after 1,000 executions; after 200 in c), and
the scenario then waits, by polling the database, until no row is scheduled or running.
Only the fault windows themselves (30 s, 5 s) are fixed waits.

**Checks**, the same for every scenario (`FaultRun.verify`), comparing the ledger with the
jobs scheduled and with the rows delayjobs wrote:
- *lost*: every job scheduled and not cancelled executed at least once (must be 0);
- no cancelled job executed;
- no attempt (job, attempt number) executed twice: each claim has one winner;
- every execution has its `JobAttempt` row, and none started before its `run_at`;
- every row ends `succeeded` or `cancelled`;
- *duplicates*: executions beyond one per job. Each must repeat an attempt that has a
  `lease_expired` attempt row, and belong to a job that was in flight in a consumer the
  fault hit; their number is at most what was in flight there.

**Why duplicates happen, and why they are bounded.** Delivery is at least once. A job
runs only after a conditional `scheduled → running` update in the database, so two
executions of the same attempt are impossible. A job runs again only when its lease
expired: its consumer died (a) or could not reach the database to renew the lease or
record the outcome (d), and the pre-loader returned the row to `scheduled` with a
`lease_expired` attempt row. Only jobs running in such a consumer at that moment can
repeat, so duplicates are bounded by what was in flight there: at most its concurrency
plus outcomes not yet recorded. A consumer that is stopped with SIGTERM finishes and
records its running jobs first, so it causes none (f); losing Redis costs no lease, so
neither do b and c.
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--results", type=Path, default=results_path())
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    try:
        data = json.loads(args.results.read_text())
    except OSError as exc:
        raise SystemExit(f"cannot read {args.results}: {exc}. Run the fault suite first.") from exc
    args.output.write_text(render(data))
    sys.stdout.write(f"wrote {args.output}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
