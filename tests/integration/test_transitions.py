"""State transitions: claim, outcomes with fencing, lease reaping and renewal."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import delayjobs
from delayjobs import transitions
from delayjobs.core import clock
from delayjobs.jobtypes import registry
from delayjobs.lanes import index_entry
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from delayjobs.transitions import Outcome, claim, claims, reap_expired_leases, record_outcomes
from tests.utils import row_locked

pytestmark = pytest.mark.django_db

LEASE = timedelta(seconds=30)


def due_job(job_type: str = "tests.scripted", **kwargs) -> DelayedJob:
    kwargs.setdefault("run_at", timezone.now() - timedelta(seconds=1))
    return delayjobs.schedule(job_type, **kwargs)


def claim_as(worker_id: str, ids, now: datetime | None = None, **kwargs) -> list[DelayedJob]:
    kwargs.setdefault("job_types", registry.names())
    kwargs.setdefault("leases", {})
    kwargs.setdefault("default_lease", LEASE)
    return claim(list(ids), worker_id=worker_id, now=now or timezone.now(), **kwargs)


def outcome(job: DelayedJob, worker_id: str, **kwargs) -> Outcome:
    started = job.claimed_at or timezone.now()
    return Outcome(
        job=job,
        worker_id=worker_id,
        started_at=started,
        finished_at=started + timedelta(milliseconds=5),
        **kwargs,
    )


# claim() -----------------------------------------------------------------------------


def test_claim_moves_due_jobs_to_running_with_a_lease():
    jobs = [due_job() for _ in range(3)]
    now = timezone.now()
    claimed = claim_as("worker-a", [job.pk for job in jobs], now=now)
    assert sorted(job.pk for job in claimed) == sorted(job.pk for job in jobs)
    for job in DelayedJob.objects.all():
        assert job.status == JobStatus.RUNNING
        assert job.attempts == 1
        assert job.worker_id == "worker-a"
        assert job.claimed_at == now
        assert job.lease_expires_at == now + LEASE
    # The returned objects carry the claimed state (the strategy reads job.attempts).
    assert {job.attempts for job in claimed} == {1}


def test_claim_has_one_winner():
    jobs = [due_job() for _ in range(5)]
    ids = [job.pk for job in jobs]
    first = claim_as("worker-a", ids)
    second = claim_as("worker-b", ids)
    assert len(first) == 5
    assert second == []
    assert set(DelayedJob.objects.values_list("worker_id", flat=True)) == {"worker-a"}
    assert set(DelayedJob.objects.values_list("attempts", flat=True)) == {1}


def test_claim_of_overlapping_batches_gives_each_job_to_one_worker():
    jobs = [due_job() for _ in range(6)]
    ids = [job.pk for job in jobs]
    first = claim_as("worker-a", ids[:4])
    second = claim_as("worker-b", ids[2:])
    assert {job.pk for job in first} == set(ids[:4])
    assert {job.pk for job in second} == set(ids[4:])


def test_claim_skips_jobs_not_yet_due():
    now = timezone.now()
    due = due_job(run_at=now - timedelta(seconds=1))
    later = due_job(run_at=now + timedelta(seconds=1))
    claimed = claim_as("worker-a", [due.pk, later.pk], now=now)
    assert [job.pk for job in claimed] == [due.pk]
    later.refresh_from_db()
    assert later.status == JobStatus.SCHEDULED
    assert later.attempts == 0


@pytest.mark.parametrize(
    "status", [JobStatus.CANCELLED, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.RUNNING]
)
def test_claim_skips_jobs_that_are_not_scheduled(status):
    job = due_job()
    DelayedJob.objects.filter(pk=job.pk).update(status=status)
    assert claim_as("worker-a", [job.pk]) == []
    job.refresh_from_db()
    assert job.status == status
    assert job.worker_id == ""


def test_claim_of_unknown_ids_or_no_ids_is_nothing():
    assert claim_as("worker-a", []) == []
    assert claim_as("worker-a", [987654]) == []


def test_claim_token_returns_only_the_rows_this_call_won():
    first_job, second_job = due_job(), due_job()
    t1 = timezone.now()
    assert [job.pk for job in claim_as("worker-a", [first_job.pk], now=t1)] == [first_job.pk]
    # Same worker, a later claim that also names the job it already runs: only the new one.
    t2 = t1 + timedelta(microseconds=1)
    claimed = claim_as("worker-a", [first_job.pk, second_job.pk], now=t2)
    assert [job.pk for job in claimed] == [second_job.pk]
    assert DelayedJob.objects.get(pk=first_job.pk).claimed_at == t1


def test_claim_leaves_job_types_the_consumer_does_not_know():
    known, unknown = due_job("tests.scripted"), due_job("tests.noop")
    claimed = claim_as("worker-a", [known.pk, unknown.pk], job_types=["tests.scripted"])
    assert [job.pk for job in claimed] == [known.pk]
    unknown.refresh_from_db()
    assert unknown.status == JobStatus.SCHEDULED
    assert unknown.attempts == 0  # no attempt spent by a consumer that cannot run it


@pytest.mark.parametrize("returning", [True, False], ids=["returning", "update-then-select"])
def test_portable_claim_path(monkeypatch, returning):
    """The one-UPDATE claim used where rows cannot be locked with SKIP LOCKED (SQLite),
    with RETURNING and without it (MySQL, Oracle), run directly on every database."""
    if not returning:
        monkeypatch.setattr(claims, "update_returning", lambda queryset, **changes: None)
    first, second, later = due_job(), due_job(), due_job(run_at=timezone.now() + LEASE)

    def portable_claim(worker_id: str, now: datetime) -> list[DelayedJob]:
        return claims._claim_with_update(
            [first.pk, second.pk, later.pk],
            worker_id,
            now,
            now + transitions.CLAIM_TOLERANCE,
            registry.names(),
            {},
            LEASE,
        )

    now = timezone.now()
    claimed = portable_claim("worker-a", now)
    assert sorted(job.pk for job in claimed) == sorted([first.pk, second.pk])
    assert {(job.status, job.attempts, job.claimed_at) for job in claimed} == {
        (JobStatus.RUNNING, 1, now)
    }
    assert {job.lease_expires_at for job in claimed} == {now + LEASE}
    assert portable_claim("worker-b", now + timedelta(microseconds=1)) == []


def _loaded(job: DelayedJob) -> tuple[dict, bool, str | None]:
    values = {k: v for k, v in vars(job).items() if k != "_state"}
    return values, job._state.adding, job._state.db


def test_claimed_rows_are_the_instances_the_orm_would_load():
    """Claimed rows are built without Model.__init__ (and timestamps parsed in C on
    PostgreSQL): the same values, of the same types and time zone, in the same state."""
    job = due_job(payload={"a": [1, 2]}, max_lateness=timedelta(seconds=3))
    [claimed] = claim_as("worker-a", [job.pk])
    [loaded] = DelayedJob.objects.filter(pk=job.pk)
    assert _loaded(claimed) == _loaded(loaded)
    for name, value in vars(loaded).items():
        assert type(vars(claimed)[name]) is type(value), name
        if isinstance(value, datetime):
            assert vars(claimed)[name].tzinfo is value.tzinfo, name
    claimed.save()  # a plain instance: it saves like one
    assert DelayedJob.objects.get(pk=job.pk).payload == {"a": [1, 2]}


def test_claim_builds_instances_with_init_where_a_receiver_listens():
    from django.db.models.signals import post_init

    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance.pk)

    job = due_job()
    post_init.connect(receiver, sender=DelayedJob)
    try:
        [claimed] = claim_as("worker-a", [job.pk])
    finally:
        post_init.disconnect(receiver, sender=DelayedJob)
    assert seen == [job.pk]
    assert claimed.status == JobStatus.RUNNING


@pytest.mark.django_db(transaction=True)
def test_claim_skips_a_row_locked_by_an_open_transaction_where_the_database_can():
    """PostgreSQL: SKIP LOCKED, so a caller's long transaction never stalls the consumer."""
    locked, free = due_job(), due_job()
    if not connection.features.has_select_for_update_skip_locked:
        assert connection.vendor == "sqlite"
        pytest.skip("SQLite locks the whole database for writes: there is no row lock to skip")
    with row_locked(DelayedJob, locked.pk):
        claimed = claim_as("worker-a", [locked.pk, free.pk])
        assert [job.pk for job in claimed] == [free.pk]
    assert [job.pk for job in claim_as("worker-a", [locked.pk])] == [locked.pk]


