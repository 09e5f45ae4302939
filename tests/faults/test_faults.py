"""Faults injected under load: killed consumers, a flushed, stopped or restarted server.

Each scenario runs real ``run_delay_consumer`` processes on the suite's own PostgreSQL and
Redis, schedules thousands of ``faults.ledger`` jobs, injects its fault while they run,
waits until every row is final, and checks the ledger against what was scheduled (see
``FaultRun.verify``): nothing lost, nothing cancelled run, no attempt run twice, and a job
runs twice only if its lease expired in a consumer the fault hit. Waits are for events
(ledger lines, rows, subscribers); the only fixed waits are the fault windows themselves.
"""

from __future__ import annotations

import re
import signal
import time

import pytest

from delayjobs.conf import DEFAULTS
from delayjobs.models import AttemptOutcome, JobStatus
from tests.consumers import check_alive
from tests.faults.harness import (
    DB_MODE_LINE,
    REDIS_BACK_LINE,
    Batch,
    RunFactory,
    first_after,
    first_starts,
    lateness,
    percentiles,
    resumed_after,
    seconds,
)

pytestmark = pytest.mark.faults


#: The standard load: jobs due over SPREAD seconds from START_IN seconds after scheduling,
#: a few hundred of them cancelled before they are due.
JOBS = 3000
START_IN = 1.0
SPREAD = 6.0
CANCEL = 300
CONCURRENCY = 10
#: Faults strike once this many executions are in the ledger: in the thick of the load.
FAULT_AFTER = 1000


def test_a_sigkill_of_one_of_two_consumers(fault_run: RunFactory) -> None:
    run = fault_run("a", "SIGKILL of one of two consumers under load")
    victim = run.start_consumer("a-victim", concurrency=CONCURRENCY)
    survivor = run.start_consumer("a-survivor", concurrency=CONCURRENCY)
    run.wait_listening([victim, survivor])
    # 20 ms jobs: about ten running at any moment, so the kill always interrupts some.
    with run.stopped([victim, survivor]):  # the fault strikes mid-load, however slow the driver
        run.schedule(JOBS, start_in=START_IN, spread=SPREAD, work_ms=20, cancel=CANCEL)
    run.wait_executions(FAULT_AFTER, [victim, survivor])

    killed_at = time.time()
    victim.kill()
    # Nobody renews these leases any more. A transaction the dying process had sent may
    # still commit after this read: a claim (that job never ran there, so it cannot
    # repeat) or a batch of outcomes (those jobs are done: they need not run again).
    in_flight = run.running(worker="a-victim")
    restarted = run.start_consumer("a-restarted", concurrency=CONCURRENCY)
    final_at = run.wait_final([survivor, restarted])

    executions = run.verify(in_flight=[row.job_id for row in in_flight])
    run.check(bool(in_flight), "nothing was in flight in the killed consumer: proves nothing")
    outcomes = run.outcomes()
    recorded_late = [
        row for row in in_flight if AttemptOutcome.SUCCEEDED in outcomes[(row.job_id, row.attempt)]
    ]
    reruns: list[float] = []
    for row in in_flight:
        if row in recorded_late:
            continue
        later = [
            e.started for e in executions if e.job_id == row.job_id and e.attempt > row.attempt
        ]
        run.check(
            bool(later), f"job {row.job_id}, in flight in the killed consumer, never ran again"
        )
        if later:
            run.check(
                min(later) >= row.lease_expires_at,
                f"job {row.job_id} ran again before its lease expired",
            )
            reruns.append(min(later))
    for worker in ("a-survivor", "a-restarted"):
        run.check(
            first_after(executions, killed_at, worker) is not None,
            f"{worker} ran nothing after the kill",
        )
    run.finish(
        fault="SIGKILL of one consumer (of two, concurrency 10 each) after 1,000 executions; "
        "a new consumer started at once",
        duplicate_cause="attempts in flight in the killed consumer, run again once their "
        "3 s lease expired and the pre-loader returned them to scheduled",
        outcomes_committed_after_kill=len(recorded_late),
        executions_resumed_after_s=seconds(killed_at, first_after(executions, killed_at)),
        killed_jobs_rerun_after_s=seconds(killed_at, max(reruns) if reruns else None),
        all_final_after_s=seconds(killed_at, final_at),
        recovery_s=seconds(killed_at, max(reruns) if reruns else None),
        recovery_means="from the kill until the last job in flight in the killed consumer "
        "ran again",
    )


