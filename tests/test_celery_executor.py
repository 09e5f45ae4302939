"""The Celery executor end to end: a real Celery worker (the sample project's Celery app,
threads pool) on the tests' real Redis as broker, and a real ``run_delay_consumer
--executor celery`` that claims jobs and publishes one task per job.

What must hold is what holds for the local pool: every job runs once per attempt, the
retry policy applies, attempt rows and job rows are written the same way, and a task that
arrives after its claim is gone does nothing.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

import delayjobs
from delayjobs import transitions
from delayjobs.celery_executor import run_dispatched
from delayjobs.checks import check_settings
from delayjobs.consumer import Consumer
from delayjobs.jobtypes import registry
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from delayjobs.redis_store import due_key
from tests.conftest import ConsumerFactory, ConsumerProcess, subprocess_env
from tests.consumers import wait_final, wait_output
from tests.models import Execution
from tests.utils import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPTED = "tests.scripted"
CELERY_WORKER = ("-m", "celery", "-A", "sampleproject", "worker")


@pytest.fixture
def celery_worker_process(tmp_path: Path) -> Iterator[Callable[[], ConsumerProcess]]:
    """Factory: a real Celery worker subprocess, waited for until it is ready."""
    started: list[ConsumerProcess] = []

    def start() -> ConsumerProcess:
        worker = ConsumerProcess(
            # No gossip, mingle or heartbeats: one worker, nothing to meet.
            [
                "--pool=threads",
                "--concurrency=4",
                "--loglevel=INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                f"--hostname=celery-test-{len(started)}@localhost",
            ],
            tmp_path / f"celery-{len(started)}.log",
            subprocess_env(),
            command=CELERY_WORKER,
        )
        started.append(worker)
        wait_output(worker, "ready.")
        return worker

    yield start
    for worker in started:
        if worker.returncode is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=15)
            except AssertionError:
                worker.kill()


@pytest.mark.subprocess
def test_jobs_run_in_celery_workers_and_are_recorded_like_the_local_pool(
    consumer_process: ConsumerFactory,
    celery_worker_process: Callable[[], ConsumerProcess],
    redis_client: redis.Redis,
) -> None:
    worker = celery_worker_process()
    consumer = consumer_process("--executor", "celery", "--concurrency", "4")
    due = timezone.now() + timedelta(milliseconds=300)
    plain = delayjobs.schedule_many(
        [{"job_type": SCRIPTED, "payload": {"n": n}, "run_at": due} for n in range(40)]
    )
    flaky = delayjobs.schedule(SCRIPTED, {"fail_attempts": [1]}, run_at=due)
    doomed = delayjobs.schedule(SCRIPTED, {"fail_attempts": [1, 2, 3]}, run_at=due)
    returns = delayjobs.schedule("tests.conditional", {"returns": {"ok": True}}, run_at=due)
    skipped = delayjobs.schedule("tests.conditional", {"run": False}, run_at=due)
    ids = [job.pk for job in plain] + [flaky.pk, doomed.pk, returns.pk, skipped.pk]

    wait_final(ids, [consumer, worker])

    statuses = dict(DelayedJob.objects.filter(pk__in=ids).values_list("pk", "status"))
    assert {statuses[job.pk] for job in plain} == {JobStatus.SUCCEEDED}
    assert statuses[flaky.pk] == JobStatus.SUCCEEDED
    assert statuses[doomed.pk] == JobStatus.FAILED
    assert statuses[skipped.pk] == JobStatus.SKIPPED
    assert DelayedJob.objects.get(pk=returns.pk).result == {"ok": True}
    # Once per attempt, never before run_at, and in the Celery worker, not the consumer.
    executions = Counter(Execution.objects.values_list("job_id", flat=True))
    assert executions == {**{job.pk: 1 for job in plain}, flaky.pk: 2, doomed.pk: 3, returns.pk: 1}
    for execution in Execution.objects.all():
        assert execution.worker_id.startswith("celery-test-0@localhost:"), execution.worker_id
    attempts = JobAttempt.objects.filter(job_id__in=ids)
    assert all(a.worker_id.startswith("celery-test-0@localhost:") for a in attempts)
    assert all(a.lateness >= timedelta(0) for a in attempts)
    assert list(
        attempts.filter(job_id=flaky.pk).order_by("number").values_list("number", "outcome")
    ) == [(1, AttemptOutcome.RETRYING), (2, AttemptOutcome.SUCCEEDED)]
    assert list(
        attempts.filter(job_id=doomed.pk).order_by("number").values_list("outcome", flat=True)
    ) == [AttemptOutcome.RETRYING, AttemptOutcome.RETRYING, AttemptOutcome.FAILED]
    assert "ScriptedFailure" in DelayedJob.objects.get(pk=doomed.pk).last_error
    assert attempts.filter(job_id=skipped.pk).get().outcome == AttemptOutcome.SKIPPED
    assert redis_client.zcard(due_key("default")) == 0

    consumer.send_signal(signal.SIGTERM)
    assert consumer.wait() == 0, consumer.output()


@pytest.mark.subprocess
def test_the_preloader_runs_as_a_celery_task(
    celery_worker_process: Callable[[], ConsumerProcess], redis_client: redis.Redis
) -> None:
    from sampleproject.celery import app

    celery_worker_process()
    job = delayjobs.schedule(SCRIPTED, delay=timedelta(seconds=3))
    redis_client.flushdb()  # the index is lost; only a pre-loader pass can bring it back

    app.send_task("delayjobs.tasks.preload")

    wait_for(lambda: redis_client.zscore(due_key("default"), str(job.pk)) is not None)


def hold_payload(release: Path, *attempts: int) -> dict[str, object]:
    return {"hold_attempts": list(attempts), "release_file": str(release)}


def lease_of(job: DelayedJob) -> object:
    return DelayedJob.objects.filter(pk=job.pk).values_list("lease_expires_at", flat=True)[0]


@dataclass
class HeldJob:
    """A Celery worker, a consumer publishing to it, and a job held until ``release``."""

    worker: ConsumerProcess
    consumer: ConsumerProcess
    job: DelayedJob
    release: Path


@pytest.fixture
def held_job(
    consumer_process: ConsumerFactory,
    celery_worker_process: Callable[[], ConsumerProcess],
    tmp_path: Path,
) -> HeldJob:
    # tests.scripted has a time_to_run (and lease) of 2 s; attempt 1 is held.
    worker = celery_worker_process()
    consumer = consumer_process("--executor", "celery")
    release = tmp_path / "release"
    job = delayjobs.schedule(SCRIPTED, hold_payload(release, 1))
    return HeldJob(worker, consumer, job, release)


@pytest.mark.subprocess
def test_a_celery_worker_renews_the_lease_of_a_long_job(held_job: HeldJob) -> None:
    job = held_job.job
    wait_for(lambda: Execution.objects.filter(job_id=job.pk).exists())
    first_lease = lease_of(job)
    wait_for(lambda: lease_of(job) != first_lease, message="the lease was never renewed")
    held_job.release.touch()

    wait_final([job.pk], [held_job.consumer, held_job.worker])
    assert list(JobAttempt.objects.filter(job=job).values_list("number", "outcome")) == [
        (1, AttemptOutcome.SUCCEEDED)
    ]
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED


@pytest.mark.subprocess
def test_a_hung_celery_job_is_reaped_and_its_late_return_ignored(held_job: HeldJob) -> None:
    job, worker, consumer, release = (
        held_job.job,
        held_job.worker,
        held_job.consumer,
        held_job.release,
    )
    # The worker stops renewing at time_to_run; the pre-loader's reaper takes it back and
    # attempt 2 (not held) runs while attempt 1 still hangs.
    wait_for(lambda: Execution.objects.filter(job_id=job.pk, attempt=2).exists(), timeout=30)
    wait_final([job.pk], [consumer, worker])
    release.touch()
    wait_output(worker, "returned after its lease had expired")

    assert list(
        JobAttempt.objects.filter(job=job).order_by("number").values_list("number", "outcome")
    ) == [(1, AttemptOutcome.LEASE_EXPIRED), (2, AttemptOutcome.SUCCEEDED)]
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED


@pytest.mark.subprocess
def test_jobs_wait_in_delayjobs_not_in_the_broker_and_cost_no_attempt(
    consumer_process: ConsumerFactory,
    celery_worker_process: Callable[[], ConsumerProcess],
) -> None:
    # No Celery worker yet: the consumer publishes only as many jobs as it has slots, and
    # renews their leases while they wait in the broker.
    consumer = consumer_process("--executor", "celery", "--concurrency", "2")
    jobs = delayjobs.schedule_many([{"job_type": SCRIPTED} for _ in range(10)])
    ids = [job.pk for job in jobs]
    running = DelayedJob.objects.filter(pk__in=ids, status=JobStatus.RUNNING)
    wait_for(lambda: running.count() == 2)
    published = list(running)
    wait_for(
        lambda: all(lease_of(job) != job.lease_expires_at for job in published),
        message="the consumer did not renew the leases of the jobs it published",
    )
    assert running.count() == 2
    assert DelayedJob.objects.filter(pk__in=ids, status=JobStatus.SCHEDULED).count() == 8

    worker = celery_worker_process()
    wait_final(ids, [consumer, worker])
    assert set(DelayedJob.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        JobStatus.SUCCEEDED
    }
    assert list(JobAttempt.objects.filter(job_id__in=ids).values_list("outcome", flat=True)) == [
        AttemptOutcome.SUCCEEDED
    ] * len(ids)


@pytest.mark.subprocess
def test_a_job_whose_task_cannot_be_published_fails_its_attempt(
    consumer_process: ConsumerFactory,
) -> None:
    # A broker nobody listens on: port 9 (discard) on the loopback, refused at once.
    consumer = consumer_process(
        "--executor",
        "celery",
        env={"DELAYJOBS_TEST_CELERY_BROKER": "redis://127.0.0.1:9/1"},
    )
    job = delayjobs.schedule(SCRIPTED, {"n": 1})

    wait_final([job.pk], [consumer], timeout=90)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED  # max_attempts = 3, each one refused
    attempts = list(JobAttempt.objects.filter(job=job).order_by("number"))
    assert [a.outcome for a in attempts] == [
        AttemptOutcome.RETRYING,
        AttemptOutcome.RETRYING,
        AttemptOutcome.FAILED,
    ]
    assert all("Publishing the Celery task failed" in a.traceback for a in attempts)
    assert not Execution.objects.exists()


def claimed(job: DelayedJob, worker_id: str = "consumer-a") -> DelayedJob:
    (row,) = transitions.claim(
        [job.pk],
        worker_id=worker_id,
        now=timezone.now(),
        job_types=registry.names(),
        leases={},
        default_lease=timedelta(minutes=1),
    )
    return row


def test_a_task_for_a_claim_that_is_gone_does_nothing() -> None:
    job = claimed(delayjobs.schedule(SCRIPTED))
    assert job.claimed_at is not None
    claimed_at = job.claimed_at.isoformat()

    # Another claimant, another attempt, another claim time: none of them is this claim.
    assert run_dispatched(job.pk, job.attempts, "someone-else", claimed_at, "w") == "stale"
    assert run_dispatched(job.pk, job.attempts + 1, "consumer-a", claimed_at, "w") == "stale"
    earlier = (job.claimed_at - timedelta(microseconds=1)).isoformat()
    assert run_dispatched(job.pk, job.attempts, "consumer-a", earlier, "w") == "stale"
    assert not Execution.objects.exists()
    assert DelayedJob.objects.get(pk=job.pk).worker_id == "consumer-a"

    # The claim itself: taken over, run once, recorded under the new worker.
    assert run_dispatched(job.pk, job.attempts, "consumer-a", claimed_at, "w") == "succeeded"
    assert run_dispatched(job.pk, job.attempts, "consumer-a", claimed_at, "w") == "stale"
    row = DelayedJob.objects.get(pk=job.pk)
    assert (row.status, row.worker_id) == (JobStatus.SUCCEEDED, "w")
    assert list(Execution.objects.values_list("job_id", "worker_id")) == [(job.pk, "w")]
    assert JobAttempt.objects.get(job=job).worker_id == "w"


def test_a_task_for_a_deleted_job_does_nothing() -> None:
    job = claimed(delayjobs.schedule(SCRIPTED))
    assert job.claimed_at is not None
    DelayedJob.objects.filter(pk=job.pk).delete()
    assert run_dispatched(job.pk, 1, "consumer-a", job.claimed_at.isoformat(), "w") == "gone"


def test_the_executor_is_checked_on_the_command_line_and_in_settings() -> None:
    with pytest.raises(CommandError, match=r"--executor: use one of local, celery, got 'thread'"):
        call_command("run_delay_consumer", executor="thread")
    with override_settings(DELAYJOBS={"EXECUTOR": "threads"}):
        (error,) = [m for m in check_settings() if m.id == "delayjobs.E013"]
        assert "must be one of 'local', 'celery', got 'threads'" in error.msg
        # A consumer built without the checks falls back to the default, like any setting.
        assert Consumer(burst=True).executor == "local"
    with pytest.raises(ValueError, match="executor must be one of"):
        Consumer(burst=True, executor="thread")
