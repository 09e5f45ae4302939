"""How an execution can end besides success and failure: ``skipped`` (``should_run`` said
no), ``expired`` (past ``max_lateness``), and what ``execute`` returned (``job.result``).

The consumer tests run a real ``run_delay_consumer --burst`` subprocess; the ledger of
executions is ``tests.models.Execution``, written by the job itself.
"""

from __future__ import annotations

import io
import json
import signal
import threading
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import delayjobs
from delayjobs import signals, transitions
from delayjobs.api import stats
from delayjobs.engine.execution import run_claimed, signal_outcome
from delayjobs.jobtypes import registry, validate_job_type_class
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from tests.conftest import ConsumerFactory
from tests.consumers import wait_final
from tests.models import Execution

CONDITIONAL = "tests.conditional"
EXPIRING = "tests.expiring"


def run_burst(consumer_process: ConsumerFactory) -> None:
    """Run a consumer until every job has ended (retries included), then stop it."""
    consumer = consumer_process("--concurrency", "4")
    wait_final(list(DelayedJob.objects.values_list("pk", flat=True)), [consumer])
    consumer.send_signal(signal.SIGTERM)
    assert consumer.wait(timeout=60) == 0, consumer.output()


def attempts_of(job: DelayedJob) -> list[tuple[int, str]]:
    return list(
        JobAttempt.objects.filter(job=job).order_by("number").values_list("number", "outcome")
    )


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
class TestEndsInAConsumer:
    def test_should_run_false_skips_without_executing(
        self, consumer_process: ConsumerFactory
    ) -> None:
        skipped = delayjobs.schedule(CONDITIONAL, {"run": False})
        runs = delayjobs.schedule(CONDITIONAL, {"run": True})

        run_burst(consumer_process)

        skipped.refresh_from_db()
        assert skipped.status == JobStatus.SKIPPED
        assert skipped.finished_at is not None and skipped.lease_expires_at is None
        assert attempts_of(skipped) == [(1, AttemptOutcome.SKIPPED)]
        assert not Execution.objects.filter(job_id=skipped.pk).exists()
        runs.refresh_from_db()
        assert runs.status == JobStatus.SUCCEEDED
        assert Execution.objects.filter(job_id=runs.pk).count() == 1

    def test_should_run_raising_fails_the_attempt_like_execute(
        self, consumer_process: ConsumerFactory
    ) -> None:
        job = delayjobs.schedule(CONDITIONAL, {"should_run_raises": True})

        run_burst(consumer_process)

        job.refresh_from_db()
        assert job.status == JobStatus.FAILED  # max_attempts = 2, both raised
        assert attempts_of(job) == [(1, AttemptOutcome.RETRYING), (2, AttemptOutcome.FAILED)]
        assert "RuntimeError: should_run exploded" in job.last_error
        assert not Execution.objects.filter(job_id=job.pk).exists()

    def test_a_job_past_its_types_max_lateness_expires_unrun(
        self, consumer_process: ConsumerFactory
    ) -> None:
        late = delayjobs.schedule(EXPIRING, run_at=timezone.now() - timedelta(minutes=2))
        on_time = delayjobs.schedule(EXPIRING)

        run_burst(consumer_process)

        late.refresh_from_db()
        assert late.status == JobStatus.EXPIRED
        assert not Execution.objects.filter(job_id=late.pk).exists()
        (attempt,) = JobAttempt.objects.filter(job=late)
        assert attempt.outcome == AttemptOutcome.EXPIRED
        assert attempt.lateness > timedelta(minutes=1)
        on_time.refresh_from_db()
        assert on_time.status == JobStatus.SUCCEEDED

    def test_a_jobs_own_max_lateness_overrides_its_types(
        self, consumer_process: ConsumerFactory
    ) -> None:
        two_minutes_ago = timezone.now() - timedelta(minutes=2)
        stricter = delayjobs.schedule(
            CONDITIONAL, run_at=two_minutes_ago, max_lateness=timedelta(minutes=1)
        )
        laxer = delayjobs.schedule(
            EXPIRING, run_at=two_minutes_ago, max_lateness=timedelta(hours=1)
        )

        run_burst(consumer_process)

        stricter.refresh_from_db()
        laxer.refresh_from_db()
        assert stricter.status == JobStatus.EXPIRED
        assert laxer.status == JobStatus.SUCCEEDED
        assert list(Execution.objects.values_list("job_id", flat=True)) == [laxer.pk]

    def test_what_execute_returns_is_stored_as_the_result(
        self, consumer_process: ConsumerFactory
    ) -> None:
        value = {"sent": 3, "to": ["grace", "alan"], "note": "é"}
        returns = delayjobs.schedule(CONDITIONAL, {"returns": value})
        returns_nothing = delayjobs.schedule(CONDITIONAL)
        unstorable = delayjobs.schedule(CONDITIONAL, {"unstorable": True})

        run_burst(consumer_process)

        returns.refresh_from_db()
        assert (returns.status, returns.result) == (JobStatus.SUCCEEDED, value)
        returns_nothing.refresh_from_db()
        assert (returns_nothing.status, returns_nothing.result) == (JobStatus.SUCCEEDED, None)
        # A value that cannot be stored fails the attempt, saying why, rather than vanishing.
        unstorable.refresh_from_db()
        # It failed for good after one execution: its side effects happened, and running
        # it again would repeat them.
        assert unstorable.status == JobStatus.FAILED
        assert unstorable.result is None
        assert "UnstorableResult" in unstorable.last_error
        assert "JSON-serializable" in unstorable.last_error
        assert Execution.objects.filter(job_id=unstorable.pk).count() == 1

        # retry() starts afresh: the previous run's result goes.
        transitions.retry(returns)
        returns.refresh_from_db()
        assert (returns.status, returns.result) == (JobStatus.SCHEDULED, None)


