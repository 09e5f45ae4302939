"""The Celery executor end to end: a real Celery worker (the sample project's Celery app,
threads pool) on the tests' real Redis as broker, and a real ``run_delay_consumer
--executor celery`` that claims jobs and publishes one task per job.

What must hold is what holds for the local pool: every job runs once per attempt, the
retry policy applies, attempt rows and job rows are written the same way, and a task that
arrives after its claim is gone does nothing.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.utils import timezone

import delayjobs
from delayjobs import transitions
from delayjobs.checks import check_settings
from delayjobs.contrib.celery.worker import run_dispatched
from delayjobs.engine.consumer import Consumer
from delayjobs.index.keys import due_key
from delayjobs.jobtypes import registry
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from tests.conftest import REPO_ROOT, ConsumerFactory, ConsumerProcess, subprocess_env
from tests.consumers import Outage, statuses, wait_final, wait_output
from tests.models import Execution
from tests.utils import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPTED = "tests.scripted"
BROKERED = "tests.brokered"
CELERY_WORKER = ("-m", "celery", "-A", "sampleproject", "worker")


@pytest.fixture
def celery_worker_process(tmp_path: Path) -> Iterator[Callable[[], ConsumerProcess]]:
    """Factory: a real Celery worker subprocess, waited for until it is ready."""
    started: list[ConsumerProcess] = []

    def start(command: tuple[str, ...] = CELERY_WORKER, **env: str) -> ConsumerProcess:
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
            subprocess_env(**env),
            command=command,
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
    # renews their leases while they wait in the broker. A type whose time_to_run (60 s)
    # outlasts a worker's start however loaded the machine: a job no worker takes over
    # within its time_to_run is let go, by design (its lease then expires).
    consumer = consumer_process("--executor", "celery", "--concurrency", "2")
    jobs = delayjobs.schedule_many([{"job_type": "tests.limited"} for _ in range(10)])
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
def test_a_consumer_whose_broker_does_not_answer_stops_before_claiming(
    consumer_process: ConsumerFactory,
) -> None:
    job = delayjobs.schedule(SCRIPTED, {"n": 1})
    # A broker nobody listens on: port 9 (discard) on the loopback, refused at once.
    consumer = consumer_process(
        "--executor", "celery", env={"DELAYJOBS_TEST_CELERY_BROKER": "redis://127.0.0.1:9/1"}
    )

    assert consumer.wait() != 0
    output = consumer.output()
    assert "The broker of Celery app 'sampleproject' at redis://" in output
    assert "127.0.0.1:9/1 does not answer" in output
    assert "CELERY_BROKER_URL" in output
    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.SCHEDULED, 0)
    assert not JobAttempt.objects.exists()


# A stranger's project, as Django's and Celery's own guides lay it out ("First steps with
# Django"): the app in proj/celery.py; proj/__init__.py loads it, or, in a project that
# skipped that step, does not.
STRANGER_CELERY = """
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
"""
STRANGER_INIT = """
from .celery import app as celery_app

__all__ = ("celery_app",)
"""
# Its settings reach the tests' database, Redis and broker through the environment.
STRANGER_SETTINGS = """
import json
import os

