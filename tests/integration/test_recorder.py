"""The recorder: outcomes written in batches, and never stuck behind one it cannot write."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

import delayjobs
from delayjobs.engine.recorder import Recorder
from delayjobs.jobtypes import registry
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from delayjobs.transitions import Outcome, claim

pytestmark = pytest.mark.django_db(transaction=True)


def claimed_jobs(count: int) -> list[DelayedJob]:
    jobs = delayjobs.schedule_many(
        [{"job_type": "tests.scripted", "run_at": timezone.now() - timedelta(seconds=1)}] * count
    )
    return claim(
        [job.pk for job in jobs],
        worker_id="w",
        now=timezone.now(),
        job_types=registry.names(),
        leases={},
        default_lease=timedelta(minutes=5),
    )


def finished(job: DelayedJob, **kwargs) -> Outcome:
    now = timezone.now()
    return Outcome(job=job, worker_id="w", started_at=now, finished_at=now, **kwargs)


def run_recorder(outcomes: list[Outcome]) -> Recorder:
    idle = threading.Event()
    recorder = Recorder(on_retries=lambda entries: None, on_idle=idle.set)
    recorder.start()
    for item in outcomes:
        recorder.put(item)
    recorder.stop()
    return recorder


def test_an_outcome_that_cannot_be_written_does_not_block_the_others(caplog):
    gone, kept, other = claimed_jobs(3)
    DelayedJob.objects.filter(pk=gone.pk).delete()  # deleted while it ran: no row for its attempt
    recorder = run_recorder([finished(gone), finished(kept), finished(other)])
    assert recorder.pending == 0
    assert set(
        DelayedJob.objects.filter(status=JobStatus.SUCCEEDED).values_list("pk", flat=True)
    ) == {kept.pk, other.pk}
    assert JobAttempt.objects.filter(outcome=AttemptOutcome.SUCCEEDED).count() == 2
    assert any("cannot be recorded" in r.getMessage() for r in caplog.records)