def test_claim_uses_each_job_types_lease():
    scripted = due_job("tests.scripted")
    noop = due_job("tests.noop")
    now = timezone.now()
    claim_as(
        "worker-a",
        [scripted.pk, noop.pk],
        now=now,
        leases={"tests.scripted": timedelta(seconds=2)},
        default_lease=timedelta(minutes=5),
    )
    scripted.refresh_from_db()
    noop.refresh_from_db()
    assert scripted.lease_expires_at == now + timedelta(seconds=2)
    assert noop.lease_expires_at == now + timedelta(minutes=5)


def test_claim_counts_attempts_across_retries():
    job = due_job()
    [claimed] = claim_as("worker-a", [job.pk])
    retry_at = timezone.now() - timedelta(milliseconds=1)
    record_outcomes([outcome(claimed, "worker-a", error="E: x", retry_at=retry_at)])
    [again] = claim_as("worker-b", [job.pk])
    assert again.attempts == 2


# record_outcomes() -------------------------------------------------------------------


def test_success_marks_the_job_succeeded_and_writes_an_attempt_row():
    job = due_job()
    [claimed] = claim_as("worker-a", [job.pk])
    retries = record_outcomes([outcome(claimed, "worker-a")])
    assert retries == []
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert job.finished_at is not None
    assert job.lease_expires_at is None
    [attempt] = JobAttempt.objects.filter(job=job)
    assert attempt.number == 1
    assert attempt.outcome == AttemptOutcome.SUCCEEDED
    assert attempt.worker_id == "worker-a"
    assert attempt.error == ""
    assert attempt.lateness == claimed.claimed_at - job.run_at
    # The row keeps the execution start apart from the claim, both this attempt's.
    assert job.started_at == claimed.claimed_at


