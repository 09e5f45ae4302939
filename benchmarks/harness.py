"""What every benchmark needs: servers, Django set-up, a consumer process, clean state,
waiting for jobs to finish, statistics and machine information.

Django is imported lazily (after ``setup_django``), so that this module can be imported
before the servers exist and the settings can be read.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Re-exported: the driver and the systems read them from here.
from benchmarks.environment import (  # noqa: F401
    CONN_MAX_AGE_ENV,
    DATABASE_ENV,
    REDIS_URL_ENV,
)
from tests.support.postgres import PostgresServer
from tests.support.processes import pdeathsig_preexec
from tests.support.redis_server import RedisServer

REPO_ROOT = Path(__file__).resolve().parent.parent
SETTINGS_MODULE = "benchmarks.settings"
CONSUMER_READY_TIMEOUT = 30.0
CONSUMER_STOP_TIMEOUT = 60.0
POLL_INTERVAL = 0.1


# Servers and Django ---------------------------------------------------------------------


@contextlib.contextmanager
def services(*, durable: bool = True) -> Iterator[tuple[PostgresServer, RedisServer]]:
    """A fresh PostgreSQL and Redis on 127.0.0.1, exported to the environment, then stopped.

    PostgreSQL is durable (fsync on commit, as in production) unless told otherwise.
    """
    postgres = PostgresServer(durable=durable)
    redis_server = RedisServer()
    try:
        postgres.start()
        redis_server.start()
        os.environ[DATABASE_ENV] = json.dumps(postgres.settings_dict())
        os.environ[REDIS_URL_ENV] = redis_server.url
        yield postgres, redis_server
    finally:
        # Each stop() signals its own server by pid; a failing one must not skip the other.
        with contextlib.suppress(Exception):
            redis_server.stop()
        postgres.stop()


def setup_django() -> None:
    """Configure Django from ``benchmarks.settings`` and migrate the fresh database."""
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


#: W6: the first id of the rows a run adds to pre-filled tables (``keep_prefilled``);
#: reset_state() then deletes only the rows from it on. None: it empties the tables.
_first_run_id: int | None = None


def keep_prefilled() -> int:
    """From now on, reset_state() keeps the rows the tables hold now; their count."""
    global _first_run_id
    from django.db.models import Max

    from delayjobs.models import DelayedJob

    _first_run_id = (DelayedJob.objects.aggregate(last=Max("id"))["last"] or 0) + 1
    return _first_run_id - 1


def prefilled() -> bool:
    return _first_run_id is not None


def reset_state() -> None:
    """Empty the job tables and Redis, so that each run starts from nothing (but for the
    rows kept by ``keep_prefilled``)."""
    from django.db import connection

    from delayjobs.index.client import get_client
    from delayjobs.models import DelayedJob, JobAttempt

    if _first_run_id is not None:
        JobAttempt.objects.filter(job_id__gte=_first_run_id).delete()
        DelayedJob.objects.filter(id__gte=_first_run_id).delete()
        get_client().flushdb()  # the pre-loader puts the pre-filled window back
        return
    tables = ", ".join(
        connection.ops.quote_name(model._meta.db_table) for model in (JobAttempt, DelayedJob)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {tables} RESTART IDENTITY")
        cursor.execute(f"VACUUM ANALYZE {tables}")
    get_client().flushdb()


# The consumer ---------------------------------------------------------------------------


class Consumer:
    """``manage.py run_delay_consumer`` as a real subprocess, stopped by its pid."""

    def __init__(self, concurrency: int, log_path: Path) -> None:
        self.concurrency = concurrency
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("consumer not started")
        return self._process.pid

    def start(self, queue: str) -> Consumer:
        command = [
            sys.executable,
            "manage.py",
            "run_delay_consumer",
            "--processes",
            "1",
            "--concurrency",
            str(self.concurrency),
            "--verbosity",
            "0",
        ]
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env={**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=pdeathsig_preexec(os.getpid()),
            )
        self._wait_until_listening(queue)
        return self

    def _wait_until_listening(self, queue: str) -> None:
        """Ready once it subscribed to the queue's wake channel (its main loop runs)."""
        from delayjobs.index.client import get_client
        from delayjobs.index.keys import wake_channel

        channel = wake_channel(queue)
        deadline = time.monotonic() + CONSUMER_READY_TIMEOUT
        while time.monotonic() < deadline:
            self._raise_if_exited()
            if dict(get_client().pubsub_numsub(channel)).get(channel.encode(), 0) > 0:
                return
            time.sleep(0.05)
        raise RuntimeError(f"consumer not ready after {CONSUMER_READY_TIMEOUT:.0f}s.\n{self.log()}")

    def _raise_if_exited(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            raise RuntimeError(
                f"consumer exited with code {self._process.returncode}.\n{self.log()}"
            )

    def stop(self) -> None:
        """SIGTERM (finish running jobs, exit), then SIGKILL if it takes too long."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=CONSUMER_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# Waiting and measuring ------------------------------------------------------------------


def wait_until_final(expected: int, timeout: float) -> bool:
    """Poll the database until ``expected`` jobs reached a final status; False on timeout."""
    from delayjobs.models import DelayedJob, JobStatus

    final = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)
    deadline = time.monotonic() + timeout
    while True:
        if DelayedJob.objects.filter(status__in=final).count() >= expected:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_INTERVAL)


@dataclass(frozen=True)
class Executions:
    """What the attempt rows say about one run."""

    jobs: int
    lateness_ms: list[float]
    missing: int  # jobs that did not succeed
    duplicates: int  # attempt rows beyond the first of each job
    first_start: datetime | None
    last_finish: datetime | None
    last_recorded: datetime | None  # when the last job row was marked finished
    claim_batches: int  # distinct claim times: conditional UPDATEs that won jobs
    record_batches: int  # distinct recording times: recorder transactions


def collect_executions() -> Executions:
    from django.db.models import Count, Max, Min

    from delayjobs.models import DelayedJob, JobAttempt, JobStatus

    attempts = JobAttempt.objects.all()
    lateness_ms = [
        value.total_seconds() * 1000 for value in attempts.values_list("lateness", flat=True)
    ]
    span = attempts.aggregate(first=Min("started_at"), last=Max("finished_at"))
    per_job = attempts.values("job_id").annotate(n=Count("id"))
    duplicates = sum(row["n"] - 1 for row in per_job.filter(n__gt=1))
    jobs = DelayedJob.objects.count()
    return Executions(
        jobs=jobs,
        lateness_ms=lateness_ms,
        missing=jobs - DelayedJob.objects.filter(status=JobStatus.SUCCEEDED).count(),
        duplicates=duplicates,
        first_start=span["first"],
        last_finish=span["last"],
        last_recorded=DelayedJob.objects.aggregate(last=Max("finished_at"))["last"],
        claim_batches=DelayedJob.objects.order_by().values("started_at").distinct().count(),
        record_batches=DelayedJob.objects.order_by().values("finished_at").distinct().count(),
    )


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Linear interpolation between closest ranks (like numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def lateness_summary(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "p50": percentile(values, 0.50),
        "p95": percentile(values, 0.95),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else None,
    }


def median(values: Sequence[float | None]) -> float | None:
    present = sorted(value for value in values if value is not None)
    if not present:
        return None
    middle = len(present) // 2
    if len(present) % 2:
        return present[middle]
    return (present[middle - 1] + present[middle]) / 2


# Machine information --------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    import django
    from django.db import connection

    from delayjobs.index.client import get_client

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        postgres_version = cursor.fetchone()[0]
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "postgresql": postgres_version,
        "redis": get_client().info("server").get("redis_version"),
        "commit": git_commit(),
        "load_average_at_start": load_average(),
    }


def cpu_busy(interval: float = 1.0) -> float:
    """Fraction of the machine's CPU time spent busy over ``interval`` (from /proc/stat)."""

    def read() -> tuple[int, int]:
        with open("/proc/stat") as file:
            values = [int(value) for value in file.readline().split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values), idle

    total_before, idle_before = read()
    time.sleep(interval)
    total_after, idle_after = read()
    total = total_after - total_before
    return 1 - (idle_after - idle_before) / total if total else 0.0


def wait_quiet(max_wait: float, threshold: float = 0.25) -> float:
    """Wait (up to ``max_wait`` seconds) until other work leaves the CPUs mostly idle:
    on a shared machine, someone's test suite distorts every figure. Returns the busy
    fraction last seen, which the report keeps."""
    deadline = time.monotonic() + max_wait
    busy = cpu_busy()
    while busy > threshold and time.monotonic() < deadline:
        busy = cpu_busy(2.0)
    return busy


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages: other work on the machine distorts the numbers."""
    return [round(value, 2) for value in os.getloadavg()]


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "none"
    return f"{commit}+dirty" if git("status", "--porcelain") else commit


# Consumer processes of any system, and their memory -------------------------------------


class ProcessGroup:
    """The consumer processes of one system: started with a common environment, each with
    its own log, and stopped by pid (SIGTERM, then SIGKILL for the process and for any
    child it left behind: prefork pools, RQ's scheduler)."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = env
        self.processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[Path] = []

    def start(self, command: Sequence[str], name: str) -> subprocess.Popen[bytes]:
        log_path = self.log_dir / f"{name}-{len(self.processes)}.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                list(command),
                cwd=REPO_ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=pdeathsig_preexec(os.getpid()),
            )
        self.processes.append(process)
        self._logs.append(log_path)
        return process

    def pids(self) -> list[int]:
        """The started processes and all their descendants, alive now."""
        import psutil

        found: list[int] = []
        for process in self.processes:
            if process.poll() is not None:
                continue
            found.append(process.pid)
            with contextlib.suppress(psutil.Error):
                found += [child.pid for child in psutil.Process(process.pid).children(True)]
        return found

    def exited(self) -> list[int]:
        """Exit codes of processes that are no longer running (a crash, an early exit)."""
        return [code for process in self.processes if (code := process.poll()) is not None]

    def stop(self, timeout: float = 20.0) -> None:
        import psutil

        children: list[psutil.Process] = []
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(psutil.Error):
                    children += psutil.Process(process.pid).children(True)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
        for child in children:  # only processes our consumers started, by pid
            with contextlib.suppress(psutil.Error):
                if child.is_running():
                    child.kill()
        self.processes = []

    def logs(self, limit: int = 3000) -> str:
        parts = []
        for path in self._logs:
            with contextlib.suppress(OSError):
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-limit:]}")
        return "\n".join(parts)