def test_b_redis_flushall_under_load(fault_run: RunFactory) -> None:
    run = fault_run("b", "Redis FLUSHALL under load")
    consumers = [run.start_consumer(name, concurrency=CONCURRENCY) for name in ("b-one", "b-two")]
    run.wait_listening(consumers)
    with run.stopped(consumers):  # the fault strikes mid-load, however slow the driver
        run.schedule(JOBS, start_in=START_IN, spread=SPREAD, cancel=CANCEL)
    run.wait_executions(FAULT_AFTER, consumers)

    flushed_at = time.time()
    run.redis.flushall()
    waiting = run.statuses()[JobStatus.SCHEDULED]
    final_at = run.wait_final(consumers)

    executions = run.verify()
    run.check(waiting > 0, "every job had run before the flush: proves nothing")
    resumed = resumed_after(run, executions, flushed_at)
    run.finish(
        fault="FLUSHALL after 1,000 executions, two consumers",
        scheduled_jobs_at_fault=waiting,
        duplicate_cause="none allowed: no consumer lost a job",
        executions_resumed_after_s=resumed,
        lateness_after_fault_s=lateness(run, executions, flushed_at, float("inf")),
        all_final_after_s=seconds(flushed_at, final_at),
        recovery_s=resumed,
        recovery_means="from the flush until the first job due after it started (the "
        "pre-loader rebuilt the index from the database)",
    )


#: Scenario c: how long Redis stays down, and how long before it comes back a job may
#: come due and still be expected to run during the outage (a few database polls).
REDIS_OUTAGE = 30.0
POLL_MARGIN = 3 * DEFAULTS["DATABASE_POLL_INTERVAL"].total_seconds()


def test_c_redis_stopped_for_30_seconds(fault_run: RunFactory) -> None:
    run = fault_run("c", "Redis stopped for 30 s under load, started again empty")
    consumers = [run.start_consumer(name, concurrency=CONCURRENCY) for name in ("c-one", "c-two")]
    run.wait_listening(consumers)
    # Due over the whole outage and beyond; those due after the first 5 s of the window
    # were never in Redis: only the database knows them while Redis is down.
    before = run.schedule(4000, start_in=START_IN, spread=REDIS_OUTAGE + 10)
    run.wait_executions(200, consumers)

    stopped_at = time.time()
    run.services.redis.take_down()
    # While Redis is down: scheduling must still work (the hand-off fails, the row counts),
    # and cancelling too (the stale index entry cannot be removed).
    during = run.schedule(500, start_in=START_IN, spread=REDIS_OUTAGE / 2)
    run.cancel(before.ids, CANCEL, margin=2.0)
    check_alive(consumers)
    time.sleep(max(0.0, stopped_at + REDIS_OUTAGE - time.time()))  # the fault window
    restarted_at = time.time()
    run.services.redis.bring_up()
    final_at = run.wait_final(consumers)

    executions = run.verify()
    first = first_starts(executions)
    due_in_outage = [
        pk
        for pk, run_at in run.run_at.items()
        if pk not in run.cancelled and stopped_at <= run_at < restarted_at - POLL_MARGIN
    ]
    waited = [pk for pk in due_in_outage if first.get(pk, float("inf")) >= restarted_at]
    run.check(
        not waited,
        f"{len(waited)} of {len(due_in_outage)} jobs due during the Redis outage did not run "
        f"before Redis came back (no database fallback?)",
    )
    mode_changes = {}
    for name, consumer in run.consumers.items():
        output = consumer.output()
        mode_changes[name] = output.count(DB_MODE_LINE)
        run.check(
            mode_changes[name] == 1,
            f"{name} logged {DB_MODE_LINE!r} {mode_changes[name]} time(s), not once",
        )
        mode_at = output.find(DB_MODE_LINE)
        run.check(
            mode_at != -1 and output.find(REDIS_BACK_LINE, mode_at) != -1,
            f"{name} did not log {REDIS_BACK_LINE!r} after the mode change",
        )
    ran_in_outage = [e for e in executions if stopped_at <= e.started < restarted_at]
    run.finish(
        fault=f"Redis stopped (SIGTERM, by pid) for {REDIS_OUTAGE:.0f} s after 200 "
        "executions, then a new empty Redis on the same port; 500 jobs scheduled and 300 "
        "cancelled while it was down",
        scheduled_during_outage=len(during.ids),
        duplicate_cause="none allowed: no consumer lost a job",
        jobs_due_during_outage=len(due_in_outage),
        jobs_due_during_outage_run_after_redis_returned=len(waited),
        executions_during_outage=len(ran_in_outage),
        lateness_during_outage_s=lateness(run, executions, stopped_at, restarted_at - POLL_MARGIN),
        database_mode_lines=mode_changes,
        executions_resumed_after_s=resumed_after(run, executions, stopped_at),
        all_final_after_s=seconds(restarted_at, final_at),
        recovery_s=resumed_after(run, executions, stopped_at),
        recovery_means="from the stop until the first job due after it started (on the "
        "database fallback)",
    )