def test_one_batch_records_every_kind_of_end_with_one_attempt_row_each():
    jobs = [due_job(max_attempts=1) for _ in range(3)] + [due_job(max_attempts=3)]
    now = timezone.now()
    claimed = {job.pk: job for job in claim_as("worker-a", [job.pk for job in jobs], now=now)}
    ok, also_ok, failed, retried = (claimed[job.pk] for job in jobs)
    retry_at = now + timedelta(seconds=9)
    retries = record_outcomes(
        [
            outcome(ok, "worker-a"),
            outcome(also_ok, "worker-a"),
            outcome(failed, "worker-a", error="E: x", traceback="tb x"),
            outcome(retried, "worker-a", error="E: y", traceback="tb y", retry_at=retry_at),
        ]
    )
    assert retries == [(retried.pk, "default", retry_at.timestamp())]
    expected = {
        ok.pk: (JobStatus.SUCCEEDED, AttemptOutcome.SUCCEEDED, ""),
        also_ok.pk: (JobStatus.SUCCEEDED, AttemptOutcome.SUCCEEDED, ""),
        failed.pk: (JobStatus.FAILED, AttemptOutcome.FAILED, "E: x"),
        retried.pk: (JobStatus.SCHEDULED, AttemptOutcome.RETRYING, "E: y"),
    }
    for job in jobs:
        job.refresh_from_db()
        [attempt] = JobAttempt.objects.filter(job=job)
        assert (job.status, attempt.outcome, attempt.error) == expected[job.pk]
        assert (attempt.number, attempt.worker_id) == (1, "worker-a")
        assert attempt.started_at == now
        assert attempt.finished_at == now + timedelta(milliseconds=5)
        assert attempt.lateness == now - claimed[job.pk].run_at
    tracebacks = dict(JobAttempt.objects.values_list("job_id", "traceback"))
    assert tracebacks == {ok.pk: "", also_ok.pk: "", failed.pk: "tb x", retried.pk: "tb y"}


def test_clean_ends_written_together_keep_each_jobs_own_execution_start():
    jobs = [due_job() for _ in range(4)]
    now = timezone.now()
    claimed = claim_as("worker-a", [job.pk for job in jobs], now=now)
    starts = {job.pk: now + timedelta(milliseconds=n + 1) for n, job in enumerate(claimed)}
    record_outcomes(
        [
            Outcome(
                job=job,
                worker_id="worker-a",
                started_at=starts[job.pk],
                finished_at=starts[job.pk] + timedelta(milliseconds=5),
            )
            for job in claimed
        ]
    )
    stored = dict(DelayedJob.objects.values_list("pk", "started_at"))
    assert stored == starts
    assert set(DelayedJob.objects.values_list("status", flat=True)) == {JobStatus.SUCCEEDED}