class MemorySampler:
    """Peak memory of a process group, sampled in a thread.

    ``peak_hwm_mb``: the sum over every consumer process of its own peak resident set
    (VmHWM), the figure the issue asks for. Shared pages (a prefork parent's, copied on
    write) count once per process. ``peak_pss_mb``: the highest sampled sum of proportional
    set sizes, in which shared pages are divided among their sharers.
    """

    def __init__(self, group: ProcessGroup, interval: float = 0.2) -> None:
        self.group = group
        self.interval = interval
        self.hwm_kb: dict[int, int] = {}
        self.peak_pss_kb = 0
        self._stop = False
        self._thread: Any = None

    def __enter__(self) -> MemorySampler:
        import threading

        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop = True
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop:
            self.sample()
            time.sleep(self.interval)

    def sample(self) -> None:
        pss = 0
        for pid in self.group.pids():
            with contextlib.suppress(OSError, ValueError):
                status = _proc_kb(f"/proc/{pid}/status", "VmHWM:")
                self.hwm_kb[pid] = max(self.hwm_kb.get(pid, 0), status)
                pss += _proc_kb(f"/proc/{pid}/smaps_rollup", "Pss:")
        self.peak_pss_kb = max(self.peak_pss_kb, pss)

    @property
    def peak_hwm_mb(self) -> float:
        return sum(self.hwm_kb.values()) / 1024

    @property
    def peak_pss_mb(self) -> float:
        return self.peak_pss_kb / 1024


