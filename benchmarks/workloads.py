"""The workloads W1 to W5 of the comparison suite, written once against the System interface.

Every timed workload starts from empty data, starts the system's consumers, waits until
each consumer process has run a ping job (so that start-up is not measured), schedules,
and waits (polling the record files) until every job ran or its deadline passed. A job
that never ran is *missing*; a job that ran twice is a *duplicate*; a job that started
before its ``run_at`` is *early*; an execution whose body did not return (no end record) is
*unfinished*. Lateness is taken from each job's first execution.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import bodies, harness
from benchmarks.records import RecordReader
from benchmarks.systems.base import Job, System

READY_TIMEOUT = 60.0
POLL = 0.2
#: W2 reads the records more often: the CPU it measures is taken up to the read that finds
#: the last job, so a coarse poll would add idle time to a short drain.
W2_POLL = 0.05
GRACE = 1.0  # after the last expected job: time for a late duplicate to show up
FAR = 3600.0  # "due in an hour"


@dataclass(frozen=True)
class Sizes:
    w1_jobs: int = 10_000
    w1_seconds: float = 20.0
    w1_lead: float = 5.0  # first job due this long after scheduling starts
    w2_jobs: int = 20_000
    w3_single: int = 5_000
    w3_bulk: int = 20_000
    w4_far: int = 50_000
    w4_near: int = 2_000
    w4_near_seconds: float = 5.0
    w4_settle: float = 3.0  # after scheduling the far jobs, before the near ones
    w5_rows: int = 1_000_000
    w5_window: int = 1_000
    w5_passes: int = 9
    chunk: int = 1_000  # jobs per schedule_many call in W1, W2 and W4
    timeout: float = 120.0  # after the last job is due


QUICK = Sizes(
    w1_jobs=1_000,
    w1_seconds=5.0,
    w1_lead=3.0,
    w2_jobs=2_000,
    w3_single=500,
    w3_bulk=2_000,
    w4_far=5_000,
    w4_near=400,
    w4_near_seconds=2.0,
    w4_settle=1.0,
    w5_rows=100_000,
    w5_passes=5,
    timeout=45.0,
)


class WorkloadFailed(RuntimeError):
    """The system could not run the workload (consumers died, never got ready...)."""


# One run of a system's consumers --------------------------------------------------------


class Consumers:
    """The system's consumers for one run, their records and their memory."""

    def __init__(self, system: System, work_dir: Path) -> None:
        self.system = system
        self.work_dir = work_dir
        self.record_dir = Path(tempfile.mkdtemp(prefix="records-", dir=work_dir))
        self.reader = RecordReader(self.record_dir)
        self.group: harness.ProcessGroup | None = None
        self.memory: harness.MemorySampler | None = None

    def wait_ready(self) -> None:
        """Ping jobs (negative ids, due now) until every executing process ran one."""
        ping = -1
        deadline = time.monotonic() + READY_TIMEOUT
        while len(self.reader.pids()) < self.system.executors:
            self.check_alive()
            if time.monotonic() > deadline:
                raise WorkloadFailed(
                    f"{self.system.name}: consumers not ready after {READY_TIMEOUT:.0f}s\n"
                    f"{self.group.logs() if self.group else ''}"
                )
            self.system.schedule_one((ping, time.time()))
            ping -= 1
            time.sleep(0.1)
            self.reader.poll()

    def check_alive(self) -> None:
        if self.group is not None and self.group.exited():
            raise WorkloadFailed(
                f"{self.system.name}: a consumer exited ({self.group.exited()})\n"
                f"{self.group.logs()}"
            )

    def wait_for(
        self,
        expected: int,
        deadline: float,
        on_done: Callable[[], None] | None = None,
        poll: float = POLL,
    ) -> bool:
        """Until ``expected`` executions of jobs (ids >= 0) were read; False at the
        deadline (``time.time()``). ``on_done`` is called as soon as they were read, before
        the wait for late duplicates; ``poll`` is the time between two reads."""
        while True:
            self.reader.poll()
            done = sum(1 for execution in self.reader.executions if execution.job_id >= 0)
            if done >= expected:
                if on_done is not None:
                    on_done()
                time.sleep(GRACE)
                self.reader.poll()
                return True
            if time.time() > deadline:
                return False
            self.check_alive()
            time.sleep(poll)


