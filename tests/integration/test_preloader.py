"""The pre-loader: one idempotent pass that makes Redis reflect the coming window."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import delayjobs
from delayjobs.engine.preloader import preload
from delayjobs.index.store import get_store
from delayjobs.index.window import load_window
from delayjobs.jobtypes import registry
from delayjobs.models import AttemptOutcome, DelayedJob, JobStatus
from delayjobs.pauses import paused
from delayjobs.transitions import claim

pytestmark = pytest.mark.django_db

# tests.settings: PRELOAD_WINDOW is 5 seconds.
WINDOW = timedelta(seconds=5)


def claim_for(
    ids: list[int], worker_id: str, now: datetime, lease: timedelta = timedelta(minutes=5)
) -> list[DelayedJob]:
    """Claim as a consumer knowing every registered job type would."""
    return claim(
        ids,
        worker_id=worker_id,
        now=now,
        job_types=registry.names(),
        leases={},
        default_lease=lease,
    )


def at(now: datetime, seconds: float) -> datetime:
    return now + timedelta(seconds=seconds)


def members(queue: str = "default") -> dict[int, float]:
    return get_store().members(queue)


def index() -> dict[str, dict[int, float]]:
    """Every queue's sorted set that has members."""
    return {queue: found for queue in ("default", "other") if (found := members(queue))}


# Loading the window ------------------------------------------------------------------


def test_pass_loads_exactly_the_scheduled_jobs_due_inside_the_window(redis_client):
    now = timezone.now()
    overdue = delayjobs.schedule("tests.scripted", run_at=at(now, -60))
    soon = delayjobs.schedule("tests.scripted", run_at=at(now, 1))
    edge = delayjobs.schedule("tests.scripted", run_at=at(now, 4.999))
    other_queue = delayjobs.schedule("tests.noop", run_at=at(now, 2))
    delayjobs.schedule("tests.scripted", run_at=now + WINDOW)  # not before now + window
    delayjobs.schedule("tests.scripted", run_at=at(now, 3600))
    cancelled = delayjobs.schedule("tests.scripted", run_at=at(now, 1))
    delayjobs.cancel(cancelled)
    running = delayjobs.schedule("tests.scripted", run_at=at(now, -1))
    claim_for([running.pk], "w", now)
    for status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        finished = delayjobs.schedule("tests.scripted", run_at=at(now, 1))
        DelayedJob.objects.filter(pk=finished.pk).update(status=status)
    assert redis_client.dbsize() == 0  # nothing committed, nothing handed off yet

    result = preload(now=now)

    assert result.ran is True
    assert result.loaded == 4
    assert result.errors == []
    assert index() == {
        "default": {
            overdue.pk: overdue.run_at.timestamp(),
            soon.pk: soon.run_at.timestamp(),
            edge.pk: edge.run_at.timestamp(),
        },
        "other": {other_queue.pk: other_queue.run_at.timestamp()},
    }


def test_pass_is_idempotent():
    now = timezone.now()
    for seconds in (1, 2, 3):
        delayjobs.schedule("tests.scripted", run_at=at(now, seconds))
    first = preload(now=now)
    snapshot = index()
    second = preload(now=now)
    assert first.loaded == second.loaded == 3
    assert index() == snapshot
    assert get_store().size("default") == 3


def test_pass_corrects_a_score_later_than_the_job_but_keeps_an_earlier_one():
    """A late score would fire the job late: the pass moves it to the row's time. An early
    one only makes the consumer pop it, find it not due and put it back at its time."""
    now = timezone.now()
    late = delayjobs.schedule("tests.scripted", run_at=at(now, 2))
    early = delayjobs.schedule("tests.scripted", run_at=at(now, 3))
    get_store().remove([(late.pk, "default", 0.0), (early.pk, "default", 0.0)])
    get_store().add([(late.pk, "default", at(now, 4).timestamp())])
    get_store().add([(early.pk, "default", at(now, -100).timestamp())])
    preload(now=now)
    assert members() == {
        late.pk: late.run_at.timestamp(),
        early.pk: at(now, -100).timestamp(),
    }


@pytest.fixture
def small_batches(settings) -> int:
    settings.DELAYJOBS = {**settings.DELAYJOBS, "PRELOAD_BATCH_SIZE": 3}
    return 3


def test_load_window_pages_through_ties_in_run_at_without_losing_rows(small_batches):
    now = timezone.now().replace(microsecond=0)
    # Seven jobs share one run_at, so page boundaries fall inside a tie (keyset on run_at, id).
    specs = [{"job_type": "tests.scripted", "run_at": at(now, 1)} for _ in range(7)]
    specs += [{"job_type": "tests.noop", "run_at": at(now, s)} for s in (0.5, 2, 3)]
    specs += [{"job_type": "tests.scripted", "run_at": at(now, 2)} for _ in range(1)]
    jobs = delayjobs.schedule_many(specs)

    with CaptureQueriesContext(connection) as captured:
        loaded = load_window(get_store(), now + WINDOW, leave_out=paused().matching())

    assert loaded == len(jobs) == 11
    assert {**members("default"), **members("other")} == {
        job.pk: job.run_at.timestamp() for job in jobs
    }
    # One query for the pauses, then one per page: 11 rows in pages of 3 is 4 pages.
    assert len(captured.captured_queries) == 1 + math.ceil(11 / small_batches)


