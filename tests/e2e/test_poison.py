"""Poison jobs and concurrency limits, end to end with real consumer subprocesses.

A job that raises, hangs past its time_to_run or raises a BaseException is retried with
backoff, then marked failed with its traceback, and the consumer survives all of them. A
flood of one job type or queue cannot take every slot.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from django.utils import timezone

import delayjobs
from delayjobs.engine.timeouts import EXIT_STUCK
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from tests.conftest import ConsumerFactory, ConsumerProcess
from tests.consumers import check_alive, history, statuses, wait_final, wait_output
from tests.models import Execution
from tests.utils import wait_for

pytestmark = [pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def release_file(tmp_path: Path) -> Iterator[Path]:
    """A file whose creation lets held ``tests.scripted`` jobs return; created at teardown."""
    path = tmp_path / "release"
    yield path
    path.touch()


def held(
    release: Path,
    *,
    attempts: tuple[int, ...] = (1,),
    job_type: str = "tests.scripted",
    **options: Any,
) -> DelayedJob:
    """A job that holds on ``attempts`` until ``release`` exists (or 60 s).

    ``tests.scripted`` times out after 2 s; ``tests.limited`` and ``tests.slow_queue``
    after 60 s.
    """
    payload = {"hold_attempts": list(attempts), "release_file": str(release)}
    return delayjobs.schedule(job_type, payload, **options)


def running_executions(job_type: str) -> int:
    """Jobs of ``job_type`` started and not finished: held ones, in these tests."""
    ids = DelayedJob.objects.filter(job_type=job_type).values_list("pk", flat=True)
    return DelayedJob.objects.filter(pk__in=ids, status=JobStatus.RUNNING).count()


# Time-outs ------------------------------------------------------------------------------


def test_a_job_hung_past_time_to_run_is_timed_out_with_its_stack_then_retried(
    consumer_process: ConsumerFactory, release_file: Path
) -> None:
    # tests.scripted has a time_to_run of 2 s; attempt 1 holds far longer (60 s).
    consumer = consumer_process("--concurrency", "2")
    job = held(release_file)

    wait_final([job.pk], [consumer])

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert [outcome for _n, _w, outcome in history(job)] == [
        AttemptOutcome.TIMED_OUT,
        AttemptOutcome.SUCCEEDED,
    ]
    timed_out = job.history.get(number=1)
    assert timed_out.error.startswith("JobTimeout: attempt 1 ran past the time_to_run")
    # The stack shows where the job was stuck: in the hold loop of tests.scripted.
    assert "Where the job was when it timed out" in timed_out.traceback
    assert "delay_jobs.py" in timed_out.traceback
    assert "in execute" in timed_out.traceback
    assert "timed out after 0:00:02" in consumer.output()

    # The stuck thread returns once released; what it returns is ignored.
    release_file.touch()
    wait_output(consumer, "returned after it had timed out")
    check_alive([consumer])
    assert job.history.count() == 2


def test_a_hung_job_keeps_only_its_own_slot(
    consumer_process: ConsumerFactory, release_file: Path
) -> None:
    consumer = consumer_process("--concurrency", "2")
    stuck = held(release_file)
    wait_for(lambda: Execution.objects.filter(job_id=stuck.pk).exists())

    # One slot is held by the stuck job, even once it timed out: the other runs these.
    others = delayjobs.schedule_many(
        [{"job_type": "tests.scripted", "payload": {"n": n}} for n in range(30)]
    )
    wait_final([job.pk for job in others], [consumer])
    assert statuses(job.pk for job in others) == {JobStatus.SUCCEEDED: 30}
    check_alive([consumer])


def test_a_job_hung_on_every_attempt_ends_failed_as_timed_out(
    consumer_process: ConsumerFactory, release_file: Path
) -> None:
    # Three stuck attempts need three threads; with four the consumer carries on.
    consumer = consumer_process("--concurrency", "4")
    job = held(release_file, attempts=(1, 2, 3))

    wait_final([job.pk], [consumer], timeout=90)

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert [outcome for _n, _w, outcome in history(job)] == [AttemptOutcome.TIMED_OUT] * 3
    assert job.last_error.startswith("JobTimeout: attempt 3")
    assert "no retries left, marked failed" in consumer.output()
    check_alive([consumer])


def test_a_consumer_whose_threads_are_all_stuck_exits_for_a_fresh_one(
    consumer_process: ConsumerFactory, release_file: Path
) -> None:
    consumer = consumer_process("--concurrency", "1")
    job = held(release_file, attempts=(1, 2, 3))

    assert consumer.wait(timeout=60) == EXIT_STUCK, consumer.output()
    assert "timed-out jobs fill all 1 worker thread(s)" in consumer.output()
    # The timed-out attempt was recorded before the exit, and the job is due again.
    job.refresh_from_db()
    assert job.status == JobStatus.SCHEDULED
    assert history(job)[0][2] == AttemptOutcome.TIMED_OUT

    # A fresh consumer carries on with the retry.
    release_file.touch()
    successor = consumer_process()
    wait_final([job.pk], [successor], timeout=60)
    job.refresh_from_db()
    assert job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED)


def test_jobs_claimed_behind_a_long_one_are_not_timed_out_while_they_wait_for_a_thread(
    consumer_process: ConsumerFactory, release_file: Path
) -> None:
    # One thread. Quick jobs first, so that the consumer claims many jobs per idle thread:
    # how many follows the running average of execution times, which must forget the
    # first executions (a connection to open) and a busy machine's outliers, hence 100.
    consumer = consumer_process("--concurrency", "1")
    warm_up = delayjobs.schedule_many([{"job_type": "tests.noop"} for _ in range(100)])
    wait_final([job.pk for job in warm_up], [consumer])

    # Claimed together: the long job (time_to_run 60 s) takes the thread, the quick ones
    # (tests.scripted: time_to_run 2 s) wait behind it, their claim older than 2 s.
    run_at = timezone.now() + timedelta(seconds=1)
    payload = {"hold_attempts": [1], "release_file": str(release_file)}
    long_one, *waiting = delayjobs.schedule_many(
        [{"job_type": "tests.slow_queue", "payload": payload, "run_at": run_at, "priority": 10}]
        + [{"job_type": "tests.scripted", "run_at": run_at} for _ in range(5)]
    )
    wait_for(lambda: Execution.objects.filter(job_id=long_one.pk).exists())
    claimed = DelayedJob.objects.filter(pk__in=[job.pk for job in waiting], attempts=1)
    wait_for(lambda: claimed.filter(status=JobStatus.RUNNING).count() == 5)
    claimed_at = claimed.first().claimed_at

    # Their leases renewed 4 s past the claim: they outlived 2 s of waiting, untimed.
    def renewed() -> bool:
        leases = claimed.filter(status=JobStatus.RUNNING).values_list("lease_expires_at", flat=True)
        leases = list(leases)
        return len(leases) == 5 and min(leases) > claimed_at + timedelta(seconds=4)

    wait_for(renewed, message="the waiting jobs were not kept while the long one ran")
    release_file.touch()

    wait_final([long_one.pk, *[job.pk for job in waiting]], [consumer])
    for job in [long_one, *waiting]:
        assert [outcome for _n, _w, outcome in history(job)] == [AttemptOutcome.SUCCEEDED]
    check_alive([consumer])


# Exceptions that would end a careless consumer -----------------------------------------


@pytest.mark.parametrize("raised", ["SystemExit", "KeyboardInterrupt", "GeneratorExit"])
def test_base_exceptions_in_a_job_are_retried_then_failed_and_the_consumer_survives(
    consumer_process: ConsumerFactory, raised: str
) -> None:
    consumer = consumer_process()
    job = delayjobs.schedule("tests.raises", {"raise": raised})

    wait_final([job.pk], [consumer])

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert [outcome for _n, _w, outcome in history(job)] == [
        AttemptOutcome.RETRYING,
        AttemptOutcome.FAILED,
    ]
    assert job.last_error.startswith(raised)
    assert f"{raised}" in job.history.get(number=2).traceback
    # Still alive and still working.
    after = delayjobs.schedule("tests.scripted")
    wait_final([after.pk], [consumer])
    check_alive([consumer])


def test_an_exception_whose_str_fails_is_recorded_without_breaking_the_consumer(
    consumer_process: ConsumerFactory,
) -> None:
    consumer = consumer_process()
    job = delayjobs.schedule("tests.raises", {"raise": "StrFails"})

    wait_final([job.pk], [consumer])

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.last_error == "StrFails: <the exception's str() failed>"
    check_alive([consumer])


# Concurrency limits ----------------------------------------------------------------------


def wait_running(job_type: str, count: int, consumers: list[ConsumerProcess]) -> None:
    def reached() -> bool:
        check_alive(consumers)
        return running_executions(job_type) >= count

    wait_for(reached, message=f"{count} {job_type} jobs never ran at once")


def test_a_flood_of_a_limited_job_type_leaves_slots_for_the_others(
    consumer_process: ConsumerFactory, release_file: Path
) -> None:
    # tests.limited allows 2 at once per consumer; the consumer has 4 slots.
    flood = [held(release_file, job_type="tests.limited") for _ in range(20)]
    consumer = consumer_process("--concurrency", "4")
    wait_running("tests.limited", 2, [consumer])

    others = delayjobs.schedule_many(
        [{"job_type": "tests.scripted", "payload": {"n": n}} for n in range(40)]
    )
    wait_final([job.pk for job in others], [consumer])
    # While the flood held its two slots, no third one of it started.
    assert Execution.objects.filter(job_id__in=[job.pk for job in flood]).count() == 2

    release_file.touch()
    wait_final([job.pk for job in flood], [consumer])
    assert statuses(job.pk for job in flood) == {JobStatus.SUCCEEDED: 20}


def test_a_queue_limit_caps_its_queue_and_leaves_slots_for_the_others(
    consumer_process: ConsumerFactory, release_file: Path, redis_client: redis.Redis
) -> None:
    flood = [held(release_file, job_type="tests.slow_queue") for _ in range(10)]
    overrides = {"QUEUE_CONCURRENCY": {"slow": 1}}
    consumer = consumer_process(
        "--concurrency",
        "3",
        "--queue",
        "slow",
        "--queue",
        "default",
        env={"DELAYJOBS_TEST_OVERRIDES": json.dumps(overrides)},
    )
    wait_running("tests.slow_queue", 1, [consumer])

    others = delayjobs.schedule_many(
        [{"job_type": "tests.scripted", "payload": {"n": n}} for n in range(40)]
    )
    wait_final([job.pk for job in others], [consumer])
    assert Execution.objects.filter(job_id__in=[job.pk for job in flood]).count() == 1

    release_file.touch()
    wait_final([job.pk for job in flood], [consumer])
    assert statuses(job.pk for job in flood) == {JobStatus.SUCCEEDED: 10}


def test_a_consumer_whose_limited_queue_is_filled_by_stuck_threads_exits_for_a_fresh_one(
    consumer_process: ConsumerFactory, release_file: Path
) -> None:
    # Four threads, but the queue "slow" has one slot: one stuck job takes it for good.
    overrides = {"QUEUE_CONCURRENCY": {"slow": 1}}
    consumer = consumer_process(
        "--concurrency", "4", env={"DELAYJOBS_TEST_OVERRIDES": json.dumps(overrides)}
    )
    held(release_file, queue="slow")  # tests.scripted: it times out after 2 s

    assert consumer.wait(timeout=60) == EXIT_STUCK, consumer.output()
    assert "fill all 1 slot(s) of the queue 'slow'" in consumer.output()


def max_overlap(job_ids: list[int]) -> int:
    """The most attempts of these jobs that were running at the same moment."""
    events = []
    for attempt in JobAttempt.objects.filter(job_id__in=job_ids):
        events += [(attempt.started_at, 1), (attempt.finished_at, -1)]
    running = peak = 0
    for _moment, change in sorted(events):  # an end sorts before a start at the same moment
        running += change
        peak = max(peak, running)
    return peak


def test_a_queue_limit_holds_across_the_lanes_of_its_job_types(
    consumer_process: ConsumerFactory, release_file: Path
) -> None:
    # The queue "default" allows 2 at once; its jobs wait in two lanes: the queue's own
    # (tests.slow_queue, moved to "default") and that of tests.limited, which has a limit
    # of its own.
    jobs = [held(release_file, job_type="tests.slow_queue", queue="default") for _ in range(3)]
    jobs += [held(release_file, job_type="tests.limited") for _ in range(3)]
    overrides = {"QUEUE_CONCURRENCY": {"default": 2}}
    consumer = consumer_process(
        "--concurrency", "10", env={"DELAYJOBS_TEST_OVERRIDES": json.dumps(overrides)}
    )
    wait_for(
        lambda: DelayedJob.objects.filter(status=JobStatus.RUNNING).count() >= 2,
        message="two jobs never ran at once",
    )
    # A job of another queue ran after those two started: the consumer looked again.
    marker = delayjobs.schedule("tests.noop")
    wait_final([marker.pk], [consumer])
    assert DelayedJob.objects.filter(status=JobStatus.RUNNING).count() == 2

    release_file.touch()
    ids = [job.pk for job in jobs]
    wait_final(ids, [consumer])
    assert statuses(ids) == {JobStatus.SUCCEEDED: 6}
    assert max_overlap(ids) == 2