def test_failure_with_attempts_left_schedules_a_retry():
    job = due_job()
    [claimed] = claim_as("worker-a", [job.pk])
    retry_at = timezone.now() + timedelta(seconds=7)
    retries = record_outcomes(
        [
            outcome(
                claimed,
                "worker-a",
                error="ValueError: bad",
                traceback="Traceback (most recent call last): ValueError: bad",
                retry_at=retry_at,
            )
        ]
    )
    assert retries == [(job.pk, "default", retry_at.timestamp())]
    job.refresh_from_db()
    assert job.status == JobStatus.SCHEDULED
    assert job.run_at == retry_at
    assert job.attempts == 1
    assert job.worker_id == ""
    assert job.lease_expires_at is None
    assert job.last_error == "ValueError: bad"
    [attempt] = JobAttempt.objects.filter(job=job)
    assert attempt.outcome == AttemptOutcome.RETRYING
    assert "most recent call last" in attempt.traceback


def test_failure_without_retry_marks_the_job_failed_keeping_error_and_traceback():
    job = due_job()
    [claimed] = claim_as("worker-a", [job.pk])
    retries = record_outcomes(
        [outcome(claimed, "worker-a", error="KeyError: 'x'", traceback="Traceback: KeyError")]
    )
    assert retries == []
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.finished_at is not None
    assert job.last_error == "KeyError: 'x'"
    [attempt] = JobAttempt.objects.filter(job=job)
    assert attempt.outcome == AttemptOutcome.FAILED
    assert attempt.traceback == "Traceback: KeyError"


def test_outcomes_of_a_batch_are_recorded_together():
    jobs = [due_job() for _ in range(4)]
    claimed = claim_as("worker-a", [job.pk for job in jobs])
    by_pk = {job.pk: job for job in claimed}
    retry_at = timezone.now() + timedelta(seconds=1)
    retries = record_outcomes(
        [
            outcome(by_pk[jobs[0].pk], "worker-a"),
            outcome(by_pk[jobs[1].pk], "worker-a"),
            outcome(by_pk[jobs[2].pk], "worker-a", error="E: retry", retry_at=retry_at),
            outcome(by_pk[jobs[3].pk], "worker-a", error="E: dead"),
        ]
    )
    assert [pk for pk, _queue, _score in retries] == [jobs[2].pk]
    statuses = dict(DelayedJob.objects.values_list("pk", "status"))
    assert [statuses[job.pk] for job in jobs] == [
        JobStatus.SUCCEEDED,
        JobStatus.SUCCEEDED,
        JobStatus.SCHEDULED,
        JobStatus.FAILED,
    ]
    assert JobAttempt.objects.count() == 4


def _stale_and_current(job: DelayedJob) -> tuple[DelayedJob, DelayedJob]:
    """Worker A claims attempt 1, its lease expires, worker B claims attempt 2."""
    [stale] = claim_as("worker-a", [job.pk])
    assert reap_expired_leases(stale.lease_expires_at + timedelta(seconds=1))
    [current] = claim_as("worker-b", [job.pk])
    assert (stale.attempts, current.attempts) == (1, 2)
    return stale, current


def test_stale_success_does_not_overwrite_the_current_attempt_but_is_recorded():
    job = due_job()
    stale, _current = _stale_and_current(job)
    assert record_outcomes([outcome(stale, "worker-a")]) == []
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert job.attempts == 2
    assert job.worker_id == "worker-b"
    numbers = sorted(JobAttempt.objects.filter(job=job).values_list("number", "outcome"))
    assert numbers == [(1, AttemptOutcome.LEASE_EXPIRED), (1, AttemptOutcome.SUCCEEDED)]


def test_stale_failure_does_not_overwrite_the_current_attempt_nor_ask_for_a_retry():
    job = due_job()
    stale, current = _stale_and_current(job)
    retry_at = timezone.now() + timedelta(seconds=1)
    retries = record_outcomes([outcome(stale, "worker-a", error="E: late", retry_at=retry_at)])
    assert retries == []
    retries = record_outcomes([outcome(stale, "worker-a", error="E: late")])
    assert retries == []
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert job.worker_id == "worker-b"
    assert job.last_error != "E: late"
    # The current attempt still records normally.
    record_outcomes([outcome(current, "worker-b")])
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert JobAttempt.objects.filter(job=job).count() == 4


