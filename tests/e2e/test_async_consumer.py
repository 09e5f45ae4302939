"""Async job types in a real ``run_delay_consumer`` process: many at once on one event loop
with few threads, side by side with sync jobs, and a SIGTERM that waits for them."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import redis

import delayjobs
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from tests.conftest import ConsumerFactory
from tests.consumers import statuses, wait_executed, wait_final, wait_output
from tests.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True)]

ASYNC = "tests.async_scripted"
ASYNC_HELD = "tests.async_held"
SYNC = "tests.scripted"


def threads_of(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="counts threads in /proc")
def test_async_jobs_run_on_one_loop_beside_sync_ones_without_a_thread_each(
    consumer_process: ConsumerFactory, redis_client: redis.Redis, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    # Held until the file exists, however long a loaded machine takes to start them all (the
    # default bound of 60 s would let the first ones end on their own before the check), of
    # a type whose time to run outlasts that too (tests.async_scripted's 2 s would time the
    # first ones out and retry them).
    hold = {"hold_attempts": [1], "release_file": str(release), "hold_seconds": 900}
    held = [delayjobs.schedule(ASYNC_HELD, hold) for _ in range(100)]
    consumer = consumer_process("--concurrency", "500", "--worker-id", "loop")
    for job in held:
        wait_executed(job, [consumer])

    # A hundred jobs running at once, each waiting: on the event loop, not in a thread
    # each (worker threads start only as sync work needs them).
    assert threads_of(consumer.pid) < 40
    sync = [delayjobs.schedule(SYNC) for _ in range(5)]
    wait_final([job.pk for job in sync], [consumer])
    assert statuses(job.pk for job in held) == {JobStatus.RUNNING: 100}

    release.touch()
    wait_final([job.pk for job in held], [consumer])
    consumer.send_signal(signal.SIGTERM)
    assert consumer.wait(timeout=30) == 0, consumer.output()

    assert statuses(job.pk for job in held + sync) == {JobStatus.SUCCEEDED: 105}
    results = set(
        DelayedJob.objects.filter(pk__in=[job.pk for job in held]).values_list("result", flat=True)
    )
    assert results == {"delayjobs-event-loop"}
    assert Execution.objects.count() == 105


def test_sigterm_waits_for_a_running_async_job_and_records_it(
    consumer_process: ConsumerFactory, redis_client: redis.Redis, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    consumer = consumer_process("--worker-id", "graceful-async")
    held = delayjobs.schedule(ASYNC, {"hold_attempts": [1], "release_file": str(release)})
    wait_executed(held, [consumer])

    consumer.send_signal(signal.SIGTERM)
    wait_output(consumer, "SIGTERM: finishing 1 running job(s)")
    release.touch()
    assert consumer.wait(timeout=30) == 0, consumer.output()

    held.refresh_from_db()
    assert (held.status, held.attempts) == (JobStatus.SUCCEEDED, 1)
    assert list(JobAttempt.objects.filter(job=held).values_list("worker_id", "outcome")) == [
        ("graceful-async", AttemptOutcome.SUCCEEDED)
    ]


def test_async_retries_in_a_consumer_process_follow_the_policy(
    consumer_process: ConsumerFactory, redis_client: redis.Redis
) -> None:
    job = delayjobs.schedule(ASYNC, {"fail_attempts": [1, 2]})
    consumer = consumer_process("--concurrency", "4")
    wait_final([job.pk], [consumer])
    consumer.send_signal(signal.SIGTERM)
    assert consumer.wait(timeout=30) == 0, consumer.output()

    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.SUCCEEDED, 3)
    assert list(
        JobAttempt.objects.filter(job=job).order_by("number").values_list("outcome", flat=True)
    ) == [AttemptOutcome.RETRYING, AttemptOutcome.RETRYING, AttemptOutcome.SUCCEEDED]