#: Scenario d: longer than the lease (3 s), so leases of jobs running at the cut expire.
POSTGRES_OUTAGE = 5.0


def test_d_postgresql_restarted_under_load(fault_run: RunFactory) -> None:
    run = fault_run("d", f"PostgreSQL restarted under load ({POSTGRES_OUTAGE:.0f} s down)")
    consumers = [run.start_consumer(name, concurrency=CONCURRENCY) for name in ("d-one", "d-two")]
    run.wait_listening(consumers)
    with run.stopped(consumers):  # the fault strikes mid-load, however slow the driver
        run.schedule(JOBS, start_in=START_IN, spread=SPREAD, cancel=CANCEL)
    run.wait_executions(FAULT_AFTER, consumers)

    snapshot_at = time.time()
    running = run.running()
    down_at = time.time()
    run.services.postgres.take_down()
    time.sleep(max(0.0, down_at + POSTGRES_OUTAGE - time.time()))  # the fault window
    restarting_at = time.time()
    run.services.postgres.bring_up()
    up_at = time.time()
    final_at = run.wait_final(consumers)

    # In flight at the cut: what was running at the snapshot, and what started after it
    # but before PostgreSQL was started again (a start needs a claim, and a claim needs
    # the database, so those were claimed before it went down).
    ledger = run.executions()
    in_flight = {row.job_id for row in running} | {
        e.job_id for e in ledger if snapshot_at <= e.started < restarting_at
    }
    executions = run.verify(in_flight=in_flight)
    for consumer in consumers:  # reconnected, not crashed: nothing would restart them
        run.check(
            consumer.returncode is None,
            f"consumer {consumer.pid} exited with {consumer.returncode}:\n"
            f"{consumer.output()[-3000:]}",
        )
    for name in run.consumers:
        run.check(
            first_after(executions, up_at, name) is not None,
            f"{name} ran nothing after the restart",
        )
    run.finish(
        fault=f"PostgreSQL fast shutdown (SIGINT to the postmaster, by pid) after 1,000 "
        f"executions, started again {POSTGRES_OUTAGE:.0f} s later on the same data and port",
        duplicate_cause="attempts running when the database went away: their leases "
        "(3 s) could not be renewed during the 5 s outage, so the pre-loader returned them "
        "to scheduled before their consumers could record the outcome",
        running_at_snapshot=len(running),
        postgres_start_s=seconds(restarting_at, up_at),
        executions_resumed_after_s=seconds(restarting_at, first_after(executions, restarting_at)),
        all_final_after_s=seconds(restarting_at, final_at),
        recovery_s=seconds(restarting_at, first_after(executions, restarting_at)),
        recovery_means="from starting PostgreSQL again (its own start-up included) until "
        "the next job started; every job was due by then, the backlog of the outage",
    )


def test_e_four_consumers_20000_jobs_due_at_one_instant(fault_run: RunFactory) -> None:
    run = fault_run("e", "Four consumers, 20,000 jobs due at one instant")
    consumers = [run.start_consumer(f"e-{n}", concurrency=CONCURRENCY) for n in range(1, 5)]
    run.wait_listening(consumers)
    # Far enough ahead that the cancels are done before the jobs are due.
    batch = run.schedule(20_000, start_in=5.0, work_ms=1, cancel=500, cancel_margin=0.5)
    due = min(batch.run_at.values())
    final_at = run.wait_final(consumers)

    executions = run.verify()  # no duplicate allowed, no attempt twice
    per_worker = run.figures["executions_per_worker"]
    for name in run.consumers:
        run.check(per_worker.get(name, 0) > 0, f"{name} ran nothing")
    last_start = max(e.started for e in executions) if executions else None
    run.finish(
        fault="none: 20,000 jobs due at the same instant, four consumers racing for them",
        duplicate_cause="none allowed",
        drain_s=seconds(due, last_start),
        jobs_per_second=round(len(executions) / (last_start - due), 1)
        if last_start and last_start > due
        else None,
        all_final_after_s=seconds(due, final_at),
        recovery_s=None,
        recovery_means="no fault",
    )