def test_outcome_of_an_earlier_claim_with_the_same_attempt_number_is_fenced():
    """Lease taken over, job retried (attempts reset), claimed again by the same worker:
    the first execution's late outcome must not land on the second one."""
    job = due_job()
    [first] = claim_as("worker-a", [job.pk], now=timezone.now())
    DelayedJob.objects.filter(pk=job.pk).update(status=JobStatus.SCHEDULED, attempts=0)
    [second] = claim_as("worker-a", [job.pk], now=first.claimed_at + timedelta(seconds=1))
    assert (first.attempts, first.worker_id) == (second.attempts, second.worker_id)
    record_outcomes([outcome(first, "worker-a")])
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    record_outcomes([outcome(second, "worker-a")])
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED


def test_a_batch_from_several_claims_lands_on_each_claim_in_one_update():
    """Outcomes of three claims in one recorder batch: one statement updates the job rows
    of all, still fenced on each row's own claim (a stale one, from a claim since taken
    over, is not)."""
    jobs = [due_job() for _ in range(5)]
    now = timezone.now()
    first = claim_as("worker-a", [jobs[0].pk, jobs[1].pk], now=now)
    second = claim_as("worker-a", [jobs[2].pk, jobs[3].pk], now=now + timedelta(seconds=1))
    [stale] = claim_as("worker-a", [jobs[4].pk], now=now + timedelta(seconds=2))
    DelayedJob.objects.filter(pk=stale.pk).update(status=JobStatus.SCHEDULED, attempts=0)
    [current] = claim_as("worker-a", [stale.pk], now=now + timedelta(seconds=3))
    with CaptureQueriesContext(connection) as queries:
        record_outcomes([outcome(job, "worker-a") for job in [*first, *second, stale]])
    table = connection.ops.quote_name(DelayedJob._meta.db_table)
    updates = [q["sql"] for q in queries.captured_queries if f"UPDATE {table}" in q["sql"]]
    assert len(updates) == 1
    statuses = dict(DelayedJob.objects.values_list("pk", "status"))
    assert statuses == {
        **{job.pk: JobStatus.SUCCEEDED for job in [*first, *second]},
        current.pk: JobStatus.RUNNING,
    }
    assert JobAttempt.objects.count() == 5


def test_outcome_from_another_worker_with_the_same_attempt_number_is_fenced():
    job = due_job()
    [claimed] = claim_as("worker-a", [job.pk])
    record_outcomes([outcome(claimed, "worker-z")])
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert JobAttempt.objects.filter(job=job).count() == 1


# reap_expired_leases() ---------------------------------------------------------------


# give_back() -------------------------------------------------------------------------


def test_give_back_returns_a_claim_unspent_and_only_that_very_claim():
    job = due_job()
    (first,) = claim_as("worker-a", [job.pk])
    later = timezone.now() + timedelta(seconds=2)
    # Not this claim: another worker, or the same worker's earlier claim time.
    assert (
        transitions.give_back(DelayedJob.objects.get(pk=job.pk), worker_id="b", due=later) is None
    )
    stale = DelayedJob.objects.get(pk=job.pk)
    stale.claimed_at = first.claimed_at - timedelta(microseconds=1)
    assert transitions.give_back(stale, worker_id="worker-a", due=later) is None
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.RUNNING

    entry = transitions.give_back(first, worker_id="worker-a", due=later)

    assert entry == index_entry(job.pk, "default", "tests.scripted", later.timestamp())
    row = DelayedJob.objects.get(pk=job.pk)
    assert (row.status, row.attempts, row.worker_id, row.lease_expires_at) == (
        JobStatus.SCHEDULED,
        0,
        "",
        None,
    )
    assert row.run_at == job.run_at  # its lateness still counts from its due time
    assert not JobAttempt.objects.exists()
    assert transitions.give_back(first, worker_id="worker-a", due=later) is None
    # The next claim is attempt 1 again.
    (again,) = claim_as("worker-a", [job.pk])
    assert again.attempts == 1


