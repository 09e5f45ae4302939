"""Probes behind the comparison's figures that need a closer look.

``benchmarks/run.sh probe schedule``: ``schedule()`` one by one against the very same
``INSERT`` sent by bare psycopg, on the benchmark's own durable PostgreSQL, and a cProfile
of where a ``schedule()`` call spends its time. It shows what a committed PostgreSQL row
per job costs, which Redis-only systems (Huey, RQ) do not pay.

``benchmarks/run.sh probe memory``: the resident memory of a consumer process, step by
step from the bare interpreter to the consumer's modules, each step in a fresh process.
It shows what Django itself costs, which a worker without Django (Procrastinate) does not
pay.

``benchmarks/run.sh probe startup``: from ``exec`` of ``manage.py run_delay_consumer`` to
the start of a job already due, against Django's own set-up of the same project, in
interleaved pairs, with where the consumer's extra time goes: timestamps at its steps, and
the modules it imports beyond Django's set-up.

``benchmarks/run.sh probe threads``: the CPU time each thread of one consumer process
spends per job while it drains 20,000 jobs due at once (the ``redis`` body), by thread
(the main loop's claims, the worker threads, the recorder, ...) from each thread's
``/proc`` times, named by ``py-spy dump``; with ``--baseline DIR``, another checkout's
consumer in the same rounds; with ``--profile``, where each thread holds the GIL
(``py-spy record --gil``), by function.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from benchmarks import harness
from tests.support.processes import pdeathsig_preexec

SCHEDULE_CALLS = 5_000
SCHEDULE_ROUNDS = 3
WARM_UP_CALLS = 200
# The profile lines that split a schedule() call: delayjobs' part, Django's save and its
# INSERT compilation, psycopg's parameter adaptation, and the wait for the server.
PROFILE_LINES = (
    r"api.py:\d+\(schedule\)|base.py:\d+\(save\)|compiler.py:\d+\(as_sql\)"
    r"|_cursor_base.py:\d+\(_execute_gen\)|psycopg/connection.py:\d+\(wait\)"
)

# Each step of the memory probe runs in its own interpreter and prints its RSS in kB.
MEMORY_STEPS = {
    "interpreter": "",
    "django.setup(): contenttypes, auth, PostgreSQL backend": """
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth"],
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}},
    USE_TZ=True,
)
django.setup()
from django.db import connection
connection.ops
""",
    "... plus redis-py": "import redis",
    "the benchmark consumer's settings and its run_delay_consumer command": """
import django
django.setup()
import delayjobs.management.commands.run_delay_consumer
""",
}
PRINT_RSS = """
for line in open("/proc/self/status"):
    if line.startswith("VmRSS"):
        print(line.split()[1])
