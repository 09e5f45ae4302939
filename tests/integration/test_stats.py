"""The operational figures (delayjobs.api.stats) on known data, and the admin dashboard."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone

from delayjobs import pauses
from delayjobs.api import stats
from delayjobs.models import AttemptOutcome, Consumer, DelayedJob, JobAttempt, JobStatus

pytestmark = pytest.mark.django_db

DASHBOARD = "admin:delayjobs_delayedjob_dashboard"


def make_job(
    status: str = JobStatus.SCHEDULED,
    *,
    run_at: datetime,
    job_type: str = "tests.scripted",
    queue: str = "default",
    **fields: Any,
) -> DelayedJob:
    return DelayedJob.objects.create(
        job_type=job_type, queue=queue, status=status, run_at=run_at, **fields
    )


def attempt(
    job: DelayedJob,
    outcome: str,
    *,
    started_at: datetime,
    lateness: timedelta = timedelta(0),
    error: str = "",
) -> JobAttempt:
    return JobAttempt.objects.create(
        job=job,
        number=JobAttempt.objects.filter(job=job).count() + 1,
        worker_id="w-live",
        started_at=started_at,
        finished_at=started_at + timedelta(milliseconds=5),
        outcome=outcome,
        lateness=lateness,
        error=error,
    )


def consumer(worker_id: str, last_seen: datetime, **fields: Any) -> Consumer:
    return Consumer.objects.create(
        worker_id=worker_id,
        hostname="host-a",
        pid=1234,
        queues=["default"],
        concurrency=4,
        last_seen=last_seen,
        **fields,
    )


@dataclass
class Known:
    """The data every figure is checked against, built around one moment ``now``."""

    now: datetime
    overdue: DelayedJob
    due_minutes: dict[int, int]  # minute index -> jobs due in it (not paused)
    running_live: list[DelayedJob]
    running_dead: DelayedJob
    latest_failure: DelayedJob


def build_known(now: datetime) -> Known:
    minute0 = now.replace(second=0, microsecond=0)
    overdue = make_job(run_at=now - timedelta(minutes=10))
    # Older, but in a paused queue: waiting on purpose, so not "overdue".
    make_job(run_at=now - timedelta(minutes=20), queue="paused-q")
    pauses.pause(queue="paused-q", by="test")
    due_minutes = {1: 2, 5: 1, 59: 3}
    for index, count in due_minutes.items():
        for second in range(count):
            make_job(run_at=minute0 + timedelta(minutes=index, seconds=second * 20))
    make_job(run_at=minute0 + timedelta(minutes=60))  # just past the hour
    make_job(run_at=minute0 + timedelta(minutes=2), queue="paused-q")  # paused
    make_job(run_at=minute0 + timedelta(minutes=3), job_type="tests.noop", queue="other")

    running_live = [
        make_job(
            JobStatus.RUNNING,
            run_at=now - timedelta(minutes=1),
            worker_id="w-live",
            claimed_at=now - timedelta(seconds=30 - n),
        )
        for n in range(2)
    ]
    running_dead = make_job(
        JobStatus.RUNNING, run_at=now - timedelta(minutes=9), worker_id="w-dead", claimed_at=now
    )
    consumer("w-live", now - timedelta(seconds=10), processed=42)
    consumer("w-idle", now - stats.LIVE_WITHIN + timedelta(seconds=1), database_mode=True)
    consumer("w-dead", now - stats.LIVE_WITHIN - timedelta(seconds=1))

    done = make_job(JobStatus.SUCCEEDED, run_at=now - timedelta(hours=3), finished_at=now)
    make_job(JobStatus.SUCCEEDED, run_at=now - timedelta(hours=3), job_type="tests.noop")
    # Lateness 1..100 ms, shuffled by start time: 50, 95 and 99 ms are the percentiles.
    for ms in range(1, 101):
        attempt(
            done,
            AttemptOutcome.SUCCEEDED,
            started_at=now - timedelta(minutes=30, seconds=(ms * 37) % 101),
            lateness=timedelta(milliseconds=ms),
        )
    # Outside the hour: not in the lateness figures.
    attempt(
        done,
        AttemptOutcome.SUCCEEDED,
        started_at=now - timedelta(hours=2),
        lateness=timedelta(seconds=10),
    )

    failed = make_job(JobStatus.FAILED, run_at=now - timedelta(hours=3), finished_at=now)
    make_job(JobStatus.CANCELLED, run_at=now - timedelta(hours=3), finished_at=now)
    attempt(failed, AttemptOutcome.FAILED, started_at=now - timedelta(hours=25), error="too old")
    for minutes, outcome in (
        (120, AttemptOutcome.RETRYING),
        (90, AttemptOutcome.TIMED_OUT),
        (80, AttemptOutcome.LEASE_EXPIRED),
        (70, AttemptOutcome.FAILED),
    ):
        attempt(
            failed,
            outcome,
            started_at=now - timedelta(minutes=minutes),
            error=f"Boom {outcome}\n" + "x" * 1000,
        )
    return Known(now, overdue, due_minutes, running_live, running_dead, latest_failure=failed)


@pytest.fixture
def pinned(monkeypatch) -> datetime:
    """A moment that the dashboard and the commands take as "now".

    The known data is laid out around it; were the page to read the clock itself, a
    minute starting between the two would shift every bar of the chart.
    """
    now = timezone.now()
    collect = stats.collect
    monkeypatch.setattr(stats, "collect", lambda at=None, **kwargs: collect(at or now, **kwargs))
    return now


def test_figures_on_known_data():
    now = timezone.now()
    known = build_known(now)

    figures = stats.collect(now)

    none = {"skipped": 0, "expired": 0}
    assert figures.by_status == {
        "scheduled": 11,
        "running": 3,
        "succeeded": 2,
        "failed": 1,
        "cancelled": 1,
        **none,
    }
    assert figures.by_job_type == {
        "tests.noop": {
            "scheduled": 1,
            "running": 0,
            "succeeded": 1,
            "failed": 0,
            "cancelled": 0,
            **none,
        },
        "tests.scripted": {
            "scheduled": 10,
            "running": 3,
            "succeeded": 1,
            "failed": 1,
            "cancelled": 1,
            **none,
        },
    }
    assert [(p.kind, p.name, p.paused_by) for p in figures.pauses] == [
        ("queue", "paused-q", "test")
    ]
    assert figures.paused.queues == {"paused-q"}

    overdue = figures.oldest_overdue
    assert overdue is not None
    assert (overdue.id, overdue.late) == (known.overdue.pk, timedelta(minutes=10))

    assert len(figures.due_per_minute) == stats.DUE_MINUTES == 60
    expected = [0] * 60
    for index, count in known.due_minutes.items():
        expected[index] = count
    expected[3] = 1  # the tests.noop job in queue "other"
    assert figures.due_per_minute == expected
    assert figures.due_from == now.replace(second=0, microsecond=0)

    assert figures.failures == 4
    assert figures.failures_by_outcome == {
        "failed": 1,
        "retrying": 1,
        "timed_out": 1,
        "lease_expired": 1,
    }
    latest = figures.latest_failures
    assert [f.outcome for f in latest] == ["failed", "lease_expired", "timed_out", "retrying"]
    assert {f.job_id for f in latest} == {known.latest_failure.pk}
    assert latest[0].error.startswith("Boom failed\nxxx")
    assert len(latest[0].error) == stats.ERROR_CHARS

    lateness = figures.lateness
    assert (lateness.count, lateness.sampled) == (100, False)
    assert (lateness.p50, lateness.p95, lateness.p99, lateness.max) == tuple(
        timedelta(milliseconds=ms) for ms in (50, 95, 99, 100)
    )

    assert [c.worker_id for c in figures.consumers] == ["w-idle", "w-live"]
    idle, live = figures.consumers
    assert (idle.running, idle.database_mode) == ([], True)
    assert [job.id for job in live.running] == [job.pk for job in known.running_live]
    assert live.processed == 42
    assert [job.id for job in figures.running_elsewhere] == [known.running_dead.pk]


def test_as_dict_is_json_with_every_figure():
    now = timezone.now()
    known = build_known(now)

    data = json.loads(json.dumps(stats.collect(now).as_dict()))

    assert data["by_status"]["scheduled"] == 11
    assert data["oldest_overdue"]["id"] == known.overdue.pk
    assert data["oldest_overdue"]["late"] == 600.0
    assert datetime.fromisoformat(data["oldest_overdue"]["run_at"]) == known.overdue.run_at
    assert data["due_next_hour"] == sum(data["due_per_minute"]) == 7
    assert data["paused_queues"] == ["paused-q"]
    assert data["paused_job_types"] == []
    assert data["lateness"]["p99"] == 0.099
    assert data["consumers"][1]["running"][0]["id"] == known.running_live[0].pk
    assert data["failures"] == 4


def test_empty_database_gives_empty_figures():
    figures = stats.collect()
    assert set(figures.by_status.values()) == {0}
    assert figures.by_job_type == {}
    assert figures.oldest_overdue is None
    assert figures.due_per_minute == [0] * 60
    assert figures.failures == 0
    assert figures.latest_failures == []
    assert figures.lateness == stats.Lateness(0, False, None, None, None, None)
    assert figures.consumers == figures.running_elsewhere == []


def test_query_count_is_the_same_for_no_data_and_much(django_assert_num_queries):
    with django_assert_num_queries(stats.QUERIES):
        stats.collect()
    now = timezone.now()
    build_known(now)
    # More job types, consumers and running jobs: still the same queries.
    for n in range(5):
        consumer(f"w-more-{n}", now)
        make_job(JobStatus.RUNNING, run_at=now, worker_id=f"w-more-{n}", job_type=f"type-{n}")
    with django_assert_num_queries(stats.QUERIES):
        stats.collect(now)


def test_lateness_uses_the_latest_sample_when_the_hour_had_more(monkeypatch):
    # A smaller sample stands in for a busy hour: the 3 latest of 5 attempts count.
    monkeypatch.setattr(stats, "LATENESS_SAMPLE", 3)
    now = timezone.now()
    job = make_job(JobStatus.SUCCEEDED, run_at=now)
    for n in range(5):
        attempt(
            job,
            AttemptOutcome.SUCCEEDED,
            started_at=now - timedelta(minutes=n),
            lateness=timedelta(seconds=n),
        )

    lateness = stats.collect(now).lateness

    assert (lateness.count, lateness.sampled) == (3, True)
    assert lateness.max == timedelta(seconds=2)


@pytest.mark.parametrize(
    ("values", "percent", "expected"),
    [([], 50, None), ([7], 99, 7), ([1, 2, 3, 4], 50, 2), ([1, 2, 3, 4], 51, 3), ([1, 2], 100, 2)],
)
def test_percentile_is_nearest_rank(values, percent, expected):
    ordered = [timedelta(seconds=v) for v in values]
    result = stats.percentile(ordered, percent)
    assert result == (None if expected is None else timedelta(seconds=expected))


# The dashboard ----------------------------------------------------------------------------


@pytest.fixture
def dashboard_url() -> str:
    return reverse(DASHBOARD)


def staff(client, *codenames: str):
    user = User.objects.create_user("staff", password="x", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="delayjobs", codename=codename)
        )
    client.force_login(user)
    return client


BAR = re.compile(r'<rect class="bar" data-minute="([^"]+)" data-count="(\d+)"')


def test_dashboard_shows_the_figures_and_a_bar_per_busy_minute(client, dashboard_url, pinned):
    known = build_known(pinned)

    response = staff(client, "view_delayedjob").get(dashboard_url)

    assert response.status_code == 200
    html = response.content.decode()
    svg = re.search(r'<svg id="due-next-hour-chart" role="img" aria-label="([^"]+)"', html)
    assert svg, "the chart is missing"
    assert "7 jobs due in the next hour" in svg.group(1)
    # One <rect> per minute that has jobs due, at its minute, with its count and a tooltip.
    bars = [(datetime.fromisoformat(m), int(n)) for m, n in BAR.findall(html)]
    minute0 = pinned.replace(second=0, microsecond=0)
    assert bars == [
        (minute0 + timedelta(minutes=index), count)
        for index, count in sorted({**known.due_minutes, 3: 1}.items())
    ]
    assert html.count("<rect") == len(bars)
    assert "3 jobs due</title></rect>" in html
    # The tallest bar fills the plot; the others are to scale.
    chart = response.context["chart"]
    heights = {bar.count: bar.height for bar in chart.bars}
    assert heights == {3: 120, 2: 80, 1: 40}

    for text in (
        f"#{known.overdue.pk}</a>",
        "paused-q",
        "4 failed attempts in the last 24 hours",
        "Boom failed",
        "100 attempts started in the last hour",
        "99 ms",
        "2 live consumers",
        "w-live",
        f"#{known.running_live[0].pk}</a> tests.scripted",
        f"#{known.running_dead.pk}</a> tests.scripted (w-dead)",
    ):
        assert text in html, text
    # No external assets: every src/href is a path on this site.
    assert not re.search(r'(src|href)="(https?:)?//', html)


def test_dashboard_needs_the_view_permission(client, dashboard_url):
    response = staff(client).get(dashboard_url)
    assert response.status_code == 403


def test_dashboard_sends_anonymous_users_to_the_login(client, dashboard_url):
    response = client.get(dashboard_url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_dashboard_of_an_empty_database_has_no_bars(client, dashboard_url):
    response = staff(client, "view_delayedjob").get(dashboard_url)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="due-next-hour-chart"' in html
    assert "<rect" not in html
    assert "Nothing is paused." in html