def test_f_sigterm_under_load(fault_run: RunFactory) -> None:
    run = fault_run("f", "SIGTERM under load, then a restarted consumer")
    graceful = run.start_consumer("f-graceful", concurrency=CONCURRENCY)
    run.wait_listening([graceful])
    # Longer jobs, so that most slots are busy when the signal comes.
    with run.stopped([graceful]):  # the fault strikes mid-load, however slow the driver
        run.schedule(JOBS, start_in=START_IN, spread=SPREAD, work_ms=15, cancel=CANCEL)
    run.wait_executions(FAULT_AFTER, [graceful])

    term_at = time.time()
    graceful.send_signal(signal.SIGTERM)
    code = graceful.wait(timeout=60)
    exited_at = time.time()
    output = graceful.output()
    match = re.search(r"SIGTERM: finishing (\d+) running job", output)
    left_running = run.running(worker="f-graceful")
    restarted_at = time.time()
    restarted = run.start_consumer("f-restarted", concurrency=CONCURRENCY)
    final_at = run.wait_final([restarted])

    executions = run.verify()  # no duplicate allowed: nothing was abandoned
    run.check(code == 0, f"the consumer exited with {code} after SIGTERM:\n{output[-3000:]}")
    run.check(match is not None, "no 'SIGTERM: finishing N running job(s)' line")
    run.check(not left_running, f"jobs left running by the stopped consumer: {left_running[:5]}")
    # After the handler ran, at most the claim it interrupted can still start jobs.
    started_after = [e for e in executions if e.worker == "f-graceful" and e.started > term_at]
    run.check(
        len(started_after) <= CONCURRENCY,
        f"{len(started_after)} jobs started after SIGTERM: it kept claiming",
    )
    run.check(
        first_after(executions, restarted_at, "f-restarted") is not None,
        "the restarted consumer ran nothing",
    )
    resumed = seconds(restarted_at, first_after(executions, restarted_at, "f-restarted"))
    run.finish(
        fault="SIGTERM to the only consumer after 1,000 executions (15 ms jobs); a new "
        "consumer started once it had exited",
        running_at_sigterm=int(match.group(1)) if match else None,
        started_after_sigterm=len(started_after),
        duplicate_cause="none allowed: running jobs finish and are recorded before exit",
        drained_and_exited_after_s=seconds(term_at, exited_at),
        executions_resumed_after_s=resumed,
        all_final_after_s=seconds(restarted_at, final_at),
        recovery_s=resumed,
        recovery_means="from starting the new consumer (process start-up included) until "
        "its first job",
    )


def test_g_jobs_due_in_the_past_run_at_once(fault_run: RunFactory) -> None:
    run = fault_run("g", "Jobs scheduled with run_at already in the past")
    # No pre-loader and an idle timeout of an hour: only schedule()'s hand-off to Redis
    # and its wake-up can bring these jobs to the consumers before the test times out.
    consumers = [
        run.start_consumer(
            name, "--no-preload", concurrency=CONCURRENCY, overrides={"IDLE_TIMEOUT": 3600}
        )
        for name in ("g-one", "g-two")
    ]
    run.wait_listening(consumers)
    one_by_one = run.schedule(1000, start_in=-3600, spread=3590, bulk=False)
    in_bulk = run.schedule(1000, start_in=-60, spread=59)
    final_at = run.wait_final(consumers, timeout=60)

    executions = run.verify()
    first = first_starts(executions)

    def start_after_scheduled(batch: Batch) -> dict[str, float] | None:
        return percentiles([first[pk] - batch.scheduled_at[pk] for pk in batch.ids if pk in first])

    run.finish(
        fault="none: 1,000 jobs due 1 h to 10 s ago scheduled one by one, 1,000 due up to "
        "60 s ago in one schedule_many; consumers without pre-loader",
        duplicate_cause="none allowed",
        start_after_schedule_returned_s=start_after_scheduled(one_by_one),
        start_after_schedule_many_returned_s=start_after_scheduled(in_bulk),
        all_final_after_s=seconds(in_bulk.ended, final_at),
        recovery_s=None,
        recovery_means="no fault",
    )
