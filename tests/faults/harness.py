"""What every fault scenario shares: consumers, scheduling, the ledger, waiting and checks.

A scenario starts ``run_delay_consumer`` processes on the suite's servers, schedules jobs
through ``tests.faults.driver``, injects its fault, waits (by polling the database) until
every job is final, and then ``FaultRun.verify`` compares the ledger of executions with
the jobs scheduled and the rows delayjobs wrote. Figures go to the results file that
``python -m tests.faults.report`` renders.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from tests.conftest import ConsumerProcess
from tests.consumers import check_alive
from tests.faults.jobs import LEDGER_ENV, QUEUE
from tests.faults.results import Results
from tests.faults.services import REPO_ROOT, FaultServices
from tests.utils import wait_for, wait_listening

JOBS = DelayedJob._meta.db_table
ATTEMPTS = JobAttempt._meta.db_table
FINAL = (JobStatus.SUCCEEDED, JobStatus.CANCELLED)
DRIVER_TIMEOUT = 120.0
#: How long a scenario may take to make every row final before it fails with diagnostics.
#: Generous: it only bounds a hang; the figures say how long it really took.
FINAL_TIMEOUT = 180.0
POLL = 0.1
#: What a consumer logs when it falls back to the database, and when it returns to Redis.
DB_MODE_LINE = "claiming due jobs from the database"
REDIS_BACK_LINE = "Redis is back"


#: What the ``fault_run`` fixtures give a scenario: ``start(scenario, title) -> FaultRun``.
RunFactory = Callable[[str, str], "FaultRun"]


@contextmanager
def fault_runs(services: FaultServices, results: Results, directory: Path) -> Iterator[RunFactory]:
    """Factory ``start(scenario, title) -> FaultRun``; every run's consumers are SIGKILLed
    when the block ends (a fixture's teardown)."""
    runs: list[FaultRun] = []

    def start(scenario: str, title: str) -> FaultRun:
        run = FaultRun(scenario, title, services, directory, results)
        runs.append(run)
        return run

    try:
        yield start
    finally:
        for run in runs:
            run.stop_all()


@dataclass(frozen=True)
class Execution:
    """One line of the ledger: an execution of an attempt of a job, as the job saw it."""

    job_id: int
    attempt: int
    worker: str
    started: float  # epoch seconds

    @classmethod
    def parse(cls, line: str) -> Execution:
        job_id, attempt, worker, started = line.split(" ")
        return cls(int(job_id), int(attempt), worker, float(started))


@dataclass
class Batch:
    """Jobs scheduled by one driver call."""

    ids: list[int]
    run_at: dict[int, float]
    scheduled_at: dict[int, float]
    cancelled: set[int]
    began: float
    ended: float
    paused_at: float | None = None  # when the queue given as then_pause was paused


@dataclass
class Running:
    """A row in ``running`` at some moment: an attempt in flight."""

    job_id: int
    attempt: int
    worker: str
    lease_expires_at: float


@dataclass
class FaultRun:
    """One scenario's consumers, jobs, ledger, figures and problems."""

    scenario: str
    title: str
    services: FaultServices
    directory: Path
    results: Results
    consumers: dict[str, ConsumerProcess] = field(default_factory=dict)
    run_at: dict[int, float] = field(default_factory=dict)
    cancelled: set[int] = field(default_factory=set)
    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.ledger = self.directory / "ledger.txt"
        self.ledger.touch()
        self.redis = self.services.redis_client()
        # A clean slate: the previous scenario's rows and index entries would only blur
        # this one's figures (they are all final, so they could not change its outcome).
        self.redis.flushall()
        with self.services.connect() as connection:
            connection.execute(f'TRUNCATE "{ATTEMPTS}", "{JOBS}"')

    # Consumers --------------------------------------------------------------------------

    def start_consumer(
        self,
        worker_id: str,
        *args: str,
        concurrency: int = 10,
        overrides: dict[str, Any] | None = None,
        prefix: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> ConsumerProcess:
        """``prefix`` runs it elsewhere (``ip netns exec NAME``); ``env`` adds variables
        (other server addresses, say)."""
        full_env = self.services.env(**{LEDGER_ENV: str(self.ledger)}, **(env or {}))
        if overrides:
            full_env["DELAYJOBS_TEST_OVERRIDES"] = json.dumps(overrides)
        consumer = ConsumerProcess(
            ["--queue", QUEUE, "--concurrency", str(concurrency), "--worker-id", worker_id, *args],
            self.directory / f"{worker_id}.log",
            full_env,
            prefix=prefix,
        )
        self.consumers[worker_id] = consumer
        return consumer

    def wait_listening(self, consumers: Sequence[ConsumerProcess]) -> None:
        """Started and idle: subscribed to the queue's wake-up channel."""
        wait_listening(self.redis, consumers, QUEUE)

    @contextmanager
    def stopped(self, consumers: Sequence[ConsumerProcess]) -> Iterator[None]:
        """The consumers SIGSTOPped for the block, SIGCONTed after it. Around a batch's
        scheduling: on a loaded machine the driver can return seconds late (the consumers
        running its first jobs compete for the CPU with its cancels), by which time the
        whole batch may have run, and a fault meant for the thick of the load would strike
        after it. Stopped, they take nothing until the batch is written."""
        for consumer in consumers:
            consumer.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            for consumer in consumers:
                consumer.send_signal(signal.SIGCONT)

    def stop_all(self) -> None:
        for consumer in self.consumers.values():
            consumer.kill()
        self.redis.close()

    # Jobs -------------------------------------------------------------------------------

    def _driver(self, request: dict[str, Any]) -> dict[str, Any]:
        completed = subprocess.run(
            [sys.executable, "-m", "tests.faults.driver"],
            cwd=REPO_ROOT,
            env=self.services.env(),
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=DRIVER_TIMEOUT,
            check=False,
        )
        if completed.returncode != 0:
            raise AssertionError(
                f"driver {request['action']} failed ({completed.returncode}):\n"
                f"{completed.stderr[-5000:]}"
            )
        answer: dict[str, Any] = json.loads(completed.stdout)
        return answer

    def schedule(
        self,
        count: int,
        *,
        start_in: float,
        spread: float = 0.0,
        work_ms: float = 5,
        bulk: bool = True,
        cancel: int = 0,
        cancel_margin: float = 1.0,
        queues: Sequence[str] = (),
        then_pause: str | None = None,
    ) -> Batch:
        """Schedule ``count`` jobs due from ``start_in`` s from now, over ``spread`` s.

        ``queues``: spread the jobs over these queues, round robin (default: the suite's).
        ``then_pause``: a queue to pause right after, in the same process.
        """
        answer = self._driver(
            {
                "action": "schedule",
                "count": count,
                "start_in": start_in,
                "spread": spread,
                "work_ms": work_ms,
                "bulk": bulk,
                "cancel": cancel,
                "cancel_margin": cancel_margin,
                "queues": list(queues),
                "then_pause": then_pause,
            }
        )
        batch = Batch(
            ids=answer["ids"],
            run_at=dict(zip(answer["ids"], answer["run_at"], strict=True)),
            scheduled_at=dict(zip(answer["ids"], answer["scheduled_at"], strict=True)),
            cancelled=set(answer["cancelled"]),
            began=answer["began"],
            ended=answer["ended"],
            paused_at=answer["paused_at"],
        )
        self.run_at.update(batch.run_at)
        self.cancelled |= batch.cancelled
        return batch

    def cancel(self, ids: Iterable[int], count: int, margin: float) -> set[int]:
        """Cancel ``count`` of ``ids`` due ``margin`` s from now or later; return the cancelled."""
        answer = self._driver(
            {"action": "cancel", "ids": list(ids), "count": count, "margin": margin}
        )
        cancelled = set(answer["cancelled"])
        self.cancelled |= cancelled
        return cancelled

    def set_paused(self, queue: str, paused: bool) -> float:
        """Pause or resume ``queue`` from a process of its own; when it was committed."""
        answer = self._driver({"action": "pause" if paused else "resume", "queue": queue})
        assert answer["changed"], f"{queue!r} was {'already' if paused else 'not'} paused"
        return float(answer["at"])

    # The ledger ---------------------------------------------------------------------------

    def executions(self) -> list[Execution]:
        text = self.ledger.read_text()
        return [Execution.parse(line) for line in text.splitlines()]

    def executed_count(self) -> int:
        return self.ledger.read_bytes().count(b"\n")

    def wait_executions(self, count: int, consumers: Sequence[ConsumerProcess]) -> None:
        """Wait until the ledger holds ``count`` executions: the load is well under way."""

        def enough() -> bool:
            check_alive(consumers)
            return self.executed_count() >= count

        wait_for(enough, timeout=60, interval=0.01, message=self._diagnostics("executions"))

    # The database -------------------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Read the suite's database; a new connection each time, so restarts are harmless."""
        with self.services.connect() as connection:
            return connection.execute(sql, params).fetchall()  # type: ignore[arg-type]

    def statuses(self) -> Counter[str]:
        rows = self.query(f'SELECT status, count(*) FROM "{JOBS}" GROUP BY status')
        return Counter(dict(rows))

    def running(self, worker: str | None = None) -> list[Running]:
        sql = (
            f'SELECT id, attempts, worker_id, lease_expires_at FROM "{JOBS}" WHERE status = %s'
            + (" AND worker_id = %s" if worker is not None else "")
        )
        params = [JobStatus.RUNNING] + ([worker] if worker is not None else [])
        return [
            Running(pk, attempts, worker_id, lease.timestamp())
            for pk, attempts, worker_id, lease in self.query(sql, params)
        ]

    def outcomes(self) -> dict[tuple[int, int], set[str]]:
        """The outcomes of the attempt rows, by (job, attempt number)."""
        found: dict[tuple[int, int], set[str]] = defaultdict(set)
        for job_id, number, outcome in self.query(
            f'SELECT job_id, number, outcome FROM "{ATTEMPTS}"'
        ):
            found[(job_id, number)].add(outcome)
        return found

    def wait_final(
        self, consumers: Sequence[ConsumerProcess], timeout: float = FINAL_TIMEOUT
    ) -> float:
        """Wait until no row is scheduled or running; return when the last one became final."""

        def done() -> bool:
            check_alive(consumers)
            counts = self.statuses()
            return not counts[JobStatus.SCHEDULED] and not counts[JobStatus.RUNNING]

        wait_for(done, timeout=timeout, interval=POLL, message=self._diagnostics("final rows"))
        (last,) = self.query(f'SELECT max(finished_at) FROM "{JOBS}"')
        return last[0].timestamp() if isinstance(last[0], datetime) else time.time()

    def _diagnostics(self, waiting_for: str) -> str:
        """Everything useful when a wait times out: states, stuck rows, Redis, logs."""
        lines = [f"{self.scenario}: timed out waiting for {waiting_for}"]
        try:
            lines.append(f"statuses: {dict(self.statuses())}")
            stuck = self.query(
                f'SELECT id, status, attempts, worker_id, run_at, lease_expires_at FROM "{JOBS}" '
                "WHERE status IN (%s, %s) ORDER BY run_at LIMIT 10",
                [JobStatus.SCHEDULED, JobStatus.RUNNING],
            )
            lines.append(f"first rows not final: {stuck}")
        except Exception as exc:  # the database may be what is broken
            lines.append(f"database unreadable: {exc!r}")
        try:
            lines.append(f"Redis entries: {self.redis.dbsize()}")
        except Exception as exc:
            lines.append(f"Redis unreadable: {exc!r}")
        lines.append(f"ledger: {self.executed_count()} executions")
        for name, consumer in self.consumers.items():
            lines.append(f"--- {name} (pid {consumer.pid}, exit {consumer.returncode}):")
            lines.append(consumer.output()[-3000:])
        return "\n".join(lines)

    # Checks -------------------------------------------------------------------------------

    def verify(self, in_flight: Iterable[int] = ()) -> list[Execution]:
        """Compare the ledger with the jobs scheduled and the rows; record figures, problems.

        ``in_flight``: jobs running in the consumers the fault hit (killed, or cut off from
        the database), the only ones allowed to run twice. Returns the ledger.
        """
        in_flight = set(in_flight)
        executions = self.executions()
        by_job: dict[int, list[Execution]] = defaultdict(list)
        for execution in executions:
            by_job[execution.job_id].append(execution)
        expected = set(self.run_at) - self.cancelled
        lost = expected - set(by_job)
        cancelled_ran = self.cancelled & set(by_job)
        strangers = set(by_job) - set(self.run_at)
        repeated = [
            key for key, n in Counter((e.job_id, e.attempt) for e in executions).items() if n > 1
        ]
        outcomes = self.outcomes()
        expired = {key for key, found in outcomes.items() if AttemptOutcome.LEASE_EXPIRED in found}

        # A duplicate is an execution beyond a job's first. It is explained if the attempt
        # it repeated ended with an expired lease (the consumer running it died or lost the
        # database for longer than the lease), as at-least-once delivery allows.
        duplicated = {job_id: runs for job_id, runs in by_job.items() if len(runs) > 1}
        duplicates = sum(len(runs) - 1 for runs in duplicated.values())
        unexplained = [
            (job_id, run.attempt)
            for job_id, runs in duplicated.items()
            for run in sorted(runs, key=lambda run: run.attempt)[:-1]
            if (job_id, run.attempt) not in expired
        ]
        outside = sorted(set(duplicated) - in_flight)
        unrecorded = sorted({(e.job_id, e.attempt) for e in executions} - set(outcomes))
        # A job never starts before its run_at: Redis pops only ids whose score is due, and
        # the database path claims only rows due by the claim's time.
        early = [
            e for e in executions if e.job_id in self.run_at and e.started < self.run_at[e.job_id]
        ]
        statuses = dict(self.statuses())
        not_final = {status: n for status, n in statuses.items() if status not in FINAL}
        (cancelled_rows,) = self.query(
            f'SELECT count(*) FROM "{JOBS}" WHERE status = %s AND id = ANY(%s)',
            [JobStatus.CANCELLED, sorted(self.cancelled)],
        )

        self.figures.update(
            scheduled=len(self.run_at),
            cancelled=len(self.cancelled),
            executions=len(executions),
            jobs_executed=len(by_job),
            lost=len(lost),
            cancelled_ran=len(cancelled_ran),
            duplicates=duplicates,
            duplicates_explained_by_lease_expiry=duplicates - len(unexplained),
            lease_expired_attempts=len(expired),
            in_flight_bound=len(in_flight),
            attempts_run_twice=len(repeated),
            started_before_run_at=len(early),
            final_statuses=statuses,
            executions_per_worker=dict(Counter(e.worker for e in executions)),
        )
        self.check(not lost, f"{len(lost)} job(s) never ran, e.g. {sorted(lost)[:10]}")
        self.check(not cancelled_ran, f"cancelled job(s) ran: {sorted(cancelled_ran)[:10]}")
        self.check(
            not strangers, f"job(s) not scheduled by this scenario ran: {sorted(strangers)[:10]}"
        )
        self.check(not repeated, f"(job, attempt) executed more than once: {repeated[:10]}")
        self.check(
            not unexplained,
            f"{len(unexplained)} re-executed attempt(s) without a lease_expired attempt row: "
            f"{unexplained[:10]}",
        )
        self.check(
            not outside and duplicates <= len(in_flight),
            f"{duplicates} duplicate execution(s), of jobs {outside[:10]} not in flight in the "
            f"faulted consumers (bound: {len(in_flight)})",
        )
        self.check(not unrecorded, f"execution(s) without an attempt row: {unrecorded[:10]}")
        self.check(not early, f"{len(early)} execution(s) started before run_at: {early[:5]}")
        self.check(not not_final, f"rows not final: {not_final}")
        self.check(
            cancelled_rows[0] == len(self.cancelled)
            and statuses.get(JobStatus.SUCCEEDED) == len(expected),
            f"final states {statuses}: expected {len(expected)} succeeded and "
            f"{len(self.cancelled)} cancelled",
        )
        return executions

    def check(self, condition: bool, problem: str) -> None:
        """Note a failed check; ``finish`` fails the test after the figures are recorded."""
        if not condition:
            self.problems.append(problem)

    def finish(self, **figures: Any) -> None:
        """Record this scenario's figures (failed or not), then fail if a check did."""
        self.figures.update(figures)
        self.figures.update(
            scenario=self.scenario,
            title=self.title,
            total_seconds=round(time.time() - self.started, 2),
            passed=not self.problems,
            problems=self.problems,
        )
        self.results.record(self.scenario, self.figures)
        assert not self.problems, f"{self.scenario}: " + "\n".join(self.problems)


def first_after(
    executions: Iterable[Execution], moment: float, worker: str | None = None
) -> float | None:
    """Start of the first execution after ``moment`` (of ``worker``, if given)."""
    starts = [e.started for e in executions if e.started > moment and worker in (None, e.worker)]
    return min(starts) if starts else None


def seconds(start: float | None, end: float | None) -> float | None:
    """``end - start`` rounded for the report; None if either is unknown."""
    if start is None or end is None:
        return None
    return round(end - start, 3)


def percentiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)

    def at(fraction: float) -> float:
        return round(ordered[min(int(fraction * len(ordered)), len(ordered) - 1)], 4)

    return {"p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 4)}


def first_starts(executions: Iterable[Execution]) -> dict[int, float]:
    """Each job's first execution start."""
    first: dict[int, float] = {}
    for execution in executions:
        if execution.started < first.get(execution.job_id, float("inf")):
            first[execution.job_id] = execution.started
    return first


def resumed_after(run: FaultRun, executions: list[Execution], moment: float) -> float | None:
    """Seconds from ``moment`` to the first start of a job due at or after it.

    Jobs due earlier may have been popped before the fault and run from memory; a job due
    after the fault ended can only run once the system works again.
    """
    starts = [
        e.started
        for e in executions
        if run.run_at.get(e.job_id, 0.0) >= moment and e.started >= moment
    ]
    return seconds(moment, min(starts)) if starts else None


def lateness(
    run: FaultRun, executions: list[Execution], due_from: float, due_to: float
) -> dict[str, float] | None:
    """Lateness (first start minus run_at) of the jobs due in [due_from, due_to)."""
    first = first_starts(executions)
    return percentiles(
        [first[pk] - run.run_at[pk] for pk in first if due_from <= run.run_at[pk] < due_to]
    )