def _proc_kb(path: str, field_name: str) -> int:
    with open(path) as file:
        for line in file:
            if line.startswith(field_name):
                return int(line.split()[1])
    return 0


class CpuMeter:
    """CPU spent between ``start()`` and ``stop()``: the whole machine's (every CPU, from
    ``/proc/stat``: the consumers, PostgreSQL, Redis and this driver alike) and the consumer
    processes' own (user + system time of each process of the group and of its descendants,
    from psutil; children it reaped count through its ``children_*`` times).

    A process that starts and ends inside the window without a parent of the group reaping
    it is not seen; none of the systems benchmarked does that.
    """

    def __init__(self, group: ProcessGroup) -> None:
        self.group = group
        self.seconds = 0.0
        self.machine_seconds = 0.0  # CPU-seconds, all CPUs
        self.workers_seconds = 0.0
        self._started: tuple[float, float, dict[int, float]] | None = None

    def start(self) -> None:
        self._started = (time.monotonic(), machine_busy_seconds(), self._workers())

    def stop(self) -> None:
        """The figures from start() to now; only the first call after start() counts."""
        if self._started is None:
            return
        started, machine, workers = self._started
        self._started = None
        self.seconds = time.monotonic() - started
        self.machine_seconds = machine_busy_seconds() - machine
        now = self._workers()
        self.workers_seconds = sum(cpu - workers.get(pid, 0.0) for pid, cpu in now.items())

    def _workers(self) -> dict[int, float]:
        import psutil

        found: dict[int, float] = {}
        for pid in self.group.pids():
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(pid).cpu_times()
                found[pid] = times.user + times.system + times.children_user + times.children_system
        return found

    def per_job(self, jobs: int) -> dict[str, float | None]:
        """Microseconds of CPU per job, and the machine's busy share of its CPUs."""
        cpus = os.cpu_count() or 1
        return {
            "window_seconds": self.seconds,
            "machine_cpu_us_per_job": self.machine_seconds * 1e6 / jobs if jobs else None,
            "workers_cpu_us_per_job": self.workers_seconds * 1e6 / jobs if jobs else None,
            "machine_busy": self.machine_seconds / (self.seconds * cpus) if self.seconds else None,
        }