def test_reap_returns_an_expired_job_to_scheduled_counting_the_attempt():
    job = due_job()
    [claimed] = claim_as("worker-a", [job.pk])
    rescheduled = reap_expired_leases(claimed.lease_expires_at + timedelta(seconds=1))
    assert rescheduled == [(job.pk, "default", job.run_at.timestamp())]
    job.refresh_from_db()
    assert job.status == JobStatus.SCHEDULED
    assert job.attempts == 1
    assert job.worker_id == ""
    assert job.lease_expires_at is None
    assert "Lease expired" in job.last_error
    [attempt] = JobAttempt.objects.filter(job=job)
    assert attempt.outcome == AttemptOutcome.LEASE_EXPIRED
    assert attempt.number == 1
    assert attempt.worker_id == "worker-a"
    assert attempt.started_at == job.started_at == claimed.claimed_at
    assert attempt.finished_at is None


@pytest.mark.parametrize("path", ["this database's claim", "the portable claim"])
def test_the_lease_of_a_job_claimed_ahead_counts_from_its_run_at(path: str) -> None:
    # Claimed 4 s ahead with a 2 s time_to_run: a lease from the claim would expire before
    # the job may even start, and the job could run twice.
    now = timezone.now()
    ahead, due = due_job(run_at=now + timedelta(seconds=4)), due_job()
    leases = {"tests.scripted": timedelta(seconds=2)}
    if path == "the portable claim":
        claimed = claims._claim_with_update(
            [ahead.pk, due.pk],
            "worker-a",
            now,
            now + timedelta(seconds=5),
            registry.names(),
            leases,
            LEASE,
        )
    else:
        claimed = claim_as(
            "worker-a", [ahead.pk, due.pk], now=now, leases=leases, ahead=timedelta(seconds=5)
        )
    stored = {job.pk: job.lease_expires_at for job in DelayedJob.objects.all()}
    assert {job.pk: job.lease_expires_at for job in claimed} == stored
    assert stored[ahead.pk] == ahead.run_at + timedelta(seconds=2)
    assert stored[due.pk] == now + timedelta(seconds=2)  # due already: from the claim


def test_a_reaped_run_claimed_ahead_is_dated_from_its_run_at_never_earlier():
    # Claimed ahead of its run_at, its consumer died before starting it: had it started,
    # it would have started at run_at, so its lateness is not negative.
    run_at = timezone.now() + timedelta(seconds=2)
    job = due_job(run_at=run_at)
    [claimed] = claim_as("worker-a", [job.pk], ahead=timedelta(seconds=5))
    assert claimed.claimed_at < run_at
    reap_expired_leases(claimed.lease_expires_at + timedelta(seconds=1))
    [attempt] = JobAttempt.objects.filter(job=job)
    assert attempt.started_at == run_at
    assert attempt.lateness == timedelta(0)


def test_reap_leaves_a_lease_that_has_not_expired():
    job = due_job()
    [claimed] = claim_as("worker-a", [job.pk])
    assert reap_expired_leases(claimed.lease_expires_at - timedelta(seconds=1)) == []
    assert reap_expired_leases(claimed.lease_expires_at) == []  # strictly after expiry
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert JobAttempt.objects.count() == 0


def test_reap_marks_the_job_failed_when_its_attempts_are_exhausted():
    job = due_job(max_attempts=1)
    [claimed] = claim_as("worker-a", [job.pk])
    now = claimed.lease_expires_at + timedelta(seconds=1)
    assert reap_expired_leases(now) == []
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.finished_at == now
    assert "Lease expired" in job.last_error
    [attempt] = JobAttempt.objects.filter(job=job)
    assert attempt.outcome == AttemptOutcome.LEASE_EXPIRED


def test_reap_never_exhausts_a_job_that_retries_forever():
    job = due_job(max_attempts=None)
    DelayedJob.objects.filter(pk=job.pk).update(max_attempts=None, attempts=50)
    [claimed] = claim_as("worker-a", [job.pk])
    assert claimed.attempts == 51
    assert reap_expired_leases(claimed.lease_expires_at + timedelta(seconds=1))
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SCHEDULED


def test_reap_respects_its_limit():
    jobs = [due_job() for _ in range(3)]
    claimed = claim_as("worker-a", [job.pk for job in jobs])
    later = max(job.lease_expires_at for job in claimed) + timedelta(seconds=1)
    assert len(reap_expired_leases(later, limit=2)) == 2
    assert len(reap_expired_leases(later, limit=2)) == 1


# renew_leases() ----------------------------------------------------------------------