"""


def _rates(label: str, calls: Callable[[], None]) -> float:
    started = time.perf_counter()
    calls()
    rate = SCHEDULE_CALLS / (time.perf_counter() - started)
    print(f"  {label}: {rate:,.0f} calls/s")
    return rate


def probe_schedule() -> None:
    with harness.services(durable=True):
        harness.setup_django()
        from django.db import connection
        from django.db.models.sql import InsertQuery
        from django.utils import timezone

        import delayjobs
        from benchmarks.delay_jobs import RECORD_JOB_TYPE
        from delayjobs.models import DelayedJob

        run_at = timezone.now() + timedelta(hours=1)  # outside the pre-load window: no Redis

        def schedule_loop() -> None:
            for i in range(SCHEDULE_CALLS):
                delayjobs.schedule(RECORD_JOB_TYPE, {"i": i, "t": 1.5}, run_at=run_at)

        # The statement schedule() sends, compiled once by Django from a row it wrote.
        delayjobs.schedule(RECORD_JOB_TYPE, {"i": 0, "t": 1.5}, run_at=run_at)
        row = DelayedJob.objects.latest("pk")
        fields = [f for f in DelayedJob._meta.concrete_fields if not f.primary_key]
        query = InsertQuery(DelayedJob)
        query.insert_values(fields, [row])
        compiler = query.get_compiler(connection.alias)
        compiler.returning_fields = [DelayedJob._meta.pk]
        ((sql, params),) = compiler.as_sql()
        raw_connection = connection.connection  # autocommit, as Django left it

        def bare_loop() -> None:
            with raw_connection.cursor() as cursor:
                for _ in range(SCHEDULE_CALLS):
                    cursor.execute(sql, params)

        for _ in range(WARM_UP_CALLS):
            delayjobs.schedule(RECORD_JOB_TYPE, {"i": 0, "t": 1.5}, run_at=run_at)
        schedule_rates, bare_rates = [], []
        for round_number in range(1, SCHEDULE_ROUNDS + 1):
            print(f"round {round_number} of {SCHEDULE_CALLS:,} calls")
            schedule_rates.append(_rates("schedule()", schedule_loop))
            bare_rates.append(_rates("the same INSERT by bare psycopg", bare_loop))
        schedule_median = statistics.median(schedule_rates)
        bare_median = statistics.median(bare_rates)
        print(
            f"medians: schedule() {schedule_median:,.0f}/s, bare INSERT {bare_median:,.0f}/s "
            f"(schedule() at {schedule_median / bare_median:.0%} of it)"
        )

        profiler = cProfile.Profile()
        profiler.runcall(schedule_loop)
        stats = pstats.Stats(profiler)
        total = stats.total_tt  # type: ignore[attr-defined]  # set by Stats, not in stubs
        print(f"cProfile of {SCHEDULE_CALLS:,} schedule() calls ({total:.2f} s), cumulative:")
        stats.sort_stats("cumulative").print_stats(PROFILE_LINES)


def probe_memory() -> None:
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": harness.SETTINGS_MODULE}
    # The settings only need to parse: nothing connects while modules are imported.
    environment.setdefault(
        "DELAYJOBS_BENCH_DATABASE",
        json.dumps({"ENGINE": "django.db.backends.postgresql", "NAME": "unused"}),
    )
    environment.setdefault("DELAYJOBS_BENCH_REDIS_URL", "redis://127.0.0.1:1/0")
    previous = ""
    for step, code in MEMORY_STEPS.items():
        if step.startswith("..."):
            code = previous + "\n" + code
        previous = code
        result = subprocess.run(
            [sys.executable, "-c", code + PRINT_RSS],
            cwd=harness.REPO_ROOT,
            env=environment,
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"{int(result.stdout.split()[-1]) / 1024:6.1f} MB  {step}")


# Start-up -------------------------------------------------------------------------------

STARTUP_ROUNDS = 7
STARTUP_TIMEOUT = 60.0
#: Before each round, wait up to this long for the CPUs to be mostly idle.
STARTUP_QUIET_WAIT = 15.0
RECORD_POLL = 0.005
#: Side (a): Django's own set-up of the benchmark project, then the wall-clock time it ended.
DJANGO_SETUP = (
    "import django; django.setup(); import os, time; os.write(1, repr(time.time()).encode())"
)
#: Where the traced consumer appends ``time label`` lines.
TRACE_ENV = "DELAYJOBS_BENCH_STARTUP_TRACE"
#: The steps of a consumer's start-up that the traced run times, each by the first call of
#: a function (module, attribute path, label). Calls in helper threads count too.
TRACED_STEPS = (
    ("django.core.management.base", "BaseCommand.check", "system checks"),
    ("delayjobs.engine.consumer", "Consumer.__init__", "consumer built"),
    ("delayjobs.engine.consumer", "Consumer.run", "consumer running"),
    ("django.db.backends.base.base", "BaseDatabaseWrapper.connect", "database connection"),
    ("redis.connection", "AbstractConnection.connect", "Redis connection"),
    ("delayjobs.core.clock", "SharedClock.sync", "database clock read"),
    ("delayjobs.engine.helpers", "Heartbeat.announce", "presence row written"),
    ("delayjobs.engine.claimer", "PauseView.refresh", "pauses read"),
    ("delayjobs.index.store", "RedisStore.subscribe_wake", "listener subscribed"),
    ("delayjobs.engine.preloader", "preload", "pre-loader pass"),
    ("delayjobs.index.store", "RedisStore.pop_due", "first pop"),
    ("delayjobs.transitions", "claim", "first claim"),
)
#: The traced consumer: the command's own steps (set-up, import, then the command as
#: manage.py runs it), with TRACED_STEPS wrapped; forked processes inherit the wrapping.
TRACER = """
import functools, importlib, os, sys, time
_fd = os.open(os.environ[TRACE_ENV], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
def mark(label):
    os.write(_fd, f"{time.time()!r} {label}\\n".encode())
mark("interpreter up")
import django
django.setup()
mark("django.setup()")
import delayjobs.management.commands.run_delay_consumer
mark("command imported")
def trace(module, path, label):
    owner = importlib.import_module(module)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    original = getattr(owner, name)
    first = [True]
    @functools.wraps(original)
    def traced(*args, **kwargs):
        if not first[0]:
            return original(*args, **kwargs)
        first[0] = False
        mark(label + " start")
        try:
            return original(*args, **kwargs)
        finally:
            mark(label + " end")
    setattr(owner, name, traced)
for step in STEPS:
    trace(*step)
from django.core.management import execute_from_command_line
execute_from_command_line(["manage.py", "run_delay_consumer", *sys.argv[1:]])
"""


def _has_processes_option() -> bool:
    """Whether the checked-out run_delay_consumer has ``--processes`` (a supervisor)."""
    from delayjobs.management.commands.run_delay_consumer import Command

    parser = Command().create_parser("manage.py", "run_delay_consumer")
    return any("--processes" in action.option_strings for action in parser._actions)


def _schedule_due_job() -> None:
    """One job due a second ago, in Redis already (schedule() hands it over on commit)."""
    from django.utils import timezone

    import delayjobs
    from benchmarks.delay_jobs import RECORD_JOB_TYPE

    delayjobs.schedule(
        RECORD_JOB_TYPE, {"i": 1, "t": time.time()}, run_at=timezone.now() - timedelta(seconds=1)
    )


def _popen(
    command: list[str], env: dict[str, str], cwd: Path = harness.REPO_ROOT, **streams: Any
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        preexec_fn=pdeathsig_preexec(os.getpid()),
        **streams,
    )


def _django_setup_seconds(env: dict[str, str]) -> float:
    """From exec of the interpreter to the end of its ``django.setup()``."""
    started = time.time()
    process = _popen([sys.executable, "-c", DJANGO_SETUP], env, stdout=subprocess.PIPE)
    output, _ = process.communicate(timeout=STARTUP_TIMEOUT)
    if process.returncode:
        raise RuntimeError(f"django.setup() exited with {process.returncode}")
    return float(output) - started


def _consumer_run(
    command: list[str],
    env: dict[str, str],
    work_dir: Path,
    stderr: int | IO[bytes] | None = None,
    cwd: Path = harness.REPO_ROOT,
) -> tuple[float, float]:
    """When ``command`` (a consumer, run in ``cwd``) was started and when the one job due
    started in it (wall clock), then stop it and empty the tables and Redis."""
    from benchmarks.records import RECORD_DIR_ENV, RecordReader

    record_dir = Path(tempfile.mkdtemp(dir=work_dir))
    _schedule_due_job()
    log = open(work_dir / "consumer.log", "ab")  # noqa: SIM115  (closed below)
    started = time.time()
    process = _popen(
        command,
        {**env, RECORD_DIR_ENV: str(record_dir)},
        cwd,
        stdout=log,
        stderr=subprocess.STDOUT if stderr is None else stderr,
    )
    try:
        reader = RecordReader(record_dir)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not reader.poll():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{' '.join(command)}: no job started (exit code {process.poll()}); "
                    f"see {work_dir / 'consumer.log'}"
                )
            time.sleep(RECORD_POLL)
        return started, reader.executions[0].start
    finally:
        process.terminate()
        try:
            process.wait(timeout=STARTUP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        harness.reset_state()


def _trace_marks(path: Path, started: float, job_start: float) -> dict[str, float]:
    """Seconds from exec to each mark of a traced run, the job's start last."""
    marks: dict[str, float] = {}
    for line in path.read_text().splitlines():
        moment, label = line.split(" ", 1)
        marks.setdefault(label, float(moment) - started)
    marks["job started"] = job_start - started
    return marks


def _step_medians(traces: list[dict[str, float]]) -> dict[str, float]:
    """Each mark's median over the traced runs, in the order they came."""
    labels = {label for trace in traces for label in trace}
    medians = {
        label: statistics.median(trace[label] for trace in traces if label in trace)
        for label in labels
    }
    return dict(sorted(medians.items(), key=lambda item: item[1]))


def _import_times(stderr: str) -> dict[str, tuple[int, int, str | None]]:
    """``-X importtime`` output: module -> (self us, cumulative us, the module that
    imported it)."""
    rows: list[tuple[int, str, int, int]] = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own_text, cumulative_text, indented = line[len("import time:") :].split("|")
        depth = (len(indented) - len(indented.lstrip())) // 2
        rows.append((depth, indented.strip(), int(own_text), int(cumulative_text)))
    # A module is listed after the modules it imported, one level shallower.
    found: dict[str, tuple[int, int, str | None]] = {}
    for index, (depth, name, own, cumulative) in enumerate(rows):
        parent = next((row[1] for row in rows[index + 1 :] if row[0] < depth), None)
        found.setdefault(name, (own, cumulative, parent))
    return found


def _extra_imports(env: dict[str, str], work_dir: Path) -> dict[str, Any]:
    """The modules a consumer imports before its first job that Django's set-up does not,
    from ``-X importtime`` (whose own cost inflates the times)."""
    setup = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", DJANGO_SETUP],
        cwd=harness.REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    stderr_path = work_dir / "importtime.txt"
    with open(stderr_path, "wb") as stderr:
        _consumer_run(
            [sys.executable, "-X", "importtime", "manage.py", "run_delay_consumer"],
            env,
            work_dir,
            stderr=stderr,
        )
    baseline = _import_times(setup.stderr)
    consumer = _import_times(stderr_path.read_text())
    extra = {name: row for name, row in consumer.items() if name not in baseline}
    # The extra modules imported by a module Django's set-up loads too: what to look at.
    roots = sorted(
        (
            (name, cumulative)
            for name, (_, cumulative, parent) in extra.items()
            if parent is None or parent not in extra
        ),
        key=lambda item: -item[1],
    )
    by_package: dict[str, int] = {}
    for name, (own, _, _) in extra.items():
        package = name.split(".")[0]
        by_package[package] = by_package.get(package, 0) + own
    return {
        "setup_modules": len(baseline),
        "extra_modules": len(extra),
        "extra_self_ms": sum(own for own, _, _ in extra.values()) / 1000,
        "extra_roots_ms": {name: cumulative / 1000 for name, cumulative in roots[:15]},
        "extra_by_package_ms": {
            name: own / 1000 for name, own in sorted(by_package.items(), key=lambda i: -i[1])
        },
    }


def probe_startup(output_dir: Path, baseline: Path | None) -> None:
    """``baseline``: another checkout (of the commit to compare with), whose consumer runs
    from that directory in each round too, with this one's venv."""
    with harness.services(durable=True):
        harness.setup_django()
        work_dir = Path(tempfile.mkdtemp(prefix="startup-"))
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": harness.SETTINGS_MODULE}
        # Measured as deployed: bytecode written by the first (unmeasured) run, then read.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        consumer = [sys.executable, "manage.py", "run_delay_consumer"]
        here = harness.REPO_ROOT
        sides: dict[str, tuple[list[str], Path] | None] = {
            "django.setup()": None,
            "consumer": (consumer, here),
        }
        if _has_processes_option():
            sides["consumer --processes 1"] = ([*consumer, "--processes", "1"], here)
        if baseline is not None:
            sides["consumer (baseline)"] = (consumer, baseline)
        tracer = f"STEPS = {TRACED_STEPS!r}\nTRACE_ENV = {TRACE_ENV!r}\n{TRACER}"

        def measure(side: str) -> float:
            how = sides[side]
            if how is None:
                return _django_setup_seconds(env)
            started, job_start = _consumer_run(how[0], env, work_dir, cwd=how[1])
            return job_start - started

        for side in sides:  # once each, unmeasured: bytecode cached, pages warm
            measure(side)
        meter = harness.CpuMeter(harness.ProcessGroup(work_dir, env))
        load_before = harness.load_average()
        meter.start()
        figures: dict[str, list[float]] = {side: [] for side in sides}
        traced_sides = {side: how for side, how in sides.items() if how is not None}
        traces: dict[str, list[dict[str, float]]] = {side: [] for side in traced_sides}
        busy_before: list[float] = []
        for round_number in range(1, STARTUP_ROUNDS + 1):
            busy_before.append(harness.wait_quiet(STARTUP_QUIET_WAIT))
            for side in sides:
                figures[side].append(measure(side))
            for number, (side, (command, cwd)) in enumerate(traced_sides.items()):
                trace_path = work_dir / f"trace-{round_number}-{number}.txt"
                started, job_start = _consumer_run(
                    [sys.executable, "-c", tracer, *command[3:]],
                    {**env, TRACE_ENV: str(trace_path)},
                    work_dir,
                    cwd=cwd,
                )
                traces[side].append(_trace_marks(trace_path, started, job_start))
            shown = ", ".join(f"{side} {values[-1]:.3f} s" for side, values in figures.items())
            print(f"round {round_number}: {shown}")
        meter.stop()
        medians = {side: statistics.median(values) for side, values in figures.items()}
        setups = figures["django.setup()"]
        # Each round's own difference: a burst of load elsewhere moves both sides of a round.
        differences = {
            side: statistics.median(c - s for c, s in zip(values, setups, strict=True))
            for side, values in figures.items()
            if side != "django.setup()"
        }
        setup = medians["django.setup()"]
        print(f"medians of {STARTUP_ROUNDS}, from exec:")
        for side, value in medians.items():
            beyond = (
                ""
                if side == "django.setup()"
                else (
                    f"  (+{(value - setup) * 1000:.0f} ms beyond django.setup(), "
                    f"{value / setup:.2f}x; median of the rounds' differences "
                    f"+{differences[side] * 1000:.0f} ms)"
                )
            )
            print(f"  {side:26} {value * 1000:6.0f} ms{beyond}")
        steps = {side: _step_medians(side_traces) for side, side_traces in traces.items()}
        # Within one process, from the end of its django.setup() to its job's start: what
        # the consumer adds, without the noise of comparing two processes.
        in_process = {
            side: statistics.median(t["job started"] - t["django.setup()"] for t in side_traces)
            for side, side_traces in traces.items()
        }
        for side, side_steps in steps.items():
            print(
                f"traced {side}, medians of {STARTUP_ROUNDS}, ms from exec (from its "
                f"django.setup() to its job: {in_process[side] * 1000:.0f} ms):"
            )
            for label, value in side_steps.items():
                print(f"  {value * 1000:6.0f}  {label}")
        imports = _extra_imports(env, work_dir)
        print(
            f"modules imported before the first job beyond django.setup()'s "
            f"{imports['setup_modules']}: {imports['extra_modules']}, "
            f"{imports['extra_self_ms']:.0f} ms of import time (under -X importtime); "
            f"cumulative ms of each first import:"
        )
        for name, value in imports["extra_roots_ms"].items():
            print(f"  {value:6.1f}  {name}")
        busy = meter.per_job(1)["machine_busy"]
        load_after = harness.load_average()
        print(
            f"machine busy {busy:.0%} during the rounds (before each: "
            f"{', '.join(f'{value:.0%}' for value in busy_before)}); load average "
            f"{load_before} -> {load_after}"
        )
        output_dir.mkdir(parents=True, exist_ok=True)
        result = {
            "machine": harness.machine_info(),
            "rounds": STARTUP_ROUNDS,
            "seconds_from_exec": figures,
            "medians": medians,
            "median_differences": differences,
            "trace_medians": steps,
            "traced_setup_to_job": in_process,
            "traces": traces,
            "imports": imports,
            "machine_busy": busy,
            "busy_before_each_round": busy_before,
            "load_average": {"before": load_before, "after": load_after},
        }
        path = output_dir / "startup.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probe", choices=["schedule", "memory", "startup", "threads"])
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=harness.REPO_ROOT / "build" / "benchmarks",
        help="Where startup and threads write their JSON (default: build/benchmarks).",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="DIR",
        help="startup, threads: also run the consumer of this checkout (another commit's "
        "tree, e.g. from git worktree add) in each round, from that directory.",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="threads: then one drain of each side under py-spy record --gil.",
    )
    arguments = parser.parse_args()
    if arguments.probe == "startup":
        probe_startup(arguments.output_dir, arguments.baseline)
    elif arguments.probe == "threads":
        from benchmarks.thread_cpu import probe_threads

        probe_threads(arguments.output_dir, arguments.baseline, arguments.profile)
    else:
        {"schedule": probe_schedule, "memory": probe_memory}[arguments.probe]()


if __name__ == "__main__":
    main()
