"""Round trips per job on the hot path, against budgets: a guard without timing.

Speed depends on the machine; the number of statements sent to the database and of
requests sent to Redis per job does not. Each test counts them (``tests.support.round_trips``:
every statement from any thread and connection, transactions' BEGIN and COMMIT, every Redis
request, a pipeline being one request of several commands) for runs of N and 2N jobs, and
takes per job = (c(2N) - c(N)) / N and fixed = c(N) - N * per job, so that connections,
script loads and the consumer's start and stop count once, as fixed costs.

The paths: ``schedule()`` of one job (due now, so handed to Redis), ``schedule_many()`` of
N, a pre-loader pass loading N due jobs, and a consumer (in this process, the local
executor) claiming, running and recording N jobs that succeed, fail and are retried
(one attempt's cost), or fail for good.

Deterministic on purpose. The consumer batches claims and outcome writes by timing (how
many threads are idle, how fast jobs run, what the recorder finds waiting): counts in such
a burst vary from run to run. So its jobs run one at a time, unbatched, the worst case per
job: one worker thread; each job lasts longer than ``PREFETCH_BUDGET`` (so each claim takes
one job, see ``InFlight.prefetch``) and returns once the recorder has written the previous
outcome (so each write is one outcome). The consumer's periodic work is left out: its
heartbeat and listener threads (lease renewals, the consumer row, pub/sub) are excluded by
thread, and IDLE_TIMEOUT is an hour so that the main loop does not re-read pauses midway.
Batching only ever lowers the figures; the batched throughput is benchmarks/' business.

The budgets are the ``BUDGETS`` table below, per database vendor and path. A figure above
its budget fails, naming the statements and commands seen; one well below it fails too,
asking to lower the budget (a ratchet: gains are kept).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.db import connection
from django.utils import timezone

import delayjobs
from delayjobs.engine.consumer import PREFETCH_BUDGET, Consumer
from delayjobs.engine.preloader import preload
from delayjobs.jobtypes import registry
from delayjobs.models import DelayedJob, JobStatus
from tests.support.round_trips import (
    DB,
    REDIS,
    Counts,
    Figures,
    RoundTrips,
    commandstats,
    count_round_trips,
    figures,
)
from tests.utils import wait_for

# The budgets ----------------------------------------------------------------------------
# Per database vendor and path: round trips per job ("db": statements, transaction
# statements included; "redis": requests; "cmds": Redis commands) and fixed per run
# ("*_fixed"). Lower them when a change saves round trips (the test says so).
_SHARED: dict[str, dict[str, float]] = {
    "schedule": {
        "db": 1.0,
        "redis": 1.0,
        "cmds": 1.0,
        "db_fixed": 0,
        "redis_fixed": 0,
        "cmds_fixed": 0,
    },
    "schedule_many": {
        # On SQLite, INSERTs of as many rows as its 999 parameters take: 43 rows of the
        # job's 23 columns, so 5 statements for 200 jobs and 10 for 400: 0.025 a job, which
        # the test's figures, to two places, show as 0.03.
        "db": 0.03,
        "redis": 0.0,
        "cmds": 0.0,
        "db_fixed": 5,
        "redis_fixed": 2,
        "cmds_fixed": 2,
    },
    "preload": {
        "db": 0.0,
        "redis": 0.0,
        "cmds": 0.0,
        # One of them reads the enabled recurring schedules.
        "db_fixed": 7,
        "redis_fixed": 4,
        "cmds_fixed": 4,
    },
    "consume_success": {
        "db": 5.0,
        "redis": 1.0,
        "cmds": 1.0,
        "db_fixed": 17,
        "redis_fixed": 6,
        "cmds_fixed": 6,
    },
    "consume_retry": {
        "db": 5.0,
        "redis": 2.0,
        "cmds": 2.0,
        "db_fixed": 17,
        "redis_fixed": 8,
        "cmds_fixed": 8,
    },
    "consume_failure": {
        "db": 5.0,
        "redis": 1.0,
        "cmds": 1.0,
        "db_fixed": 17,
        "redis_fixed": 6,
        "cmds_fixed": 6,
    },
}
BUDGETS: dict[str, dict[str, dict[str, float]]] = {
    "sqlite": _SHARED,
    # schedule_many: one COPY on PostgreSQL, INSERTs in batches on SQLite. A consumed
    # job: its claim, then one statement for its outcome and attempt row on PostgreSQL;
    # BEGIN, the outcome, the attempt row and COMMIT on SQLite.
    "postgresql": {
        **_SHARED,
        "schedule_many": {**_SHARED["schedule_many"], "db": 0.0, "db_fixed": 6},
        **{
            path: {**_SHARED[path], "db": 2.0}
            for path in ("consume_success", "consume_retry", "consume_failure")
        },
    },
}
#: A per-job figure this far below its budget asks for the budget to be lowered.
RATCHET = 0.5
#: Fixed costs: the same, in round trips per run.
FIXED_RATCHET = 3
#: The consumer's loop makes a few idle turns (one Redis pop and one look at the next due
#: time each), at the end of a burst and, with retries, elsewhere, woken by the last
#: release, the recorder or pub/sub: how many is a race. Seen: up to 8 round trips more
#: or less per run. So a consumer run's Redis figures may differ from their budget by that
#: much (fixed: TAIL; per job: TAIL / N); its database figures are exact.
TAIL = 8

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "roundtrips"
#: Jobs per run (the runs are of N and 2N); the consumer's are paced, so fewer.
N = 200
N_CONSUMED = 60
#: The consumer's threads whose work is periodic, not per job (see the docstring).
BACKGROUND_THREADS = ("delayjobs-heartbeat", "delayjobs-listener")
#: How long each consumed job lasts at least: past PREFETCH_BUDGET, one job per claim.
PACE = PREFETCH_BUDGET * 1.5

#: The consumer running now, whose recorder a job waits for (see ``_pace``).
_consumer: list[Consumer] = []


def _pace() -> None:
    """Last PACE at least, and until the recorder has written every earlier outcome."""
    deadline = time.monotonic() + PACE
    recorder = _consumer[0].recorder
    wait_for(
        lambda: time.monotonic() >= deadline and recorder.pending == 0,
        timeout=60,
        interval=PACE / 10,
        message="the recorder did not write the previous outcome",
    )


class Succeeds(delayjobs.JobType):
    name = "tests.roundtrips.succeeds"
    queue = QUEUE

    def execute(self, job: DelayedJob) -> None:
        _pace()


class Retried(delayjobs.JobType):
    """Fails, and is retried in an hour: inside the pre-load window set below, so that the
    retry goes back to Redis, and after the end of the burst."""

    name = "tests.roundtrips.retried"
    queue = QUEUE
    max_attempts = 3

    def execute(self, job: DelayedJob) -> None:
        _pace()
        raise RuntimeError("the service did not answer")

    def retry_delay(self, job: DelayedJob, exc: BaseException) -> timedelta:
        return timedelta(hours=1)


class FailsForGood(delayjobs.JobType):
    name = "tests.roundtrips.fails"
    queue = QUEUE
    max_attempts = 1

    def execute(self, job: DelayedJob) -> None:
        _pace()
        raise RuntimeError("the service said no")


JOB_TYPES = (Succeeds, Retried, FailsForGood)


@pytest.fixture(autouse=True)
def job_types(settings: Any) -> Iterator[None]:
    # No pause re-read in the middle of a run; retries an hour away still go to Redis.
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "IDLE_TIMEOUT": 3600,
        "PRELOAD_WINDOW": 7200,
        "PRELOAD_INTERVAL": 60,
    }
    # Job types with a limit of their own have a lane in every queue, which the consumer
    # pops in turn with its queue's (empty here): set aside, or each claim would cost one
    # or two pops depending on where the rotation stands. One lane: the common case.
    limited = [type(jt) for jt in registry if jt.concurrency is not None]
    for cls in limited:
        registry.remove(cls.name)
    for cls in JOB_TYPES:
        delayjobs.register(cls)
    try:
        yield
    finally:
        for cls in JOB_TYPES:
            registry.remove(cls.name)
        for cls in limited:
            registry.add(cls)


# Measuring ------------------------------------------------------------------------------

#: Prepares a run of ``size`` jobs, uncounted; returns the run itself, counted.
Prepare = Callable[[int], Callable[[], None]]


class Measured:
    """Two counted runs, of N and 2N jobs, and what they saw."""

    def __init__(self, prepare: Prepare, n: int, client: redis.Redis) -> None:
        prepare(2)()  # warm-up: scripts loaded, first connections, caches of this process
        self.n = n
        self.runs: list[RoundTrips] = []
        counts: list[Counts] = []
        client.config_resetstat()
        for size in (n, 2 * n):
            run = prepare(size)
            with count_round_trips() as trips:
                run()
            self.runs.append(trips)
            counts.append(trips.total(exclude_threads=BACKGROUND_THREADS))
        self.server = commandstats(client)
        self.figures: Figures = figures(counts[0], counts[1], n)

    def report(self) -> str:
        """What the run of 2N jobs sent, by statement shape and by Redis request."""
        trips = self.runs[1]
        lines = [f"run of {2 * self.n} jobs:"]
        for kind in (DB, REDIS):
            lines.append(f"  {kind} round trips, by shape and count:")
            shapes = trips.shapes(kind, BACKGROUND_THREADS)
            lines += [f"    {count:6d}  {shape}" for shape, count in shapes.most_common()]
        background = trips.shapes(DB) - trips.shapes(DB, BACKGROUND_THREADS)
        background += trips.shapes(REDIS) - trips.shapes(REDIS, BACKGROUND_THREADS)
        if background:
            lines.append(f"  not counted (threads {', '.join(BACKGROUND_THREADS)}):")
            lines += [f"    {count:6d}  {shape}" for shape, count in background.most_common()]
        server = ", ".join(f"{name} {calls}" for name, calls in self.server.most_common())
        lines.append(f"  Redis server commandstats over both runs: {server}")
        return "\n".join(lines)

    def check_against_server(self) -> None:
        """The server ran at least every command counted here (Lua scripts add their own)."""
        sent = sum(t.commands for trips in self.runs for t in trips.of(REDIS))
        served = sum(calls for name, calls in self.server.items() if name != "config|resetstat")
        assert served >= sent, f"Redis served {served} commands, {sent} counted here"


def check_budget(path: str, measured: Measured, tail: int = 0) -> None:
    """Fail if a figure exceeds its budget (by more than ``tail`` round trips per run, on
    Redis), or is well below it."""
    vendor = connection.vendor
    budget = BUDGETS[vendor][path]
    result = measured.figures
    # Shown with -s: the figures, to set or lower a budget.
    sys.stdout.write(f"\n{path} [{vendor}] per job {result.per_job}, fixed {result.fixed}\n")
    problems = []
    for name, value in result.per_job.items():
        slack = round(tail / measured.n, 2) if name != "db" else 0
        problems += _compare(
            f"{name} per job", value, budget[name], slack, RATCHET, vendor, path, name
        )
    for name, value in result.fixed.items():
        key, slack = f"{name}_fixed", tail if name != "db" else 0
        problems += _compare(
            f"{name} fixed", value, budget[key], slack, FIXED_RATCHET, vendor, path, key
        )
    measured.check_against_server()
    if problems:
        pytest.fail(
            f"Round trips of {path} on {vendor}, N={measured.n}: per job {result.per_job}, "
            f"fixed {result.fixed}\n  " + "\n  ".join(problems) + "\n" + measured.report(),
            pytrace=False,
        )


def _compare(
    what: str,
    value: float,
    allowed: float,
    slack: float,
    ratchet: float,
    vendor: str,
    path: str,
    key: str,
) -> list[str]:
    if value > allowed + slack:
        within = f" + {slack} of noise" if slack else ""
        return [f"{what}: {value} > budget {allowed}{within} (what was added? see below)"]
    if value <= allowed - ratchet - slack:
        return [
            f"{what}: {value}, well below the budget {allowed}: keep the gain, lower "
            f"BUDGETS[{vendor!r}][{path!r}][{key!r}] to {value} (in _SHARED unless "
            f"{vendor} overrides it)"
        ]
    return []


def due_now(job_type: type[delayjobs.JobType], count: int) -> list[DelayedJob]:
    now = timezone.now()
    return delayjobs.schedule_many([{"job_type": job_type.name, "run_at": now}] * count)


def consuming(job_type: type[delayjobs.JobType], final: JobStatus) -> Prepare:
    """Runs of ``size`` due jobs of ``job_type``, scheduled beforehand, consumed."""

    def prepare(size: int) -> Callable[[], None]:
        # A job due in half an hour: a retry (due in an hour) is then never the earliest of
        # the lane, whose wake-up (pub/sub) would add idle turns to the end of a burst.
        delayjobs.schedule(Succeeds.name, delay=timedelta(minutes=30))
        ids = [job.pk for job in due_now(job_type, size)]

        def run() -> None:
            consumer = Consumer(queues=[QUEUE], burst=True, preload=False, concurrency=1)
            _consumer[:] = [consumer]
            assert consumer.run() == 0
            assert consumer.processed == size
            ends = set(DelayedJob.objects.filter(pk__in=ids).values_list("status", flat=True))
            assert ends == {final}

        return run

    return prepare


# The paths ------------------------------------------------------------------------------


def test_schedule_one_job(redis_client: redis.Redis) -> None:
    def prepare(size: int) -> Callable[[], None]:
        def run() -> None:
            for _ in range(size):
                delayjobs.schedule(Succeeds.name)

        return run

    check_budget("schedule", Measured(prepare, N, redis_client))


def test_schedule_many(redis_client: redis.Redis) -> None:
    def prepare(size: int) -> Callable[[], None]:
        return lambda: due_now(Succeeds, size) and None

    check_budget("schedule_many", Measured(prepare, N, redis_client))


def test_preloader_pass(redis_client: redis.Redis) -> None:
    def prepare(size: int) -> Callable[[], None]:
        DelayedJob.objects.all().delete()
        due_now(Succeeds, size)
        redis_client.flushdb()  # Redis lost them all: the pass loads every one

        def run() -> None:
            result = preload()
            assert (result.ran, result.loaded, result.errors) == (True, size, [])

        return run

    check_budget("preload", Measured(prepare, N, redis_client))


def test_consumer_success(redis_client: redis.Redis) -> None:
    prepare = consuming(Succeeds, JobStatus.SUCCEEDED)
    check_budget("consume_success", Measured(prepare, N_CONSUMED, redis_client), tail=TAIL)


def test_consumer_failure_retried(redis_client: redis.Redis) -> None:
    prepare = consuming(Retried, JobStatus.SCHEDULED)
    check_budget("consume_retry", Measured(prepare, N_CONSUMED, redis_client), tail=TAIL)


def test_consumer_failure_final(redis_client: redis.Redis) -> None:
    prepare = consuming(FailsForGood, JobStatus.FAILED)
    check_budget("consume_failure", Measured(prepare, N_CONSUMED, redis_client), tail=TAIL)