def test_renew_leases_extends_the_lease_of_this_workers_running_jobs():
    job = due_job()
    [claimed] = claim_as("worker-a", [job.pk])
    before = clock.now()  # leases are on the database's clock
    renewed = transitions.renew_leases({timedelta(hours=1): [job.pk]}, worker_id="worker-a")
    assert renewed == 1
    job.refresh_from_db()
    assert job.lease_expires_at >= before + timedelta(hours=1)
    assert job.lease_expires_at > claimed.lease_expires_at


@pytest.mark.django_db(transaction=True)
def test_renew_leases_skips_a_row_another_transaction_holds_instead_of_waiting():
    """The recorder's transaction may hold a row the heartbeat renews: waiting for it could
    deadlock (the recorder locks its rows in another order), and renewing it gains nothing."""
    held, free = due_job(), due_job()
    claim_as("worker-a", [held.pk, free.pk])
    if not connection.features.has_select_for_update_skip_locked:
        assert connection.vendor == "sqlite"
        pytest.skip("SQLite locks the whole database for writes: there is no row lock to skip")
    before = {job.pk: job.lease_expires_at for job in DelayedJob.objects.all()}
    with row_locked(DelayedJob, held.pk):
        renewed = transitions.renew_leases(
            {timedelta(hours=1): [held.pk, free.pk]}, worker_id="worker-a"
        )
    assert renewed == 1
    after = {job.pk: job.lease_expires_at for job in DelayedJob.objects.all()}
    assert after[held.pk] == before[held.pk]
    assert after[free.pk] > before[free.pk]


def test_renew_leases_ignores_other_workers_and_finished_jobs():
    mine, finished = due_job(), due_job()
    claimed = {job.pk: job for job in claim_as("worker-a", [mine.pk, finished.pk])}
    record_outcomes([outcome(claimed[finished.pk], "worker-a")])
    assert transitions.renew_leases({timedelta(hours=1): [mine.pk]}, worker_id="worker-b") == 0
    assert transitions.renew_leases({timedelta(hours=1): [finished.pk]}, worker_id="worker-a") == 0
    mine.refresh_from_db()
    assert mine.lease_expires_at == claimed[mine.pk].lease_expires_at
    assert DelayedJob.objects.get(pk=finished.pk).lease_expires_at is None


def test_renewed_lease_is_not_reaped():
    job = due_job()
    [claimed] = claim_as("worker-a", [job.pk])
    transitions.renew_leases({timedelta(hours=1): [job.pk]}, worker_id="worker-a")
    assert reap_expired_leases(claimed.lease_expires_at + timedelta(seconds=1)) == []
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.RUNNING


# move() and cancel() -----------------------------------------------------------------


def test_move_refuses_a_job_that_is_no_longer_scheduled():
    job = due_job()
    claim_as("worker-a", [job.pk])
    with pytest.raises(delayjobs.InvalidTransition):
        transitions.move(job, run_at=timezone.now())
    assert job.status == JobStatus.RUNNING  # refreshed from the row


def test_cancel_returns_only_the_jobs_it_cancelled():
    scheduled, running = due_job(), due_job()
    claim_as("worker-a", [running.pk])
    cancelled = transitions.cancel(DelayedJob.objects.all())
    assert [pk for pk, _queue, _score in cancelled] == [scheduled.pk]
    assert DelayedJob.objects.get(pk=running.pk).status == JobStatus.RUNNING


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_give_every_job_to_exactly_one_worker():
    import threading

    from django.db import connections

    ids = [job.pk for job in delayjobs.schedule_many([{"job_type": "tests.scripted"}] * 200)]
    workers = 4
    barrier = threading.Barrier(workers)
    won: dict[str, list[int]] = {}

    def worker(name: str) -> None:
        try:
            barrier.wait()
            # Each worker tries every id, in its own order, in batches.
            order = ids[::-1] if name.endswith(("1", "3")) else ids
            mine = []
            for start in range(0, len(order), 25):
                mine += [job.pk for job in claim_as(name, order[start : start + 25])]
            won[name] = mine
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(f"w{n}",)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    claimed = [pk for mine in won.values() for pk in mine]
    assert len(won) == workers
    assert sorted(claimed) == sorted(ids)  # every job once, none twice
    rows = DelayedJob.objects.filter(pk__in=ids)
    assert set(rows.values_list("attempts", flat=True)) == {1}
    for name, mine in won.items():
        assert set(rows.filter(worker_id=name).values_list("pk", flat=True)) == set(mine)