SECRET_KEY = "a stranger's project"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "delayjobs", "tests"]
DATABASES = {"default": json.loads(os.environ["STRANGER_DATABASE"])}
DELAYJOBS = json.loads(os.environ["STRANGER_DELAYJOBS"])
CELERY_BROKER_URL = os.environ["STRANGER_BROKER"]
"""


def stranger_project(root: Path, *, loads_its_app: bool) -> dict[str, str]:
    """Write the project under ``root``; the environment its processes run in."""
    package = root / "proj"
    package.mkdir()
    (package / "__init__.py").write_text(STRANGER_INIT if loads_its_app else "")
    (package / "celery.py").write_text(STRANGER_CELERY)
    (package / "settings.py").write_text(STRANGER_SETTINGS)
    database = {
        key: connection.settings_dict[key]
        for key in ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")
    }
    return {
        "DJANGO_SETTINGS_MODULE": "proj.settings",
        "PYTHONPATH": os.pathsep.join([str(root), str(REPO_ROOT)]),
        "STRANGER_DATABASE": json.dumps(database),
        "STRANGER_DELAYJOBS": json.dumps(django_settings.DELAYJOBS),
        "STRANGER_BROKER": django_settings.CELERY_BROKER_URL,
    }


@pytest.mark.subprocess
@pytest.mark.parametrize("loads_its_app", [True, False], ids=["loads-its-app", "does-not"])
def test_a_project_laid_out_as_celery_documents_it_runs_jobs_in_celery(
    consumer_process: ConsumerFactory,
    celery_worker_process: Callable[..., ConsumerProcess],
    tmp_path: Path,
    loads_its_app: bool,
) -> None:
    env = stranger_project(tmp_path, loads_its_app=loads_its_app)
    job = delayjobs.schedule(SCRIPTED, {"n": 1})
    django_admin = ("-m", "django", "run_delay_consumer")
    if not loads_its_app:
        # Without --celery-app, this consumer would publish to Celery's default broker.
        refused = consumer_process("--executor", "celery", env=env, command=django_admin)
        assert refused.wait() != 0
        assert "found no Celery app in this process" in refused.output()
        assert "--celery-app" in refused.output()
        job.refresh_from_db()
        assert (job.status, job.attempts) == (JobStatus.SCHEDULED, 0)
    app_option = () if loads_its_app else ("--celery-app", "proj")
    worker = celery_worker_process(command=("-m", "celery", "-A", "proj", "worker"), **env)
    consumer = consumer_process("--executor", "celery", *app_option, env=env, command=django_admin)

    wait_final([job.pk], [consumer, worker])
    assert history_of(job.pk) == [(1, AttemptOutcome.SUCCEEDED)]
    (execution,) = Execution.objects.all()
    assert execution.worker_id.startswith("celery-test-")


def test_a_celery_app_option_that_finds_no_app_is_refused() -> None:
    with pytest.raises(CommandError, match=r"--celery-app 'proj; rm': use a module path"):
        call_command("run_delay_consumer", executor="celery", celery_app="proj; rm")
    with pytest.raises(CommandError, match=r"--celery-app 'tests.nowhere': no Celery app found"):
        call_command("run_delay_consumer", executor="celery", celery_app="tests.nowhere")
    with pytest.raises(CommandError, match=r"'tests.models:Execution' is ModelBase, not a Celery"):
        call_command("run_delay_consumer", executor="celery", celery_app="tests.models:Execution")
    with pytest.raises(CommandError, match=r"--celery-app is for the Celery executor"):
        call_command("run_delay_consumer", executor="local", celery_app="sampleproject")


#: What the consumer logs (at DEBUG) for each job it hands to Celery, and for each it gives
#: back because the broker did not take its task.
HANDED_OVER = re.compile(r"Job (\d+) attempt (\d+) handed to Celery")
GIVEN_BACK = re.compile(r"Job (\d+) \S+: the Celery broker did not take")


@pytest.mark.subprocess
def test_a_broker_that_fails_mid_run_costs_no_attempt_and_loses_nothing(
    consumer_process: ConsumerFactory,
    celery_worker_process: Callable[..., ConsumerProcess],
) -> None:
    broker = Outage()
    broker.start()
    try:
        env = {"DELAYJOBS_TEST_CELERY_BROKER": broker.url.replace("/0", "/1")}
        worker = celery_worker_process(**env)
        consumer = consumer_process(
            "--executor",
            "celery",
            "--concurrency",
            "4",
            env={**env, "DELAYJOBS_TEST_LOG_LEVEL": "DEBUG"},
        )
        before = delayjobs.schedule_many(
            [{"job_type": BROKERED, "payload": {"n": n}} for n in range(20)]
        )
        succeeded = DelayedJob.objects.filter(
            pk__in=[job.pk for job in before], status=JobStatus.SUCCEEDED
        )
        wait_for(lambda: succeeded.count() >= 5, message="no job ran before the broker stopped")
        broker.stop()
        # Due while the broker is down: the consumer claims them, and the broker refuses
        # their tasks (the rest of the first batch may be lost with it, in its queue).
        during = delayjobs.schedule_many(
            [{"job_type": BROKERED, "payload": {"n": n}} for n in range(20)]
        )
        wait_output(consumer, "goes back without spending its attempt")
        # Celery's worker either waits for the broker or, at times, exits on the lost
        # connection ("Unrecoverable error" from kombu's redis transport, a known class of
        # bug): then it is started again once the broker is back, as its supervisor would.
        wait_for(lambda: worker.returncode is not None or "Trying again in" in worker.output())
        broker.start()  # empty: tasks published before the stop are lost with it
        if worker.returncode is not None:
            worker = celery_worker_process(**env)
        wait_output(consumer, "the Celery broker takes tasks again", timeout=60)

        ids = [job.pk for job in [*before, *during]]
        wait_final(ids, [consumer, worker], timeout=90)
    finally:
        if broker.server is not None:
            broker.stop()

    assert statuses(ids) == {JobStatus.SUCCEEDED: len(ids)}
    output = consumer.output()
    assert {int(pk) for pk in GIVEN_BACK.findall(output)}
    handed_over = {(int(pk), int(attempt)) for pk, attempt in HANDED_OVER.findall(output)}
    # A give-back spends no attempt: no attempt row, and the next claim takes the same
    # number. So every attempt row is of a task the consumer handed to Celery, numbered on
    # from 1. A task lost with the broker, or not taken over within its time_to_run (the
    # worker was still reconnecting when the consumer published it again), may run again
    # once its lease expired: the at-least-once re-run the lease rules allow, never a
    # failure. That is the only attempt that ends otherwise than succeeded.
    for job in DelayedJob.objects.filter(pk__in=ids):
        history = history_of(job.pk)
        numbers = [number for number, _ in history]
        assert numbers == list(range(1, job.attempts + 1)), (job.pk, history)
        assert all((job.pk, number) in handed_over for number in numbers), (job.pk, history)
        outcomes = [outcome for _, outcome in history]
        assert outcomes == [AttemptOutcome.LEASE_EXPIRED] * (len(outcomes) - 1) + [
            AttemptOutcome.SUCCEEDED
        ], (job.pk, history)


def history_of(pk: int) -> list[tuple[int, str]]:
    return list(
        JobAttempt.objects.filter(job_id=pk).order_by("number").values_list("number", "outcome")
    )


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
        assert "must be one of 'local', 'celery'; got 'threads'" in error.msg
        # A consumer built without the checks reads the setting by the same rule.
        with pytest.raises(ImproperlyConfigured, match=r"DELAYJOBS\['EXECUTOR'\] must be one of"):
            Consumer(burst=True)
    with pytest.raises(ValueError, match="executor must be one of"):
        Consumer(burst=True, executor="thread")