def test_load_window_with_an_exact_multiple_of_the_batch_size(small_batches):
    now = timezone.now()
    jobs = delayjobs.schedule_many(
        [{"job_type": "tests.scripted", "run_at": at(now, n / 10)} for n in range(9)]
    )
    with CaptureQueriesContext(connection) as captured:
        assert load_window(get_store(), now + WINDOW, leave_out=paused().matching()) == 9
    assert set(members()) == {job.pk for job in jobs}
    # The pauses, three full pages, then one empty page that ends the loop.
    assert len(captured.captured_queries) == 5


def test_load_window_of_an_empty_window_is_two_queries(small_batches):
    delayjobs.schedule("tests.scripted", delay=timedelta(hours=1))
    with CaptureQueriesContext(connection) as captured:
        horizon = timezone.now() + WINDOW
        assert load_window(get_store(), horizon, leave_out=paused().matching()) == 0
    assert len(captured.captured_queries) == 2  # the pauses, and one empty page


# Rebuilding Redis (invariant 2) ------------------------------------------------------


def test_flushed_redis_is_rebuilt_by_the_next_pass(redis_client):
    now = timezone.now()
    jobs = [delayjobs.schedule("tests.scripted", run_at=at(now, n)) for n in (1, 2, 3)]
    jobs.append(delayjobs.schedule("tests.noop", run_at=at(now, 1)))
    preload(now=now)
    before = index()
    assert sum(len(found) for found in before.values()) == 4

    redis_client.flushall()
    assert index() == {}

    result = preload(now=now)
    assert result.loaded == 4
    assert index() == before


# Lease reaping -----------------------------------------------------------------------


def test_pass_returns_expired_leases_to_scheduled_and_loads_them():
    now = timezone.now()
    job = delayjobs.schedule("tests.scripted", run_at=at(now, -10))
    [claimed] = claim_for([job.pk], "dead", now, lease=timedelta(seconds=2))
    later = claimed.lease_expires_at + timedelta(seconds=1)

    result = preload(now=later)

    assert result.reaped == 1
    job.refresh_from_db()
    assert job.status == JobStatus.SCHEDULED
    assert job.attempts == 1
    assert job.history.get().outcome == AttemptOutcome.LEASE_EXPIRED
    assert members() == {job.pk: job.run_at.timestamp()}


def test_pass_leaves_live_leases_alone():
    now = timezone.now()
    job = delayjobs.schedule("tests.scripted", run_at=at(now, -10))
    claim_for([job.pk], "alive", now)
    result = preload(now=now)
    assert result.reaped == 0
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.RUNNING
    assert members() == {}


# The lock ----------------------------------------------------------------------------


def test_pass_is_skipped_while_another_process_holds_the_lock():
    delayjobs.schedule("tests.scripted", run_at=at(timezone.now(), 1))
    with get_store().preload_lock(30) as acquired:
        assert acquired
        result = preload()
        assert result.ran is False
        assert result.loaded == 0
        assert "another process" in str(result)
    assert members() == {}
    assert preload().ran is True
    assert len(members()) == 1


def test_pass_releases_the_lock(redis_client):
    preload()
    with get_store().preload_lock(30) as acquired:
        assert acquired


# plan() hooks ------------------------------------------------------------------------


def _temporary(cls: type[delayjobs.JobType]) -> Iterator[type[delayjobs.JobType]]:
    registry.add(cls)
    try:
        yield cls
    finally:
        registry.remove(cls.name)


@pytest.fixture
def planner() -> Iterator[type[delayjobs.JobType]]:
    """A job type planning two reminders in every window, keyed by slot."""

    class Planner(delayjobs.JobType):
        name = "tests.planner"
        queue = "other"
        calls: list[tuple[datetime, datetime]] = []

        def plan(self, start, end):
            type(self).calls.append((start, end))
            for slot in (1, 2):
                yield {
                    "key": f"planner:{slot}",
                    "run_at": start + timedelta(seconds=slot),
                    "payload": {"slot": slot},
                }

        def execute(self, job):
            return None

    yield from _temporary(Planner)


def test_plan_hook_schedules_keyed_jobs_and_they_are_loaded(planner):
    now = timezone.now()
    result = preload(now=now)
    assert planner.calls == [(now, now + WINDOW)]
    assert result.planned == 2
    assert result.errors == []
    jobs = {job.key: job for job in DelayedJob.objects.filter(job_type="tests.planner")}
    assert sorted(jobs) == ["planner:1", "planner:2"]
    assert jobs["planner:2"].run_at == at(now, 2)
    assert jobs["planner:2"].payload == {"slot": 2}
    assert jobs["planner:2"].queue == "other"
    assert members("other") == {job.pk: job.run_at.timestamp() for job in jobs.values()}