@pytest.mark.django_db
class TestShownAndCounted:
    @pytest.fixture
    def ended(self) -> dict[str, DelayedJob]:
        now = timezone.now()
        jobs = {}
        for status in (JobStatus.SKIPPED, JobStatus.EXPIRED, JobStatus.SUCCEEDED):
            job = delayjobs.schedule(CONDITIONAL, {"status": status})
            DelayedJob.objects.filter(pk=job.pk).update(
                status=status, attempts=1, started_at=now, finished_at=now
            )
            jobs[status] = job
        return jobs

    def test_admin_status_filter_offers_and_applies_both(
        self, admin_client: Client, ended: dict[str, DelayedJob]
    ) -> None:
        url = reverse("admin:delayjobs_delayedjob_changelist")
        page = admin_client.get(url).content.decode()
        assert "?status__exact=skipped" in page
        assert "?status__exact=expired" in page
        for status in (JobStatus.SKIPPED, JobStatus.EXPIRED):
            response = admin_client.get(url, {"status__exact": status})
            assert list(response.context["cl"].result_list) == [ended[status]]

    def test_statistics_and_status_command_count_both(self, ended: dict[str, DelayedJob]) -> None:
        figures = stats.collect()
        assert figures.by_status[JobStatus.SKIPPED] == 1
        assert figures.by_status[JobStatus.EXPIRED] == 1
        assert figures.by_job_type[CONDITIONAL][JobStatus.SKIPPED] == 1

        out = io.StringIO()
        call_command("delayjobs_status", "--json", stdout=out)
        reported = json.loads(out.getvalue())
        assert reported["by_status"]["skipped"] == 1
        assert reported["by_status"]["expired"] == 1

    def test_skipped_and_expired_jobs_can_be_retried(self, ended: dict[str, DelayedJob]) -> None:
        for status in (JobStatus.SKIPPED, JobStatus.EXPIRED):
            job = delayjobs.retry(ended[status])
            assert job.status == JobStatus.SCHEDULED


@pytest.mark.django_db
class TestArguments:
    def test_max_lateness_and_priority_are_stored(self) -> None:
        job = delayjobs.schedule(CONDITIONAL, max_lateness=timedelta(seconds=30), priority=7)
        job.refresh_from_db()
        assert (job.max_lateness, job.priority) == (timedelta(seconds=30), 7)
        default = delayjobs.schedule(EXPIRING)
        default.refresh_from_db()
        # None: the job type's limit applies when it runs, so changing it applies to all.
        assert (default.max_lateness, default.priority) == (None, 0)

    def test_replace_moves_max_lateness_and_priority_too(self) -> None:
        delayjobs.schedule(CONDITIONAL, key="k", priority=5, max_lateness=timedelta(minutes=5))
        job = delayjobs.schedule(CONDITIONAL, key="k", replace=True)
        job.refresh_from_db()
        assert (job.max_lateness, job.priority) == (None, 0)

    def test_schedule_many_takes_them(self) -> None:
        (job,) = delayjobs.schedule_many(
            [{"job_type": CONDITIONAL, "priority": -3, "max_lateness": timedelta(minutes=2)}]
        )
        job.refresh_from_db()
        assert (job.priority, job.max_lateness) == (-3, timedelta(minutes=2))

    @pytest.mark.parametrize(
        ("arguments", "message"),
        [
            ({"max_lateness": timedelta(0)}, "max_lateness must be a timedelta"),
            ({"max_lateness": timedelta(seconds=-5)}, "max_lateness must be a timedelta"),
            ({"max_lateness": 60}, "max_lateness must be a timedelta"),
            ({"max_lateness": timedelta(days=400)}, "max_lateness must be a timedelta"),
            ({"priority": 101}, "priority must be an int from -100 to 100"),
            ({"priority": -101}, "priority must be an int from -100 to 100"),
            ({"priority": True}, "priority must be an int from -100 to 100"),
            ({"priority": 1.5}, "priority must be an int from -100 to 100"),
            ({"priority": None}, "priority must be an int from -100 to 100"),
        ],
    )
    def test_bad_values_are_refused_and_nothing_is_stored(
        self, arguments: dict[str, object], message: str
    ) -> None:
        with pytest.raises(delayjobs.InvalidJob, match=message):
            delayjobs.schedule(CONDITIONAL, **arguments)
        with pytest.raises(delayjobs.InvalidJob, match=message):
            delayjobs.schedule_many([{"job_type": CONDITIONAL, **arguments}])
        assert not DelayedJob.objects.exists()

    @pytest.mark.parametrize(
        "value", [timedelta(0), timedelta(seconds=-1), 60, "1m", timedelta.max]
    )
    def test_a_job_types_bad_max_lateness_is_refused_at_declaration(self, value: object) -> None:
        bad = type("Bad", (registry.get(CONDITIONAL).__class__,), {"max_lateness": value})
        with pytest.raises(
            ImproperlyConfigured, match=r"max_lateness must be a timedelta from 1 ms to 366 days"
        ):
            validate_job_type_class(bad)


