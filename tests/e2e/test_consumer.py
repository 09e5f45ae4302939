"""End to end: real ``run_delay_consumer`` subprocesses on the test database and real Redis.

Every test waits for events (rows in the database, log lines, pub/sub subscribers), never
for a fixed time, and asserts no timing threshold: lateness is the benchmark's business.
The ``tests.scripted`` job type writes an ``Execution`` row each time it starts, which is
the ledger compared against the jobs scheduled.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from django.core.management import CommandError, call_command
from django.db import transaction
from django.utils import timezone

import delayjobs
from delayjobs.engine.execution import Running
from delayjobs.index.keys import due_key
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from tests.conftest import ConsumerFactory
from tests.consumers import (
    executions_per_job,
    history,
    statuses,
    wait_executed,
    wait_final,
    wait_output,
)
from tests.models import Execution
from tests.utils import wait_for, wait_listening

pytestmark = [pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

SCRIPTED = "tests.scripted"
COUNTED = "tests.counted"
QUEUE = "default"


# Running what is due ---------------------------------------------------------------------


def test_burst_runs_every_due_job_once_then_exits(
    consumer_process: ConsumerFactory, redis_client: redis.Redis
) -> None:
    jobs = delayjobs.schedule_many([{"job_type": COUNTED, "payload": {"n": n}} for n in range(200)])
    ids = [job.pk for job in jobs]
    assert redis_client.zcard(due_key(QUEUE)) == len(ids)

    consumer = consumer_process("--burst", "--concurrency", "8")
    assert consumer.wait(timeout=60) == 0, consumer.output()

    assert statuses(ids) == {JobStatus.SUCCEEDED: len(ids)}
    assert executions_per_job() == dict.fromkeys(ids, 1)
    attempts = list(JobAttempt.objects.filter(job_id__in=ids).select_related("job"))
    assert Counter(attempt.job_id for attempt in attempts) == dict.fromkeys(ids, 1)
    for attempt in attempts:
        assert attempt.number == 1
        assert attempt.outcome == AttemptOutcome.SUCCEEDED
        assert attempt.finished_at is not None
        assert attempt.lateness == attempt.started_at - attempt.job.run_at
        assert attempt.lateness >= timedelta(0)
    assert redis_client.zcard(due_key(QUEUE)) == 0


def test_jobs_run_not_before_run_at_and_in_order_woken_without_polling(
    consumer_process: ConsumerFactory, redis_client: redis.Redis
) -> None:
    # No pre-loader and an idle timeout far beyond the test's deadline: only the wake-up
    # notification of schedule()'s Redis hand-off can bring the consumer to these jobs.
    consumer = consumer_process(
        "--no-preload", env={"DELAYJOBS_TEST_OVERRIDES": json.dumps({"IDLE_TIMEOUT": 3600})}
    )
    wait_listening(redis_client, [consumer])

    now = timezone.now()
    # Scheduled out of order: running them in run_at order is the consumer's doing.
    offsets = [1.8, 1.0, 1.6, 1.2, 1.4]
    jobs = [
        delayjobs.schedule(SCRIPTED, {"offset": s}, run_at=now + timedelta(seconds=s))
        for s in offsets
    ]
    wait_final([job.pk for job in jobs], [consumer])

    attempts = {attempt.job_id: attempt for attempt in JobAttempt.objects.filter(job__in=jobs)}
    executions = {execution.job_id: execution for execution in Execution.objects.all()}
    assert set(attempts) == set(executions) == {job.pk for job in jobs}
    for job in jobs:
        job.refresh_from_db()
        assert job.status == JobStatus.SUCCEEDED
        assert attempts[job.pk].started_at >= job.run_at, "started before it was due"
        assert executions[job.pk].started_at >= job.run_at, "started before it was due"
    by_run_at = [job.pk for job in sorted(jobs, key=lambda job: job.run_at)]
    by_start = sorted(attempts, key=lambda pk: attempts[pk].started_at)
    assert by_start == by_run_at


def test_a_job_due_in_the_past_runs_at_once(
    consumer_process: ConsumerFactory, redis_client: redis.Redis
) -> None:
    consumer = consumer_process()
    wait_listening(redis_client, [consumer])

    job = delayjobs.schedule(SCRIPTED, run_at=timezone.now() - timedelta(hours=1))
    wait_final([job.pk], [consumer])

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    (attempt,) = job.history.all()
    assert attempt.outcome == AttemptOutcome.SUCCEEDED
    assert attempt.lateness >= timedelta(hours=1)


# Many consumers, lost Redis, dead consumers ------------------------------------------------


def test_two_consumers_never_run_an_attempt_twice(
    consumer_process: ConsumerFactory, redis_client: redis.Redis
) -> None:
    consumers = [
        consumer_process("--concurrency", "8", "--worker-id", name)
        for name in ("consumer-a", "consumer-b")
    ]
    # Both idle and listening before the jobs come, so both are woken for them.
    wait_listening(redis_client, consumers)

    jobs = delayjobs.schedule_many([{"job_type": COUNTED} for _ in range(2000)])
    ids = [job.pk for job in jobs]
    wait_final(ids, consumers, timeout=120, interval=0.1)

    assert statuses(ids) == {JobStatus.SUCCEEDED: len(ids)}
    executions = list(Execution.objects.values_list("job_id", "attempt", "worker_id"))
    assert len(executions) == len(ids)
    runs = Counter((job_id, attempt) for job_id, attempt, _worker in executions)
    assert set(runs) == {(pk, 1) for pk in ids}
    assert max(runs.values()) == 1
    workers = Counter(worker for _job_id, _attempt, worker in executions)
    assert set(workers) == {"consumer-a", "consumer-b"}, workers
    # One attempt row per execution, on the worker that ran it.
    recorded = set(JobAttempt.objects.values_list("job_id", "number", "worker_id", "outcome"))
    assert recorded == {(j, a, w, AttemptOutcome.SUCCEEDED) for j, a, w in executions}


def test_redis_flushall_mid_run_loses_no_job(
    consumer_process: ConsumerFactory, redis_client: redis.Redis
) -> None:
    consumer = consumer_process("--concurrency", "8")
    wait_listening(redis_client, [consumer])

    start = timezone.now() + timedelta(milliseconds=500)
    count = 2000
    jobs = delayjobs.schedule_many(
        [
            {"job_type": COUNTED, "run_at": start + timedelta(seconds=4 * n / count)}
            for n in range(count)
        ]
    )
    ids = [job.pk for job in jobs]
    wait_for(lambda: Execution.objects.count() >= 50, message="the first jobs never ran")
    redis_client.flushall()
    left = DelayedJob.objects.filter(pk__in=ids, status=JobStatus.SCHEDULED).count()
    assert left > 0, "every job ran before the flush: the test proves nothing"

    # The pre-loader rebuilds the window from the database.
    wait_final(ids, [consumer], timeout=120, interval=0.1)
    assert statuses(ids) == {JobStatus.SUCCEEDED: count}
    assert executions_per_job() == dict.fromkeys(ids, 1)
    assert JobAttempt.objects.filter(job_id__in=ids).count() == count


def test_sigkill_mid_job_runs_it_again_after_its_lease(
    consumer_process: ConsumerFactory, tmp_path: Path, redis_client: redis.Redis
) -> None:
    never = tmp_path / "never-created"
    # Without a pre-loader, the dying consumer cannot take the pre-loader's lock with it
    # (it would expire by itself, but only after 30 s): recovering is the successor's job.
    first = consumer_process("--worker-id", "consumer-a", "--no-preload")
    job = delayjobs.schedule(SCRIPTED, {"hold_attempts": [1], "release_file": str(never)})
    wait_executed(job, [first])
    first.kill()

    job.refresh_from_db()
    assert (job.status, job.attempts, job.worker_id) == (JobStatus.RUNNING, 1, "consumer-a")

    second = consumer_process("--worker-id", "consumer-b")
    wait_final([job.pk], [second])

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert job.attempts == 2
    assert list(
        Execution.objects.filter(job_id=job.pk)
        .order_by("attempt")
        .values_list("attempt", "worker_id")
    ) == [(1, "consumer-a"), (2, "consumer-b")]
    assert history(job) == [
        (1, "consumer-a", AttemptOutcome.LEASE_EXPIRED),
        (2, "consumer-b", AttemptOutcome.SUCCEEDED),
    ]


# Signals -----------------------------------------------------------------------------------


def test_sigterm_finishes_the_running_job_claims_nothing_more_and_exits_0(
    consumer_process: ConsumerFactory, redis_client: redis.Redis, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    consumer = consumer_process("--worker-id", "graceful")
    held = delayjobs.schedule(SCRIPTED, {"hold_attempts": [1], "release_file": str(release)})
    wait_executed(held, [consumer])

    consumer.send_signal(signal.SIGTERM)
    wait_output(consumer, "SIGTERM: finishing 1 running job(s)")
    late = delayjobs.schedule(SCRIPTED)  # due now, handed to Redis, its wake-up published

    # While it finishes, the held job keeps its lease: nobody else may take it over.
    lease = DelayedJob.objects.get(pk=held.pk).lease_expires_at
    wait_for(
        lambda: DelayedJob.objects.get(pk=held.pk).lease_expires_at > lease,
        message=f"the lease of job {held.pk} is no longer renewed after SIGTERM:\n"
        f"{consumer.output()}",
    )

    release.touch()
    assert consumer.wait(timeout=30) == 0, consumer.output()

    held.refresh_from_db()
    assert (held.status, held.attempts) == (JobStatus.SUCCEEDED, 1)
    assert history(held) == [(1, "graceful", AttemptOutcome.SUCCEEDED)]
    late.refresh_from_db()
    assert (late.status, late.attempts) == (JobStatus.SCHEDULED, 0)
    assert not Execution.objects.filter(job_id=late.pk).exists()
    assert late.pk in {int(m) for m in redis_client.zrange(due_key(QUEUE), 0, -1)}

    burst = consumer_process("--burst")
    assert burst.wait(timeout=30) == 0, burst.output()
    late.refresh_from_db()
    assert (late.status, late.attempts) == (JobStatus.SUCCEEDED, 1)
    assert Execution.objects.filter(job_id=late.pk).count() == 1


def test_a_second_sigterm_exits_at_once_and_the_job_returns_after_its_lease(
    consumer_process: ConsumerFactory, tmp_path: Path
) -> None:
    never = tmp_path / "never-created"
    consumer = consumer_process("--worker-id", "impatient", "--no-preload")  # see above
    held = delayjobs.schedule(SCRIPTED, {"hold_attempts": [1], "release_file": str(never)})
    wait_executed(held, [consumer])

    consumer.send_signal(signal.SIGTERM)
    wait_output(consumer, "SIGTERM: finishing")
    consumer.send_signal(signal.SIGTERM)
    assert consumer.wait(timeout=30) != 0
    assert "SIGTERM again: exiting now" in consumer.output()
    held.refresh_from_db()
    assert (held.status, held.attempts) == (JobStatus.RUNNING, 1)

    successor = consumer_process("--worker-id", "successor")
    wait_final([held.pk], [successor])
    held.refresh_from_db()
    assert (held.status, held.attempts) == (JobStatus.SUCCEEDED, 2)
    assert history(held) == [
        (1, "impatient", AttemptOutcome.LEASE_EXPIRED),
        (2, "successor", AttemptOutcome.SUCCEEDED),
    ]


# Retries -----------------------------------------------------------------------------------


def test_retries_then_success(consumer_process: ConsumerFactory) -> None:
    consumer = consumer_process("--worker-id", "retrier")
    job = delayjobs.schedule(SCRIPTED, {"fail_attempts": [1, 2]})
    wait_final([job.pk], [consumer])

    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.SUCCEEDED, 3)
    assert history(job) == [
        (1, "retrier", AttemptOutcome.RETRYING),
        (2, "retrier", AttemptOutcome.RETRYING),
        (3, "retrier", AttemptOutcome.SUCCEEDED),
    ]
    for attempt in job.history.filter(number__lt=3):
        assert "ScriptedFailure" in attempt.error
        assert "ScriptedFailure" in attempt.traceback
    assert list(
        Execution.objects.filter(job_id=job.pk)
        .order_by("attempt")
        .values_list("attempt", flat=True)
    ) == [1, 2, 3]


def test_retries_then_failure_keeps_the_error_and_traceback(
    consumer_process: ConsumerFactory, redis_client: redis.Redis
) -> None:
    consumer = consumer_process("--worker-id", "retrier")
    job = delayjobs.schedule(SCRIPTED, {"fail_attempts": [1, 2, 3]})
    wait_final([job.pk], [consumer])

    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.FAILED, 3)
    assert "ScriptedFailure" in job.last_error
    assert job.finished_at is not None
    assert history(job) == [
        (1, "retrier", AttemptOutcome.RETRYING),
        (2, "retrier", AttemptOutcome.RETRYING),
        (3, "retrier", AttemptOutcome.FAILED),
    ]
    last = job.history.get(number=3)
    assert "ScriptedFailure" in last.error
    assert "Traceback" in last.traceback
    assert "ScriptedFailure: scripted failure of job" in last.traceback
    assert Execution.objects.filter(job_id=job.pk).count() == 3
    assert redis_client.zcard(due_key(QUEUE)) == 0


# Cancel and reschedule ---------------------------------------------------------------------


def test_a_job_cancelled_before_it_is_due_never_runs(
    consumer_process: ConsumerFactory, redis_client: redis.Redis
) -> None:
    consumer = consumer_process()
    wait_listening(redis_client, [consumer])

    now = timezone.now()
    cancelled = delayjobs.schedule(SCRIPTED, run_at=now + timedelta(seconds=1))
    later = delayjobs.schedule(SCRIPTED, run_at=now + timedelta(seconds=1.5))
    assert delayjobs.cancel(cancelled) == 1
    # The later job running shows the consumer was there when the cancelled one was due.
    wait_final([later.pk], [consumer])

    later.refresh_from_db()
    assert later.status == JobStatus.SUCCEEDED
    cancelled.refresh_from_db()
    assert (cancelled.status, cancelled.attempts) == (JobStatus.CANCELLED, 0)
    assert not Execution.objects.filter(job_id=cancelled.pk).exists()
    assert not cancelled.history.exists()


def test_a_job_moved_later_runs_at_its_new_time(
    consumer_process: ConsumerFactory, redis_client: redis.Redis
) -> None:
    consumer = consumer_process()
    wait_listening(redis_client, [consumer])

    now = timezone.now()
    old_run_at = now + timedelta(seconds=1)
    new_run_at = now + timedelta(seconds=2.5)
    job = delayjobs.schedule(SCRIPTED, run_at=old_run_at)
    # A witness due at the old time: the consumer was awake then.
    witness = delayjobs.schedule(SCRIPTED, run_at=old_run_at)
    moved = delayjobs.reschedule(job, run_at=new_run_at)
    assert moved.pk == job.pk
    wait_final([job.pk, witness.pk], [consumer])

    job.refresh_from_db()
    assert (job.status, job.attempts, job.run_at) == (JobStatus.SUCCEEDED, 1, new_run_at)
    (attempt,) = job.history.all()
    assert attempt.started_at >= new_run_at, "ran at its old time"
    assert Execution.objects.get(job_id=job.pk).started_at >= new_run_at
    assert witness.history.get().started_at < attempt.started_at


# Command-line refusals ---------------------------------------------------------------------


def test_cli_refuses_zero_concurrency() -> None:
    with pytest.raises(CommandError, match=r"--concurrency: must be at least 1, got 0"):
        call_command("run_delay_consumer", "--concurrency", "0")


def test_cli_refuses_a_bad_queue_name() -> None:
    with pytest.raises(CommandError, match=r"--queue 'bad queue!'"):
        call_command("run_delay_consumer", "--queue", "bad queue!")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "argument --concurrency: must be at least 1, got 0"),
        (["--queue", "bad queue!"], "--queue 'bad queue!': use 1-100 characters of letters"),
    ],
)
def test_cli_refusals_exit_nonzero_with_the_reason(
    consumer_process: ConsumerFactory, args: list[str], message: str
) -> None:
    consumer = consumer_process(*args)
    assert consumer.wait(timeout=30) != 0
    assert message in consumer.output()


# Claiming ahead ------------------------------------------------------------------------

AHEAD = json.dumps({"CLAIM_AHEAD": 5})  # every job below is claimed well before it is due


def test_a_job_claimed_ahead_starts_at_its_run_at_not_before(
    consumer_process: ConsumerFactory, redis_client: redis.Redis
) -> None:
    consumer = consumer_process("--no-preload", env={"DELAYJOBS_TEST_OVERRIDES": AHEAD})
    wait_listening(redis_client, [consumer])

    jobs = [
        delayjobs.schedule(SCRIPTED, run_at=timezone.now() + timedelta(seconds=s))
        for s in (1.0, 0.5, 1.5)
    ]
    wait_final([job.pk for job in jobs], [consumer])

    executions = {execution.job_id: execution for execution in Execution.objects.all()}
    for job in jobs:
        job.refresh_from_db()
        assert job.status == JobStatus.SUCCEEDED
        assert job.claimed_at < job.run_at, "the claim was not early"
        assert executions[job.pk].started_at >= job.run_at, "started before it was due"
        (attempt,) = job.history.all()
        assert attempt.started_at >= job.run_at
        assert attempt.lateness >= timedelta(0)
        # The row keeps both times: the claim, and the execution start lateness is from.
        assert job.claimed_at < job.started_at == attempt.started_at
        assert job.started_at - job.run_at == attempt.lateness


def test_cancel_after_an_early_claim_says_running_and_the_job_runs(
    consumer_process: ConsumerFactory, redis_client: redis.Redis
) -> None:
    # The documented choice: once claimed (early or not), a job is running; cancel()
    # returns 0 and changes nothing, so a cancel that reports success never loses a race.
    consumer = consumer_process("--no-preload", env={"DELAYJOBS_TEST_OVERRIDES": AHEAD})
    wait_listening(redis_client, [consumer])

    job = delayjobs.schedule(SCRIPTED, run_at=timezone.now() + timedelta(seconds=2))
    wait_for(
        lambda: DelayedJob.objects.filter(pk=job.pk, status=JobStatus.RUNNING).exists(),
        message="the job was not claimed ahead of its run_at",
    )
    assert not Execution.objects.filter(job_id=job.pk).exists()
    assert delayjobs.cancel(job) == 0
    wait_final([job.pk], [consumer])

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    (execution,) = Execution.objects.filter(job_id=job.pk)
    assert execution.started_at >= job.run_at


def test_a_job_cancelled_before_its_claim_never_runs(
    consumer_process: ConsumerFactory, redis_client: redis.Redis
) -> None:
    consumer = consumer_process("--no-preload", env={"DELAYJOBS_TEST_OVERRIDES": AHEAD})
    wait_listening(redis_client, [consumer])

    with transaction.atomic():  # committed together: no consumer sees the first alone
        cancelled = delayjobs.schedule(SCRIPTED, run_at=timezone.now() + timedelta(seconds=1))
        assert delayjobs.cancel(cancelled) == 1
        witness = delayjobs.schedule(SCRIPTED, run_at=timezone.now() + timedelta(seconds=1))
    wait_final([witness.pk], [consumer])

    cancelled.refresh_from_db()
    assert cancelled.status == JobStatus.CANCELLED
    assert not Execution.objects.filter(job_id=cancelled.pk).exists()


def test_a_consumer_claims_ahead_only_for_idle_threads_and_short_jobs() -> None:
    from delayjobs.engine.consumer import Consumer
    from delayjobs.engine.inflight import PREFETCH, PREFETCH_BUDGET

    consumer = Consumer(queues=[QUEUE], concurrency=2)
    inflight = consumer.inflight
    try:
        # Nothing known about how long jobs take: one per idle thread.
        assert inflight.claimable() == 2
        inflight.finish(unstarted(), 0.0001)  # no-op jobs: PREFETCH per idle thread
        assert inflight.claimable() == 2 * PREFETCH
        claimed = inflight.add([unstarted(pk).job for pk in range(1, 6)])
        inflight.begin(claimed[0])  # one thread runs a job; four wait for a thread
        assert inflight.claimable() == PREFETCH - 4
        inflight.begin(claimed[1])  # every thread busy: nothing more is claimed
        assert inflight.claimable() == 0

        # Slow jobs: a second each. The average follows and no job is claimed to wait
        # behind another in a thread (it could run on another consumer meanwhile).
        slow = Consumer(queues=[QUEUE], concurrency=2)
        try:
            slow.inflight.finish(unstarted(), 0.0001)
            for _ in range(200):
                slow.inflight.finish(unstarted(), 1.0)
            assert slow.inflight.prefetch() == 1
            assert slow.inflight.claimable() == 2
        finally:
            slow.executor_impl.stop()
        # An average of a third of the budget (its first execution): three per thread.
        third = Consumer(queues=[QUEUE], concurrency=2)
        try:
            third.inflight.finish(unstarted(), PREFETCH_BUDGET / 3)
            assert third.inflight.prefetch() == 3
        finally:
            third.executor_impl.stop()
    finally:
        consumer.executor_impl.stop()


def test_a_limited_type_is_prefetched_by_its_own_average() -> None:
    from delayjobs.engine.inflight import PREFETCH, InFlight
    from delayjobs.engine.slots import Slots

    def limited_job() -> Running:
        return Running(DelayedJob(queue=QUEUE, job_type="tests.limited", run_at=timezone.now()))

    inflight = InFlight(
        concurrency=2, slots=Slots(2 * PREFETCH), longest_sleep=1.0, limited_types=["tests.limited"]
    )
    for _ in range(3):
        inflight.finish(unstarted(), 0.0001)  # short jobs of another type
    assert inflight.claimable() == 2 * PREFETCH
    # Nothing known of the limited type yet: one per idle thread.
    assert inflight.limited_room("tests.limited") == 2
    inflight.finish(limited_job(), 0.0001)
    assert inflight.limited_room("tests.limited") == 2 * PREFETCH
    # Slow limited jobs among fast ones: claimed for idle threads only, while the fast
    # ones are prefetched as ever.
    for _ in range(200):
        inflight.finish(limited_job(), 1.0)
    for _ in range(400):
        inflight.finish(unstarted(), 0.0001)
    assert inflight.limited_room("tests.limited") == 2
    assert inflight.claimable() == 2 * PREFETCH


def unstarted(pk: int = 0) -> Running:
    """An execution of an unsaved job, as a claim registers it (nothing runs)."""
    return Running(DelayedJob(pk=pk, queue=QUEUE, job_type=SCRIPTED, run_at=timezone.now()))
