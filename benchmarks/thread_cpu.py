"""``benchmarks/run.sh probe threads``: CPU time per job, by thread, of one consumer process.

One ``run_delay_consumer --processes 1 --concurrency 32`` drains 20,000 jobs due at one
instant, each running the ``redis`` body. Each thread's user and system time comes from
``/proc/PID/task/TID/stat`` at the instant and once the last job ended; ``py-spy dump``
names the threads, grouped by name without their number (``delayjobs-worker-7`` counts as
``delayjobs-worker``). With ``--baseline DIR`` another checkout's consumer (e.g. the commit
before a change, from ``git worktree add``) runs in the same rounds, interleaved, from
that directory. With ``--profile`` each side runs once more under ``py-spy record --gil``:
samples taken only while a thread holds the GIL, so where each thread's Python time goes.

CPU time per job is what moves least with the machine's load; jobs/s is printed too, as a
reminder of the run, not as a result (the comparison suite measures it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from benchmarks import bodies, harness
from benchmarks.records import RECORD_DIR_ENV, RecordReader
from benchmarks.systems.delayjobs_system import DelayJobsSystem
from tests.support.processes import pdeathsig_preexec

JOBS = 20_000
ROUNDS = 3
CONCURRENCY = 32
BODY = "redis"
CHUNK = 1_000
LEAD_SECONDS = 4.0  # enough to schedule 20,000 jobs before they are due
TIMEOUT = 180.0
POLL = 0.02
PROFILE_RATE = 250  # samples a second; py-spy's default 100 sees too few per job
TOP_FUNCTIONS = 8
_NUMBERED = re.compile(r"[-_]\d+$")


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.access(found, os.X_OK):
        raise SystemExit("py-spy not found: it is in benchmarks/requirements.txt (run.sh).")
    return found


def _thread_seconds(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each thread of ``pid``."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # a thread that ended meanwhile
            continue
        found[int(task.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def _server_seconds(pids: dict[str, int | None]) -> dict[str, float]:
    """CPU seconds of each server: its process and its descendants (PostgreSQL's backends,
    one per connection, which stay for the whole drain: the consumer's are persistent)."""
    import psutil

    found: dict[str, float] = {}
    for name, pid in pids.items():
        if pid is None:
            continue
        server = psutil.Process(pid)
        total = 0.0
        for process in [server, *server.children(recursive=True)]:
            try:
                times = process.cpu_times()
            except psutil.Error:  # a backend that ended meanwhile
                continue
            total += times.user + times.system
        found[name] = total
    return found


def _thread_families(pid: int) -> dict[int, str]:
    """Thread id (the kernel's, and Python's ``ident``, which ``py-spy record`` shows) ->
    its name without a trailing number, from ``py-spy dump --json``."""
    dump = subprocess.run(
        [_py_spy(), "dump", "--json", "--pid", str(pid)],
        capture_output=True,
        text=True,
        check=True,
    )
    families: dict[int, str] = {}
    for thread in json.loads(dump.stdout):
        family = _NUMBERED.sub("", thread.get("thread_name") or "unnamed")
        for key in ("os_thread_id", "thread_id"):
            if thread.get(key):
                families[int(thread[key])] = family
    return families


def _consumer_command(checkout: Path) -> list[str]:
    """The checkout's consumer as one process: ``--processes 1`` where it has a supervisor."""
    command = [sys.executable, "manage.py", "run_delay_consumer"]
    source = checkout / "delayjobs" / "management" / "commands" / "run_delay_consumer.py"
    if '"--processes"' in source.read_text():
        command += ["--processes", "1"]
    return [*command, "--concurrency", str(CONCURRENCY), "--verbosity", "0"]


class _Run:
    """One consumer of ``checkout`` and its records, for one drain."""

    def __init__(self, checkout: Path, work_dir: Path) -> None:
        self.system = DelayJobsSystem("1x20")  # only its scheduling calls are used
        self.record_dir = Path(tempfile.mkdtemp(prefix="records-", dir=work_dir))
        self.reader = RecordReader(self.record_dir)
        harness.reset_state()
        self.log = open(work_dir / "consumer.log", "ab")  # noqa: SIM115 (closed in stop)
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": harness.SETTINGS_MODULE,
            RECORD_DIR_ENV: str(self.record_dir),
        }
        self.process = subprocess.Popen(
            _consumer_command(checkout),
            cwd=checkout,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=pdeathsig_preexec(os.getpid()),
        )

    def wait_ready(self) -> None:
        """Ping jobs (negative ids, due now) until one ran."""
        deadline = time.monotonic() + 60
        ping = -1
        while not self.reader.executions:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"consumer not ready (exit code {self.process.poll()})")
            self.system.schedule_one((ping, time.time()))
            ping -= 1
            time.sleep(0.2)
            self.reader.poll()

    def schedule_burst(self) -> float:
        """JOBS jobs due at one instant, returned (epoch seconds)."""
        due = time.time() + LEAD_SECONDS
        jobs = [(i, due) for i in range(JOBS)]
        for start in range(0, JOBS, CHUNK):
            self.system.schedule_many(jobs[start : start + CHUNK])
        if time.time() > due:
            raise RuntimeError("scheduling overran the instant: raise LEAD_SECONDS")
        time.sleep(due - time.time())
        return due

    def wait_all_ended(self) -> float:
        """When the last of the JOBS jobs ended (every body but noop records its end)."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            self.reader.poll()
            ended = [times for job_id, times in self.reader.ends.items() if job_id >= 0]
            if len(ended) >= JOBS:
                return max(max(times) for times in ended)
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{len(ended)} of {JOBS} jobs ended")
            time.sleep(POLL)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        harness.reset_state()


def _measure(checkout: Path, work_dir: Path, servers: dict[str, int | None]) -> dict[str, Any]:
    """µs of CPU per job by thread family, the process's, each server's and the machine's,
    and jobs/s."""
    run = _Run(checkout, work_dir)
    try:
        run.wait_ready()
        due = run.schedule_burst()
        threads_before = _thread_seconds(run.process.pid)
        servers_before = _server_seconds(servers)
        machine_before = harness.machine_busy_seconds()
        last_end = run.wait_all_ended()
        machine = harness.machine_busy_seconds() - machine_before
        servers_after = _server_seconds(servers)
        threads_after = _thread_seconds(run.process.pid)
        families = _thread_families(run.process.pid)
    finally:
        run.stop()
    per_family: dict[str, float] = defaultdict(float)
    for tid, seconds in threads_after.items():
        per_family[families.get(tid, "ended or unnamed")] += seconds - threads_before.get(tid, 0)
    return {
        "us_per_job": {name: value * 1e6 / JOBS for name, value in sorted(per_family.items())},
        "process_us_per_job": sum(per_family.values()) * 1e6 / JOBS,
        "servers_us_per_job": {
            name: (seconds - servers_before[name]) * 1e6 / JOBS
            for name, seconds in servers_after.items()
        },
        "machine_us_per_job": machine * 1e6 / JOBS,
        "jobs_per_second": JOBS / (last_end - due),
    }


def _profile(checkout: Path, work_dir: Path, label: str) -> dict[str, Any]:
    """GIL-holding samples of one drain under ``py-spy record``, by thread and function."""
    run = _Run(checkout, work_dir)
    raw = work_dir / f"profile-{label}.txt"
    try:
        run.wait_ready()
        recorder = subprocess.Popen(
            [_py_spy(), "record", "--gil", "--threads", "--full-filenames", "--format", "raw",
             "--nonblocking",
             "--rate", str(PROFILE_RATE), "--output", str(raw), "--pid", str(run.process.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        run.schedule_burst()
        run.wait_all_ended()
        recorder.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        recorder.wait(timeout=60)
    finally:
        run.stop()
    return _profile_summary(raw.read_text())


def _profile_summary(raw: str) -> dict[str, Any]:
    """Samples per thread family, and each family's top functions: the innermost frame of
    delayjobs, Django, psycopg, redis-py or the body (else the innermost frame).

    A line of ``py-spy record --threads --full-filenames --format raw`` reads
    ``thread (TID): NAME;function (/path/file.py:line);... COUNT``.
    """
    samples: Counter[str] = Counter()
    functions: dict[str, Counter[str]] = defaultdict(Counter)
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        thread, *frames = stack.split(";")
        family = _NUMBERED.sub("", thread.partition(": ")[2] or thread)
        frames = [_short_path(frame) for frame in frames] or ["(no Python frame)"]
        ours = [f for f in frames if re.search(r"delayjobs|django|psycopg|redis|benchmarks", f)]
        samples[family] += int(count)
        functions[family][(ours or frames)[-1]] += int(count)
    total = sum(samples.values()) or 1
    return {
        family: {
            "share": count / total,
            "top": [(name, n / total) for name, n in functions[family].most_common(TOP_FUNCTIONS)],
        }
        for family, count in samples.most_common()
    }


def _short_path(frame: str) -> str:
    """``f (/venv/lib/python3.11/site-packages/django/db/x.py:3)`` -> ``f (django/db/x.py:3)``."""
    return re.sub(r"\(/\S*?(?:site-packages|python3\.\d+|\w+-before|main)/", "(", frame)


def probe_threads(output_dir: Path, baseline: Path | None, profile: bool) -> None:
    sides = {"after": harness.REPO_ROOT}
    if baseline is not None:
        sides = {"before": baseline.resolve(), **sides}
    with harness.services(durable=True) as (postgres, redis_server):
        harness.setup_django()
        with bodies.prepared([BODY]):
            bodies.select(BODY)
            servers = {"PostgreSQL": postgres.pid, "Redis": redis_server.pid}
            compared = _compare(sides, servers, profile)
        machine = harness.machine_info()  # asks PostgreSQL its version: before it stops
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / "threads.json"
    result = {
        "machine": machine,
        "jobs": JOBS,
        "body": BODY,
        "concurrency": CONCURRENCY,
        "sides": {side: str(checkout) for side, checkout in sides.items()},
        **compared,
    }
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {path}")


def _compare(
    sides: dict[str, Path], servers: dict[str, int | None], profile: bool
) -> dict[str, Any]:
    """ROUNDS interleaved rounds of every side, their medians, then the profiles."""
    work_dir = Path(tempfile.mkdtemp(prefix="thread-cpu-"))
    rounds: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for number in range(1, ROUNDS + 1):
        for side, checkout in sides.items():
            harness.wait_quiet(15.0)
            rounds[side].append(_measure(checkout, work_dir, servers))
            result = rounds[side][-1]
            print(
                f"round {number} {side}: process {result['process_us_per_job']:.0f} us/job, "
                f"machine {result['machine_us_per_job']:.0f} us/job, "
                f"{result['jobs_per_second']:,.0f} jobs/s",
                flush=True,
            )
    medians = {side: _medians(side_rounds) for side, side_rounds in rounds.items()}
    _print_table(medians)
    profiles = {}
    if profile:
        profiles = {side: _profile(checkout, work_dir, side) for side, checkout in sides.items()}
    for side, summary in profiles.items():
        print(f"\n{side}: share of GIL-holding samples by thread, and its top functions")
        for family, figures in summary.items():
            print(f"  {figures['share']:6.1%}  {family}")
            for name, share in figures["top"]:
                print(f"           {share:6.1%}  {name}")
    return {"rounds": rounds, "medians": medians, "profiles": profiles}


def _medians(side_rounds: list[dict[str, Any]]) -> dict[str, Any]:
    names = sorted({name for one in side_rounds for name in one["us_per_job"]})
    return {
        "us_per_job": {
            name: statistics.median(one["us_per_job"].get(name, 0.0) for one in side_rounds)
            for name in names
        },
        "servers_us_per_job": {
            name: statistics.median(one["servers_us_per_job"][name] for one in side_rounds)
            for name in side_rounds[0]["servers_us_per_job"]
        },
        **{
            key: statistics.median(one[key] for one in side_rounds)
            for key in ("process_us_per_job", "machine_us_per_job", "jobs_per_second")
        },
    }


def _print_table(medians: dict[str, dict[str, Any]]) -> None:
    sides = list(medians)
    names = sorted({name for side in sides for name in medians[side]["us_per_job"]})
    print(f"\nmedians of {ROUNDS}, us of CPU per job: " + " | ".join(sides))
    rows = [(name, [medians[s]["us_per_job"].get(name, 0.0) for s in sides]) for name in names]
    rows += [
        ("the consumer process", [medians[s]["process_us_per_job"] for s in sides]),
        *(
            (name, [medians[s]["servers_us_per_job"].get(name, 0.0) for s in sides])
            for name in medians[sides[0]]["servers_us_per_job"]
        ),
        ("the machine", [medians[s]["machine_us_per_job"] for s in sides]),
        ("jobs/s (a reminder)", [medians[s]["jobs_per_second"] for s in sides]),
    ]
    for name, values in rows:
        ratio = f"  {values[-1] / values[0]:.2f}x" if len(values) > 1 and values[0] else ""
        print(f"  {name:28}" + "".join(f"{value:10,.0f}" for value in values) + ratio)