@contextmanager
def consumers(system: System, work_dir: Path) -> Iterator[Consumers]:
    system.reset()
    run = Consumers(system, work_dir)
    run.group = system.start_consumers(run.record_dir, work_dir)
    try:
        with harness.MemorySampler(run.group) as memory:
            run.memory = memory
            run.wait_ready()
            yield run
    finally:
        system.stop_consumers()


# Statistics -----------------------------------------------------------------------------


def outcome(reader: RecordReader, ids: range) -> dict[str, Any]:
    """Lateness (ms) of each job's first execution, missing, duplicates, early starts,
    executions whose body did not return."""
    first: dict[int, float] = {}
    counts: Counter[int] = Counter()
    for execution in reader.executions:
        if execution.job_id in ids:
            counts[execution.job_id] += 1
            if execution.job_id not in first:
                first[execution.job_id] = execution.lateness * 1000
    lateness = list(first.values())
    return {
        "jobs": len(ids),
        "executed": len(first),
        "missing": len(ids) - len(first),
        "duplicates": sum(count - 1 for count in counts.values()),
        "early": sum(1 for value in lateness if value < 0),
        "unfinished": _unfinished(reader, counts),
        "lateness_ms": {**harness.lateness_summary(lateness), "min": min(lateness, default=None)},
    }


def _unfinished(reader: RecordReader, counts: Counter[int]) -> int:
    """Executions whose body did not return: starts beyond the job's end records."""
    if not bodies.records_ends():  # the noop body writes none: it cannot fail
        return 0
    return sum(max(0, count - len(reader.ends.get(job_id, ()))) for job_id, count in counts.items())


def schedule_in_chunks(system: System, jobs: Sequence[Job], chunk: int) -> tuple[float, int]:
    """schedule_many() chunk by chunk, in run_at order. Returns when it finished, and how
    many jobs were still being scheduled when they came due (their lateness then measures
    the scheduling too: a well-sized workload has none)."""
    late = 0
    for start in range(0, len(jobs), chunk):
        part = jobs[start : start + chunk]
        system.schedule_many(part)
        done = time.time()
        late += sum(1 for _job_id, run_at in part if run_at < done)
    return time.time(), late


def bulk_rate(system: System, jobs: int = 2_000) -> float:
    """Jobs per second of schedule_many on empty data, no consumers: sizes W2's lead."""
    system.reset()
    far = time.time() + FAR
    started = time.perf_counter()
    schedule_in_chunks(system, [(i, far) for i in range(jobs)], 1_000)
    rate = jobs / (time.perf_counter() - started)
    system.reset()
    return rate


# The workloads --------------------------------------------------------------------------


def w1_spread(system: System, sizes: Sizes, work_dir: Path) -> dict[str, Any]:
    """10,000 jobs spread evenly over 20 s, the first due 5 s after scheduling starts."""
    with consumers(system, work_dir) as run:
        started = time.time()
        first_due = started + sizes.w1_lead
        step = sizes.w1_seconds / sizes.w1_jobs
        jobs = [(i, first_due + i * step) for i in range(sizes.w1_jobs)]
        scheduled, scheduled_late = schedule_in_chunks(system, jobs, sizes.chunk)
        complete = run.wait_for(len(jobs), jobs[-1][1] + sizes.timeout)
        result = outcome(run.reader, range(len(jobs)))
    return {
        **result,
        "complete": complete,
        "scheduling_seconds": scheduled - started,
        "scheduled_after_due": scheduled_late,
        "peak_memory_mb": run.memory.peak_hwm_mb if run.memory else None,
    }


def w2_burst(system: System, sizes: Sizes, work_dir: Path, rate: float) -> dict[str, Any]:
    """20,000 jobs due at one instant: drain from that instant to the last start.

    The instant is far enough ahead for every job to be scheduled before it, by the bulk
    rate measured without consumers; consumers busy taking in the jobs can slow the
    scheduling down (Celery's do), so a run that overran is run again with more lead.
    """
    lead = 2.0 + 1.5 * sizes.w2_jobs / rate
    result = _w2_once(system, sizes, work_dir, lead)
    if result["scheduled_after_due"]:
        retry_lead = 2.0 + 2.0 * result["scheduling_seconds"]
        result = {**_w2_once(system, sizes, work_dir, retry_lead), "first_lead_too_short": lead}
    return result