def test_planning_twice_adds_nothing(planner):
    now = timezone.now()
    preload(now=now)
    second = preload(now=now)
    assert second.planned == 0
    assert second.errors == []
    assert DelayedJob.objects.filter(job_type="tests.planner").count() == 2


def test_an_occurrence_an_operator_cancelled_is_not_planned_again(planner):
    now = timezone.now()
    preload(now=now)
    assert delayjobs.cancel(key="planner:1") == 1  # in the admin, say: no reminder this time

    again = preload(now=now)  # the same window: the same occurrences
    assert again.planned == 0
    statuses = DelayedJob.objects.filter(job_type="tests.planner").values_list("key", "status")
    assert sorted(statuses) == [("planner:1", "cancelled"), ("planner:2", "scheduled")]

    later = preload(now=now + timedelta(seconds=30))  # a new occurrence of the same key
    assert later.planned == 1
    assert DelayedJob.objects.filter(key="planner:1", status="scheduled").get().run_at == at(
        now + timedelta(seconds=30), 1
    )


def test_plan_yielding_a_job_without_a_key_is_reported_and_loading_goes_on(caplog):
    class Keyless(delayjobs.JobType):
        name = "tests.keyless-planner"

        def plan(self, start, end):
            yield {"key": "keyless:ok", "run_at": start}
            yield {"run_at": start}
            yield {"key": "keyless:after", "run_at": start}
            yield {"key": "keyless:replacing", "run_at": start, "replace": True}

        def execute(self, job):
            return None

    caplog.set_level(logging.ERROR, logger="delayjobs")
    now = timezone.now()
    unrelated = delayjobs.schedule("tests.scripted", run_at=at(now, 1))
    for _ in _temporary(Keyless):
        result = preload(now=now)
    assert result.ran
    # A bad item is reported and skipped; the items after it are still planned.
    assert result.planned == 2
    assert len(result.errors) == 2
    assert all("tests.keyless-planner" in error for error in result.errors)
    assert "replace" in result.errors[1]
    assert "without a key" in result.errors[0]
    planned = DelayedJob.objects.filter(job_type=Keyless.name).values_list("key", flat=True)
    assert sorted(planned) == ["keyless:after", "keyless:ok"]
    assert unrelated.pk in members()


def test_plan_raising_is_reported_and_other_planners_and_loading_go_on(planner, caplog):
    class Broken(delayjobs.JobType):
        name = "tests.broken-planner"

        def plan(self, start, end):
            raise RuntimeError("business data unavailable")

        def execute(self, job):
            return None

    caplog.set_level(logging.ERROR, logger="delayjobs")
    now = timezone.now()
    unrelated = delayjobs.schedule("tests.scripted", run_at=at(now, 1))
    for _ in _temporary(Broken):
        result = preload(now=now)
    assert result.errors == ["tests.broken-planner.plan(): RuntimeError: business data unavailable"]
    assert result.planned == 2  # the other planner still planned
    assert unrelated.pk in members()
    assert any("plan() failed" in r.getMessage() for r in caplog.records)


def test_plan_yielding_an_invalid_job_is_reported():
    class Naive(delayjobs.JobType):
        name = "tests.naive-planner"

        def plan(self, start, end):
            yield {"key": "naive:1", "run_at": start.replace(tzinfo=None)}

        def execute(self, job):
            return None

    for _ in _temporary(Naive):
        result = preload()
    assert len(result.errors) == 1
    assert "timezone-aware" in result.errors[0]
    assert not DelayedJob.objects.filter(job_type=Naive.name).exists()


# Entry points ------------------------------------------------------------------------


@pytest.fixture
def restore_delayjobs_logger() -> Iterator[None]:
    """The commands set the 'delayjobs' logger's level from --verbosity; put it back."""
    logger = logging.getLogger("delayjobs")
    level, handlers = logger.level, list(logger.handlers)
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers


def test_preload_command_runs_one_pass(restore_delayjobs_logger):
    job = delayjobs.schedule("tests.scripted", run_at=at(timezone.now(), 1))
    out = StringIO()
    call_command("preload_delay_jobs", stdout=out)
    assert "loaded 1 job(s)" in out.getvalue()
    assert members() == {job.pk: job.run_at.timestamp()}


def test_preload_command_reports_a_skipped_pass(restore_delayjobs_logger):
    out = StringIO()
    with get_store().preload_lock(30):
        call_command("preload_delay_jobs", stdout=out)
    assert "skipped" in out.getvalue()


def test_celery_task_runs_a_pass():
    from delayjobs.tasks import preload as preload_task

    assert preload_task.name == "delayjobs.tasks.preload"
    job = delayjobs.schedule("tests.scripted", run_at=at(timezone.now(), 1))
    outcome = preload_task.apply().get()
    assert outcome["ran"] is True
    assert outcome["loaded"] == 1
    assert outcome["errors"] == []
    assert members() == {job.pk: job.run_at.timestamp()}


def test_celery_task_called_directly_runs_a_pass():
    from delayjobs.tasks import preload as preload_task

    delayjobs.schedule("tests.noop", run_at=at(timezone.now(), 1))
    assert preload_task()["loaded"] == 1
    assert len(members("other")) == 1