@pytest.mark.django_db
def test_the_database_claim_takes_higher_priority_first() -> None:
    past = timezone.now() - timedelta(seconds=5)
    low = delayjobs.schedule(CONDITIONAL, run_at=past - timedelta(seconds=1), priority=-5)
    high = delayjobs.schedule(CONDITIONAL, run_at=past, priority=50)
    normal = delayjobs.schedule(CONDITIONAL, run_at=past - timedelta(seconds=2))

    claimed = transitions.claim_due(
        queues=["default"],
        job_types=registry.names(),
        limit=3,
        choose=lambda candidates: candidates[:2],  # room for two of the three
        worker_id="worker-a",
        now=timezone.now(),
        leases={},
        default_lease=timedelta(minutes=1),
    )
    # All three are due and read (in due order, by the index): priority decides which
    # two get the room, and due order within the same priority.
    assert sorted(job.pk for job in claimed) == sorted([high.pk, normal.pk])
    assert DelayedJob.objects.get(pk=low.pk).status == JobStatus.SCHEDULED


@pytest.mark.django_db(transaction=True)  # run_claimed closes old connections, as per job
def test_skipped_and_expired_send_their_own_signals() -> None:
    received: list[tuple[str, int, dict[str, object]]] = []

    def receiver(name: str):
        def receive(sender: object, job: DelayedJob, **kwargs: object) -> None:
            received.append((name, job.pk, kwargs))

        return receive

    skipped_receiver, expired_receiver, started_receiver = (
        receiver("skipped"),
        receiver("expired"),
        receiver("started"),
    )
    signals.job_skipped.connect(skipped_receiver, sender=DelayedJob)
    signals.job_expired.connect(expired_receiver, sender=DelayedJob)
    signals.job_started.connect(started_receiver, sender=DelayedJob)
    try:
        skipped = delayjobs.schedule(CONDITIONAL, {"run": False})
        expired = delayjobs.schedule(EXPIRING, run_at=timezone.now() - timedelta(minutes=5))
        for job in (skipped, expired):
            (row,) = transitions.claim(
                [job.pk],
                worker_id="w",
                now=timezone.now(),
                job_types=registry.names(),
                leases={},
                default_lease=timedelta(minutes=1),
            )
            signal_outcome(run_claimed(row, "w"))
    finally:
        signals.job_skipped.disconnect(skipped_receiver, sender=DelayedJob)
        signals.job_expired.disconnect(expired_receiver, sender=DelayedJob)
        signals.job_started.disconnect(started_receiver, sender=DelayedJob)

    # Neither started: should_run and max_lateness are asked before job_started.
    assert [(name, pk) for name, pk, _ in received] == [
        ("skipped", skipped.pk),
        ("expired", expired.pk),
    ]
    lateness = received[1][2]["lateness"]
    assert isinstance(lateness, timedelta) and lateness > timedelta(minutes=5)


@pytest.mark.django_db(transaction=True)  # the job's thread must see the committed rows
def test_a_job_gets_request_semantics_for_the_connections_of_its_thread() -> None:
    """Around each job, run_claimed closes what CONN_MAX_AGE says is old, in the thread
    that runs it: with the default of 0, the connection a job opened is closed once it
    returns. A thread whose jobs never touch the database has none to close."""
    from django.db import connections

    assert connections["default"].settings_dict["CONN_MAX_AGE"] == 0
    uses_the_database = delayjobs.schedule("tests.scripted")
    leaves_it_alone = delayjobs.schedule("tests.noop")
    rows = transitions.claim(
        [uses_the_database.pk, leaves_it_alone.pk],
        worker_id="w",
        now=timezone.now(),
        job_types=registry.names(),
        leases={},
        default_lease=timedelta(minutes=1),
    )
    seen: dict[str, object] = {}

    def run(row: DelayedJob) -> None:
        outcome = run_claimed(row, "w")
        seen[row.job_type] = (
            outcome.succeeded,
            [alias for alias in connections if connections[alias].connection is not None],
        )
        connections.close_all()

    for row in rows:
        thread = threading.Thread(target=run, args=(row,))
        thread.start()
        thread.join()
    assert seen == {"tests.scripted": (True, []), "tests.noop": (True, [])}
    assert Execution.objects.filter(job_id=uses_the_database.pk).count() == 1