def _w2_once(system: System, sizes: Sizes, work_dir: Path, lead: float) -> dict[str, Any]:
    with consumers(system, work_dir) as run:
        assert run.group is not None
        cpu = harness.CpuMeter(run.group)
        started = time.time()
        due = started + lead
        jobs = [(i, due) for i in range(sizes.w2_jobs)]
        scheduled, scheduled_late = schedule_in_chunks(system, jobs, sizes.chunk)
        time.sleep(max(0.0, due - time.time()))
        cpu.start()  # the drain window: from the instant due to the read of the last start
        complete = run.wait_for(len(jobs), due + sizes.timeout, cpu.stop, W2_POLL)
        cpu.stop()
        result = outcome(run.reader, range(len(jobs)))
    starts = [e.start for e in run.reader.executions if 0 <= e.job_id < len(jobs)]
    drain = max(starts) - due if starts else None
    # To the last start, as before bodies existed (the end follows it by one body's time at
    # most); the last end too, for the bodies that do I/O.
    ends = [end for job_id, times in run.reader.ends.items() if job_id >= 0 for end in times]
    drain_to_end = max(ends) - due if ends else None
    return {
        **result,
        "complete": complete,
        "lead_seconds": lead,
        "scheduling_seconds": scheduled - started,
        "scheduled_after_due": scheduled_late,
        "drain_seconds": drain,
        "jobs_per_second": result["executed"] / drain if drain and complete else None,
        "drain_to_end_seconds": drain_to_end,
        "peak_memory_mb": run.memory.peak_hwm_mb if run.memory else None,
        "cpu": cpu.per_job(result["executed"]),
    }


def w3_scheduling(system: System, sizes: Sizes) -> dict[str, Any]:
    """schedule() one by one, then one schedule_many(), from this process, no consumers."""
    far = time.time() + FAR
    system.reset()
    started = time.perf_counter()
    for i in range(sizes.w3_single):
        system.schedule_one((i, far + i / 1000))
    single = time.perf_counter() - started
    system.reset()
    jobs = [(i, far + i / 1000) for i in range(sizes.w3_bulk)]
    started = time.perf_counter()
    system.schedule_many(jobs)
    bulk = time.perf_counter() - started
    system.reset()
    return {
        "single_jobs": sizes.w3_single,
        "single_seconds": single,
        "single_per_second": sizes.w3_single / single,
        "bulk_jobs": sizes.w3_bulk,
        "bulk_seconds": bulk,
        "bulk_per_second": sizes.w3_bulk / bulk,
        "bulk_api": system.has_bulk,
    }


def w4_far_and_near(system: System, sizes: Sizes, work_dir: Path) -> dict[str, Any]:
    """50,000 jobs due in an hour, then 2,000 due over the next 5 s: lateness of the
    near ones, and peak memory of the consumer processes over the whole run."""
    near_ids = range(sizes.w4_near)
    far_ids = range(1_000_000, 1_000_000 + sizes.w4_far)
    with consumers(system, work_dir) as run:
        far_due = time.time() + FAR
        far = [(i, far_due + (i - far_ids.start) * 60 / sizes.w4_far) for i in far_ids]
        far_started = time.time()
        far_scheduled, _ = schedule_in_chunks(system, far, 5 * sizes.chunk)
        time.sleep(sizes.w4_settle)
        first_due = time.time() + 2.0
        step = sizes.w4_near_seconds / sizes.w4_near
        near = [(i, first_due + i * step) for i in near_ids]
        _scheduled, scheduled_late = schedule_in_chunks(system, near, sizes.chunk)
        complete = run.wait_for(len(near), near[-1][1] + sizes.timeout)
        result = outcome(run.reader, near_ids)
        far_run = outcome(run.reader, far_ids)["executed"]
    return {
        **result,
        "complete": complete,
        "far_jobs": sizes.w4_far,
        "far_scheduling_seconds": far_scheduled - far_started,
        "far_executed_early": far_run,
        "scheduled_after_due": scheduled_late,
        "peak_memory_mb": run.memory.peak_hwm_mb if run.memory else None,
        "peak_pss_mb": run.memory.peak_pss_mb if run.memory else None,
        "consumer_processes_seen": len(run.memory.hwm_kb) if run.memory else None,
    }


