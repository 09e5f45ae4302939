"""Async job types in one consumer process: throughput and memory.

For each body, ``--runs`` times from a clean database and Redis: one
``manage.py run_delay_consumer --concurrency C`` process starts and goes idle; its resident
set is read (idle RSS); N jobs due at one instant are scheduled (``schedule_many``) ahead
of it; the consumer drains them while its RSS is sampled (peak RSS). Reported, as medians:

- jobs/s: N over the drain (first attempt's start to last attempt's end, from the
  ``JobAttempt`` rows delayjobs writes itself), as in ``benchmarks.core``'s burst;
- RSS idle, RSS peak and their difference (MB; the target is <= +10 MB).

Bodies (``benchmarks.async_jobs``): ``async_sleep10`` (``await asyncio.sleep(0.01)``),
``async_redis`` (one RPUSH through ``redis.asyncio`` on the body's own connection pool),
and, for comparison, ``sync_sleep10`` (``time.sleep(0.01)``: a worker thread per job).
Target: >= 5,000 jobs/s for the async bodies at ``--concurrency 500``.

Usage, from the repository root:
``python -m benchmarks.async_throughput [--runs 3] [--jobs 50000] [--concurrency 500]``.
Results: a Markdown table on stdout and ``build/benchmarks/async-latest.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks import OUTPUT_DIR, harness
from benchmarks.async_jobs import (
    ASYNC_QUEUE,
    REDIS_JOB_TYPE,
    SLEEP_JOB_TYPE,
    SYNC_SLEEP_JOB_TYPE,
)

SETTINGS_MODULE = "benchmarks.async_settings"
BODIES = {
    "async_sleep10": SLEEP_JOB_TYPE,
    "async_redis": REDIS_JOB_TYPE,
    "sync_sleep10": SYNC_SLEEP_JOB_TYPE,
}
TARGET_JOBS_PER_SECOND = 5000.0
TARGET_EXTRA_MB = 10.0
#: How long the consumer is left idle before its resident set is read.
IDLE_SETTLE_SECONDS = 2.0


@dataclass
class Run:
    jobs: int
    completed: bool
    missing: int
    duplicates: int
    drain_seconds: float | None
    jobs_per_second: float | None
    idle_rss_mb: float
    peak_rss_mb: float
    threads_peak: int


@dataclass
class BodyResult:
    body: str
    concurrency: int
    runs: list[Run] = field(default_factory=list)

    def medians(self) -> dict[str, float | None]:
        return {
            "jobs_per_second": harness.median([r.jobs_per_second for r in self.runs]),
            "idle_rss_mb": harness.median([r.idle_rss_mb for r in self.runs]),
            "peak_rss_mb": harness.median([r.peak_rss_mb for r in self.runs]),
            "extra_rss_mb": harness.median([r.peak_rss_mb - r.idle_rss_mb for r in self.runs]),
            "threads_peak": harness.median([float(r.threads_peak) for r in self.runs]),
        }


class Sampler:
    """The consumer's resident set (VmRSS) and thread count, sampled in a thread."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_kb = 0
        self.threads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss_kb(self) -> int:
        return status_field(self.pid, "VmRSS:")

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak_kb = max(self.peak_kb, self.rss_kb())
                self.threads = max(self.threads, status_field(self.pid, "Threads:"))
            except (OSError, ValueError):
                return
            self._stop.wait(self.interval)


def status_field(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(name):
                return int(line.split()[1])
    return 0


def start_consumer(concurrency: int, log_path: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "manage.py",
        "run_delay_consumer",
        "--processes",
        "1",
        "--queue",
        ASYNC_QUEUE,
        "--concurrency",
        str(concurrency),
        "--verbosity",
        "0",
    ]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            cwd=harness.REPO_ROOT,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    wait_listening(process, log_path)
    return process


def wait_listening(process: subprocess.Popen[bytes], log_path: Path) -> None:
    from delayjobs.index.client import get_client
    from delayjobs.index.keys import wake_channel

    channel = wake_channel(ASYNC_QUEUE)
    deadline = time.monotonic() + harness.CONSUMER_READY_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"consumer exited: {log_path.read_text()[-3000:]}")
        if dict(get_client().pubsub_numsub(channel)).get(channel.encode(), 0) > 0:
            return
        time.sleep(0.05)
    raise RuntimeError(f"consumer not ready: {log_path.read_text()[-3000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=harness.CONSUMER_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def one_run(job_type: str, jobs: int, concurrency: int, log_dir: Path, timeout: float) -> Run:
    import delayjobs
    from delayjobs.core import clock

    harness.reset_state()
    process = start_consumer(concurrency, log_dir / f"consumer-{job_type}-{time.time():.0f}.log")
    try:
        time.sleep(IDLE_SETTLE_SECONDS)  # let start-up allocations settle: not a test wait
        sampler = Sampler(process.pid)
        idle_kb = sampler.rss_kb()
        with sampler:
            run_at = clock.now() + timedelta(seconds=2 + jobs / 20_000)
            for start in range(0, jobs, 5000):
                delayjobs.schedule_many(
                    [
                        {"job_type": job_type, "run_at": run_at}
                        for _ in range(min(5000, jobs - start))
                    ]
                )
            completed = harness.wait_until_final(jobs, timeout)
        executions = harness.collect_executions()
    finally:
        stop(process)
    drain = None
    if executions.first_start and executions.last_finish:
        drain = (executions.last_finish - executions.first_start).total_seconds()
    return Run(
        jobs=jobs,
        completed=completed,
        missing=executions.missing,
        duplicates=executions.duplicates,
        drain_seconds=drain,
        jobs_per_second=jobs / drain if drain and completed else None,
        idle_rss_mb=idle_kb / 1024,
        peak_rss_mb=sampler.peak_kb / 1024,
        threads_peak=sampler.threads,
    )


def setup_django() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def table(results: list[BodyResult], runs: int) -> str:
    lines = [
        f"Medians of {runs} run(s), one consumer process, jobs due at one instant.",
        "",
        "| body | concurrency | jobs/s | RSS idle MB | RSS peak MB | extra MB | threads peak |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for result in results:
        m = result.medians()
        lines.append(
            f"| {result.body} | {result.concurrency} | {fmt(m['jobs_per_second'], 0)} | "
            f"{fmt(m['idle_rss_mb'])} | {fmt(m['peak_rss_mb'])} | {fmt(m['extra_rss_mb'])} | "
            f"{fmt(m['threads_peak'], 0)} |"
        )
    return "\n".join(lines)


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--bodies", nargs="+", choices=list(BODIES), default=list(BODIES)[:2])
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)

    results = [BodyResult(body, args.concurrency) for body in args.bodies]
    with tempfile.TemporaryDirectory() as log_dir, harness.services():
        setup_django()
        # Interleaved: run i of every body, then run i + 1, so that a busy moment of the
        # (shared) machine does not land on one body only.
        for _ in range(args.runs):
            for result in results:
                run = one_run(
                    BODIES[result.body], args.jobs, args.concurrency, Path(log_dir), args.timeout
                )
                result.runs.append(run)
                print(f"{result.body}: {run}", file=sys.stderr, flush=True)
        machine = harness.machine_info()
    report = table(results, args.runs)
    print(report)
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {
        "machine": machine,
        "args": vars(args),
        "results": [
            {"body": r.body, "medians": r.medians(), "runs": [asdict(x) for x in r.runs]}
            for r in results
        ],
    }
    (OUTPUT_DIR / "async-latest.json").write_text(json.dumps(payload, indent=2, default=str))
    (OUTPUT_DIR / "async-latest.md").write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
