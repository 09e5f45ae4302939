"""The admin at scale, on a real database: no COUNT(*) of the whole job table on a page
load (the planner's estimate past a threshold, lowered here), searches and filters that
still find their rows, the exact count kept on SQLite and on small lists, the dashboard's
estimates said as such, and the job page's history bounded. Timings are the benchmark's
(benchmarks/admin_scale.py), never asserted here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from delayjobs.admin import estimates
from delayjobs.admin import jobs as job_admin
from delayjobs.admin.estimates import EstimatedCountPaginator
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from tests.integration.test_admin import changelist_url, listed, make_job

pytestmark = pytest.mark.django_db

TABLE = DelayedJob._meta.db_table
#: A COUNT over the job table with no WHERE: what a page load must never run.
WHOLE_TABLE_COUNT = re.compile(
    rf'COUNT\([^)]*\)[^;]*FROM "{TABLE}"(?![^;]*\b(?:WHERE|TABLESAMPLE)\b)', re.I
)
postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="planner estimates are PostgreSQL's"
)


@pytest.fixture
def low_threshold(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The job admin estimates any list of more than one row."""
    monkeypatch.setattr(admin.site._registry[DelayedJob], "estimate_above", 1)
    yield 1


def some_jobs(n: int = 20) -> list[DelayedJob]:
    jobs = [make_job(key=f"scale:{i}") for i in range(n)]
    analyze()
    return jobs


def analyze() -> None:
    """The planner's figures, as autovacuum keeps them on a live table."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f'ANALYZE "{TABLE}"')


def whole_table_counts(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if WHOLE_TABLE_COUNT.search(q["sql"])]


@postgres_only
def test_a_large_list_shows_the_planner_estimate_and_counts_no_whole_table(
    admin_client: Any, low_threshold: int
) -> None:
    jobs = some_jobs()
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(changelist_url())
    assert listed(response) == sorted(job.pk for job in jobs)
    cl = response.context["cl"]
    assert isinstance(cl.paginator, EstimatedCountPaginator)
    assert cl.paginator.estimated
    assert cl.result_count == estimates.planned_rows(DelayedJob.objects.all())
    assert whole_table_counts(captured) == []
    assert not any(re.search(r"\bCOUNT\(", q["sql"]) for q in captured.captured_queries)


@postgres_only
def test_a_small_list_is_counted_exactly_on_postgresql(admin_client: Any) -> None:
    jobs = some_jobs(3)
    response = admin_client.get(changelist_url())
    cl = response.context["cl"]
    assert not cl.paginator.estimated
    assert cl.result_count == len(jobs)


def test_the_count_is_exact_on_sqlite(admin_client: Any, low_threshold: int) -> None:
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's behaviour")
    some_jobs(5)
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(changelist_url())
    cl = response.context["cl"]
    assert not cl.paginator.estimated
    assert cl.result_count == 5
    assert any("COUNT(" in q["sql"] for q in captured.captured_queries)


def test_each_status_filter_lists_its_jobs(admin_client: Any, low_threshold: int) -> None:
    by_status = {status: make_job(status) for status in JobStatus.values}
    some_jobs(5)  # scheduled too
    for status, job in by_status.items():
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(changelist_url(status__exact=status))
        expected = sorted(DelayedJob.objects.filter(status=status).values_list("pk", flat=True))
        assert job.pk in expected
        assert listed(response) == expected, status
        assert whole_table_counts(captured) == []


def test_search_by_key_and_key_prefix_find_the_row(admin_client: Any, low_threshold: int) -> None:
    jobs = some_jobs()
    assert listed(admin_client.get(changelist_url(q="scale:7"))) == [jobs[7].pk]
    assert listed(admin_client.get(changelist_url(q="scale:1*"))) == sorted(
        job.pk for job in jobs if job.key and job.key.startswith("scale:1")
    )
    assert listed(admin_client.get(changelist_url(q=str(jobs[3].pk)))) == [jobs[3].pk]


def test_job_type_and_queue_filters_offer_each_value_once(admin_client: Any) -> None:
    make_job(job_type="tests.noop")
    make_job()
    make_job()
    response = admin_client.get(changelist_url())
    specs = {str(spec.title): spec for spec in response.context["cl"].filter_specs}
    assert list(specs["job type"].lookup_choices) == ["tests.noop", "tests.scripted"]
    queues = sorted(set(DelayedJob.objects.values_list("queue", flat=True)))
    assert len(queues) == 2
    assert list(specs["queue"].lookup_choices) == queues


def test_the_job_page_shows_only_the_latest_attempts(
    admin_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_admin, "HISTORY_LIMIT", 3)
    job = make_job(JobStatus.FAILED)
    started = timezone.now() - timedelta(hours=1)
    for number in range(1, 6):
        JobAttempt.objects.create(
            job=job,
            number=number,
            started_at=started + timedelta(minutes=number),
            finished_at=started + timedelta(minutes=number, seconds=1),
            outcome=AttemptOutcome.RETRYING,
            lateness=timedelta(0),
        )
    response = admin_client.get(reverse("admin:delayjobs_delayedjob_change", args=[job.pk]))
    (formset,) = (inline.formset for inline in response.context["inline_admin_formsets"])
    assert [form.instance.number for form in formset.forms] == [5, 4, 3]


@postgres_only
def test_the_dashboard_estimates_large_statuses_and_says_so(
    admin_client: Any, settings: Any
) -> None:
    settings.DELAYJOBS = {**settings.DELAYJOBS, "ADMIN_ESTIMATE_ABOVE": 2}
    some_jobs(10)
    make_job(JobStatus.FAILED)
    analyze()
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(reverse("admin:delayjobs_delayedjob_dashboard"))
    assert response.status_code == 200
    figures = response.context["figures"]
    assert JobStatus.SCHEDULED in figures.estimated
    assert JobStatus.FAILED not in figures.estimated  # small: counted exactly
    assert figures.by_status[JobStatus.FAILED] == 1
    statuses = dict(response.context["statuses"])
    assert str(statuses[JobStatus.SCHEDULED.label]).startswith("≈")
    assert "≈" in response.content.decode()
    grouped = [q["sql"] for q in captured.captured_queries if "GROUP BY" in q["sql"]]
    assert all("TABLESAMPLE" in sql or "WHERE" in sql for sql in grouped)
    assert whole_table_counts(captured) == []


def test_the_dashboard_counts_exactly_below_the_threshold(admin_client: Any) -> None:
    some_jobs(4)
    response = admin_client.get(reverse("admin:delayjobs_delayedjob_dashboard"))
    figures = response.context["figures"]
    assert figures.estimated == ()
    assert figures.by_status[JobStatus.SCHEDULED] == 4