def w5_preloader(sizes: Sizes) -> dict[str, Any]:
    """delayjobs only: pre-loader passes over ``w5_rows`` scheduled rows, of which
    ``w5_window`` are due inside the window (the rest in an hour or more)."""
    from django.db import connection

    from benchmarks.systems.delayjobs_system import DelayJobsSystem
    from delayjobs.conf import settings
    from delayjobs.models import DelayedJob

    system = DelayJobsSystem()
    system.reset()
    now = time.time()
    window = settings.PRELOAD_WINDOW.total_seconds()
    # Inside the window for the whole measurement, even if the bulk insert is slow.
    near = [(i, now + window * (0.5 + 0.4 * i / sizes.w5_window)) for i in range(sizes.w5_window)]
    system.schedule_many(near)
    system.schedule_many([(-1, now + 2 * FAR)])  # a far template row, copied below
    started = time.perf_counter()
    _copy_rows(DelayedJob, sizes.w5_rows - sizes.w5_window - 1)
    insert_seconds = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {DelayedJob._meta.db_table}")
    harness.flush_redis()  # the passes load the window, not the hand-offs of schedule_many
    return {
        "rows": DelayedJob.objects.count(),
        "in_window": sizes.w5_window,
        "insert_seconds": insert_seconds,
        **_preloader_passes(sizes.w5_passes),
    }


def w5_prefilled(sizes: Sizes) -> dict[str, Any]:
    """W5 on pre-filled tables (``suite --prefill``): pre-loader passes over the scheduled
    rows already there, whatever the window holds of them now."""
    from django.utils import timezone

    from delayjobs.models import DelayedJob, JobStatus

    # The pre-filled rows came due at 1,000 a minute from the fill on, and no consumer knows
    # their job types: those already overdue would swell the window far past the 1,000 a
    # production table holds (its consumers ran them). They end, as if they had run.
    overdue = DelayedJob.objects.filter(status=JobStatus.SCHEDULED, run_at__lt=timezone.now())
    ended = overdue.update(status=JobStatus.SUCCEEDED, finished_at=timezone.now())
    harness.flush_redis()
    passes = _preloader_passes(sizes.w5_passes)
    return {
        "rows": DelayedJob.objects.count(),
        "overdue_rows_ended_first": ended,
        "scheduled_rows": DelayedJob.objects.filter(status=JobStatus.SCHEDULED).count(),
        "in_window": passes["loaded_per_pass"][0] if passes["loaded_per_pass"] else 0,
        "insert_seconds": 0.0,
        **passes,
    }


def _preloader_passes(count: int) -> dict[str, Any]:
    """``count`` timed pre-loader passes (Redis flushed first by the caller), with the
    plan of the window query."""
    from django.utils import timezone

    from delayjobs.conf import settings
    from delayjobs.engine.preloader import preload
    from delayjobs.models import DelayedJob

    passes = []
    loaded = []
    for _ in range(count):
        started = time.perf_counter()
        result = preload()
        passes.append((time.perf_counter() - started) * 1000)
        loaded.append(result.loaded)
    horizon = timezone.now() + settings.PRELOAD_WINDOW
    plan = DelayedJob.objects.due_before(horizon).order_by("run_at", "id")[:1000]
    return {
        "pass_ms": passes,
        "pass_ms_median": harness.median(passes),
        "loaded_per_pass": loaded,
        "explain": plan.explain(analyze=True),
    }


def _copy_rows(model: Any, count: int) -> None:
    """Insert ``count`` copies of the newest row in one INSERT ... SELECT, each due one
    second after the other from the template's run_at on, with its own payload id."""
    from django.db import connection

    quote = connection.ops.quote_name
    columns = [field.column for field in model._meta.concrete_fields if not field.primary_key]
    values = {
        "run_at": "t.run_at + g * interval '1 second'",
        "payload": "jsonb_build_object('i', g + 1000000, 't', 0)",
        "trace_id": "md5(g::text)",
    }
    select = ", ".join(values.get(column, f"t.{quote(column)}") for column in columns)
    table = quote(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({', '.join(quote(c) for c in columns)}) "
            f"SELECT {select} FROM {table} t CROSS JOIN generate_series(1, %s) g "
            f"WHERE t.id = (SELECT max(id) FROM {table})",
            [count],
        )