def machine_busy_seconds() -> float:
    """CPU-seconds every CPU spent busy since boot: user, nice, system, irq and softirq
    (guest time is inside user; idle, iowait and time stolen by the hypervisor are not)."""
    with open("/proc/stat") as file:
        user, nice, system, _idle, _iowait, irq, softirq = (
            int(value) for value in file.readline().split()[1:8]
        )
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def run_command(command: Sequence[str], env: dict[str, str] | None = None) -> None:
    """A set-up command of a peer (schema, migrations), from the repository's root; its
    output in the error if it fails."""
    done = subprocess.run(
        list(command), cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        output = (done.stdout + done.stderr)[-3000:]
        raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}:\n{output}")


def peer_database(name: str) -> dict[str, str]:
    """Connection parameters of a peer's own database on the benchmark's PostgreSQL (see
    ``create_database``): the benchmark's own tables stay out of the peers' way."""
    settings = json.loads(os.environ.get(DATABASE_ENV, "{}"))
    return {
        "host": settings.get("HOST", "127.0.0.1"),
        "port": str(settings.get("PORT", "5432")),
        "user": settings.get("USER", "postgres"),
        "dbname": name,
    }


def create_database(params: dict[str, str]) -> bool:
    """Create the database of ``peer_database()`` unless it exists; True if it was made."""
    import psycopg

    server = conninfo({**params, "dbname": "postgres"})
    with psycopg.connect(server, autocommit=True) as connection:
        found = connection.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (params["dbname"],)
        ).fetchone()
        if found is None:
            connection.execute(f'CREATE DATABASE "{params["dbname"]}"')
    return found is None


def conninfo(params: dict[str, str]) -> str:
    """A libpq connection string of ``peer_database()``'s parameters."""
    return " ".join(f"{key}={value}" for key, value in params.items())


def dsn(params: dict[str, str]) -> str:
    """A ``postgresql://`` URL of ``peer_database()``'s parameters."""
    return f"postgresql://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"


def truncate_tables(params: dict[str, str], prefix: str) -> None:
    """Empty a peer's tables (those whose names start with ``prefix``) and vacuum them:
    each run starts from nothing, as delayjobs' own do (``reset_state``)."""
    import psycopg

    with psycopg.connect(conninfo(params), autocommit=True) as connection:
        tables = [
            f'"{row[0]}"'
            for row in connection.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                "AND starts_with(tablename, %s)",
                (prefix,),
            )
        ]
        if tables:
            connection.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
            connection.execute(f"VACUUM ANALYZE {', '.join(tables)}")


def flush_redis() -> None:
    """Empty the benchmark's Redis (every database): the peers' queues and schedules."""
    import redis

    client = redis.Redis.from_url(os.environ[REDIS_URL_ENV])
    try:
        client.flushall()
    finally:
        client.close()
