"""The limited claim (``delayjobs.transitions.limiter``) on the real database: what it
admits, what it holds, and a Hypothesis state machine of it against a sequential model.

The database's clock is replaced by the claim's ``at`` argument here, so that the tests
move time themselves (the rate window) instead of sleeping.
"""

from __future__ import annotations

import io
import itertools
import json
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import delayjobs
from delayjobs import transitions
from delayjobs.api import stats
from delayjobs.api.limits import limit_usage
from delayjobs.checks.limits import check_limits
from delayjobs.core import metrics
from delayjobs.exceptions import InvalidJob
from delayjobs.jobtypes import JobType, registry
from delayjobs.models import DelayedJob, JobAttempt, JobStatus, LimitStart
from delayjobs.transitions import Outcome, record_outcomes
from delayjobs.transitions.limiter import RATE_GUARD

pytestmark = pytest.mark.django_db

LEASE = timedelta(minutes=5)
TENANTS = ("a", "b", "c")


class Keyed(JobType):
    """Two running per tenant, three starts per tenant per second."""

    name = "tests.limiter.keyed"
    queue = "limits"
    global_concurrency = 2
    rate_limit = delayjobs.Rate(3, per=timedelta(seconds=1))

    def limit_key(self, job: DelayedJob) -> str | None:
        return job.payload.get("tenant")

    def execute(self, job: DelayedJob) -> None:
        return None


class Whole(JobType):
    """One running for the whole type."""

    name = "tests.limiter.whole"
    queue = "limits"
    global_concurrency = 1

    def execute(self, job: DelayedJob) -> None:
        return None


@pytest.fixture(autouse=True)
def limited_types() -> Iterator[None]:
    for cls in (Keyed, Whole):
        registry.add(cls)
    yield
    for cls in (Keyed, Whole):
        registry.remove(cls.name)


_tokens = itertools.count(1)
#: The database's clock as the tests move it: after every due job's run_at (real time less
#: a few seconds), however long after this module's import a test runs: a day ahead, as a
#: worker of a long suite may import it many minutes before it runs a test of it.
T = time.time() + 86_400.0
#: How long a start of Keyed's rate (1 s) counts: the window and its guard.
WINDOW = 1.0 + RATE_GUARD.total_seconds()


def token() -> datetime:
    """A distinct claim token (the claim's ``now``), never before a due job's run_at."""
    return timezone.now() + timedelta(microseconds=next(_tokens))


def due(job_type: str, tenant: str | None = None, priority: int = 0, ago: float = 10) -> DelayedJob:
    payload = {} if tenant is None else {"tenant": tenant}
    return delayjobs.schedule(
        job_type,
        payload,
        run_at=timezone.now() - timedelta(seconds=ago),
        priority=priority,
    )


def claim(ids: list[int], at: float) -> transitions.LimitedClaim:
    return transitions.claim_limited(
        ids,
        worker_id="w",
        now=token(),
        job_types=[Keyed.name, Whole.name],
        leases={},
        default_lease=LEASE,
        at=at,
    )


def finish(jobs: list[DelayedJob]) -> None:
    now = timezone.now()
    record_outcomes(
        [Outcome(job=job, worker_id="w", started_at=now, finished_at=now) for job in jobs]
    )


# The API and its checks ------------------------------------------------------------------


def test_the_row_keeps_its_limit_key_and_types_without_limits_keep_none() -> None:
    assert due(Keyed.name, "a").limit_key == "tests.limiter.keyed/a"
    assert due(Whole.name).limit_key == "tests.limiter.whole"
    assert delayjobs.schedule("tests.scripted").limit_key is None


def test_a_bad_limit_key_is_refused_at_schedule_time() -> None:
    with pytest.raises(InvalidJob, match="limit_key"):
        due(Keyed.name, "")
    with pytest.raises(InvalidJob, match="at most"):
        due(Keyed.name, "x" * 300)


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"global_concurrency": 0}, "global_concurrency must be an int from 1"),
        ({"global_concurrency": True}, "global_concurrency must be an int from 1"),
        ({"rate_limit": 5}, "rate_limit must be delayjobs.Rate"),
        ({"global_concurrency": 1, "limit_group": "a/b"}, "limit_group must be"),
    ],
)
def test_bad_limits_are_refused_at_registration(attrs: dict, message: str) -> None:
    cls = type("Bad", (Whole,), {"name": "tests.limiter.bad", **attrs})
    with pytest.raises(ImproperlyConfigured, match=message):
        delayjobs.register(cls)


def test_a_rate_checks_its_values() -> None:
    with pytest.raises(ValueError, match="count"):
        delayjobs.Rate(0, per=timedelta(seconds=1))
    with pytest.raises(ValueError, match="per"):
        delayjobs.Rate(1, per=timedelta(0))
    assert delayjobs.Rate(2, per=timedelta(seconds=1)) == delayjobs.Rate(2, timedelta(seconds=1))


def test_checks_refuse_a_group_whose_members_disagree_and_a_key_without_limit() -> None:
    a = type("A", (Whole,), {"name": "tests.a", "limit_group": "g", "global_concurrency": 1})
    b = type("B", (Whole,), {"name": "tests.b", "limit_group": "g", "global_concurrency": 2})
    c = type(
        "C",
        (JobType,),
        {"name": "tests.c", "limit_key": lambda self, job: "k", "execute": lambda s, j: None},
    )
    same = type("S", (Whole,), {"name": "tests.s", "limit_group": "g", "global_concurrency": 1})
    bad = type("X", (Whole,), {"name": "tests.x", "global_concurrency": -1})
    ids = sorted(m.id for m in check_limits([a(), b(), c(), bad()]))
    assert ids == ["delayjobs.E021", "delayjobs.E022", "delayjobs.E023"]
    assert check_limits([a(), same()]) == []
    assert all(isinstance(m, checks.Error) for m in check_limits([a(), b()]))


# What the claim admits --------------------------------------------------------------------


def test_admits_up_to_the_concurrency_by_priority_and_holds_the_rest_unchanged() -> None:
    low = due(Whole.name, priority=-5)
    high = due(Whole.name, priority=5, ago=1)
    result = claim([low.pk, high.pk], at=T + 0.0)
    assert [job.pk for job in result.jobs] == [high.pk]
    assert [(h.pk, h.free_at) for h in result.held] == [(low.pk, None)]
    low.refresh_from_db()
    assert (low.status, low.attempts, low.worker_id) == (JobStatus.SCHEDULED, 0, "")
    # The slot frees when the outcome is recorded; then the held job is admitted.
    assert claim([low.pk], at=T + 0.1).jobs == []
    finish(result.jobs)
    assert [job.pk for job in claim([low.pk], at=T + 0.2).jobs] == [low.pk]


def test_keys_do_not_wait_for_each_other() -> None:
    flood = [due(Keyed.name, "a") for _ in range(5)]
    other = due(Keyed.name, "b")
    result = claim([job.pk for job in [*flood, other]], at=T + 0.0)
    by_key = defaultdict(list)
    for job in result.jobs:
        by_key[job.limit_key].append(job.pk)
    assert len(by_key["tests.limiter.keyed/a"]) == 2
    assert by_key["tests.limiter.keyed/b"] == [other.pk]


def test_the_rate_window_slides_and_says_when_a_start_frees() -> None:
    jobs = [due(Keyed.name, "a") for _ in range(4)]
    first = claim([jobs[0].pk], at=T + 0.0)
    finish(first.jobs)
    second = claim([job.pk for job in jobs[1:3]], at=T + 0.4)
    finish(second.jobs)
    assert len(first.jobs) + len(second.jobs) == 3
    held = claim([jobs[3].pk], at=T + 0.9)
    # The first start counted at T: a start frees one window (and guard) after it.
    free = T + WINDOW
    assert held.jobs == [] and [h.free_at for h in held.held] == [pytest.approx(free)]
    # A millisecond either side of it: the window's edge itself is a float subtraction
    # away from T, which rounds either way.
    assert claim([jobs[3].pk], at=free - 0.001).jobs == []
    (last,) = claim([jobs[3].pk], at=free + 0.001).jobs
    assert last.limit_wait.total_seconds() == pytest.approx(
        free + 0.001 - last.run_at.timestamp(), abs=1e-6
    )


def test_the_limit_wait_is_kept_on_the_job_and_recorded_on_its_attempt() -> None:
    job = due(Whole.name, ago=2)
    (claimed,) = claim([job.pk], at=job.run_at.timestamp() + 1.5).jobs
    assert claimed.limit_wait == timedelta(seconds=1.5)
    finish([claimed])
    assert JobAttempt.objects.get(job=job).limit_wait == timedelta(seconds=1.5)
    plain = delayjobs.schedule("tests.scripted")
    assert plain.limit_wait is None


def test_a_row_scheduled_before_its_type_had_limits_counts_against_the_whole_type() -> None:
    job = due(Whole.name)
    DelayedJob.objects.filter(pk=job.pk).update(limit_key=None)
    (claimed,) = claim([job.pk], at=T + 0.0).jobs
    claimed.refresh_from_db()
    assert claimed.limit_key == "tests.limiter.whole"
    assert claim([due(Whole.name).pk], at=T + 0.1).jobs == []


def test_a_job_past_its_max_lateness_is_admitted_to_expire_without_a_start() -> None:
    job = delayjobs.schedule(
        Keyed.name,
        {"tenant": "late"},
        run_at=timezone.now() - timedelta(seconds=60),
        max_lateness=timedelta(seconds=1),
    )
    assert [j.pk for j in claim([job.pk], at=T + 0.0).jobs] == [job.pk]
    assert not LimitStart.objects.filter(limit_key="tests.limiter.keyed/late").exists()


# The state machine ------------------------------------------------------------------------


@dataclass
class Model:
    """The limiter as a sequential model: jobs waiting, running and starts, per key."""

    concurrency: int
    rate: int
    per: float
    waiting: dict[str, list[tuple[int, int, float]]] = field(default_factory=dict)
    running: dict[str, set[int]] = field(default_factory=dict)
    starts: dict[str, list[float]] = field(default_factory=dict)

    def admit(self, key: str, at: float) -> list[int]:
        """What a claim of every waiting job of ``key`` at ``at`` must admit."""
        window = [s for s in self.starts.get(key, []) if s > at - self.per]
        room = min(self.concurrency - len(self.running.get(key, set())), self.rate - len(window))
        order = sorted(self.waiting.get(key, []), key=lambda w: (-w[1], w[2], w[0]))
        return [pk for pk, _priority, _run_at in order[: max(room, 0)]]


class LimiterMachine(RuleBasedStateMachine):
    """Claims, ends and the passing of time, on the real database, against ``Model``."""

    @initialize()
    def start(self) -> None:
        DelayedJob.objects.all().delete()
        LimitStart.objects.all().delete()
        self.model = Model(concurrency=2, rate=3, per=WINDOW)
        self.at = T
        self.jobs: dict[int, DelayedJob] = {}

    @rule(tenant=st.sampled_from(TENANTS), priority=st.integers(-2, 2))
    def schedule(self, tenant: str, priority: int) -> None:
        job = due(Keyed.name, tenant, priority=priority)
        self.model.waiting.setdefault(job.limit_key, []).append(
            (job.pk, priority, job.run_at.timestamp())
        )

    @rule(tenant=st.sampled_from(TENANTS))
    def claim_key(self, tenant: str) -> None:
        key = f"{Keyed.name}/{tenant}"
        expected = self.model.admit(key, self.at)
        ids = [pk for pk, _p, _r in self.model.waiting.get(key, [])]
        result = claim(ids, at=self.at)
        assert sorted(job.pk for job in result.jobs) == sorted(expected)
        assert {h.pk for h in result.held} == set(ids) - set(expected)
        self.model.waiting[key] = [
            w for w in self.model.waiting.get(key, []) if w[0] not in expected
        ]
        self.model.running.setdefault(key, set()).update(expected)
        self.model.starts.setdefault(key, []).extend([self.at] * len(expected))
        self.jobs.update({job.pk: job for job in result.jobs})

    @precondition(lambda self: any(self.model.running.values()))
    @rule(data=st.data())
    def finish_one(self, data: st.DataObject) -> None:
        running = sorted(pk for pks in self.model.running.values() for pk in pks)
        pk = data.draw(st.sampled_from(running))
        finish([self.jobs.pop(pk)])
        for pks in self.model.running.values():
            pks.discard(pk)

    @rule(seconds=st.sampled_from([0.05, 0.1, 0.3, 0.5, 1.0]))
    def advance(self, seconds: float) -> None:
        self.at += seconds

    @invariant()
    def the_database_never_exceeds_the_limits(self) -> None:
        if not hasattr(self, "model"):
            return
        for tenant in TENANTS:
            key = f"{Keyed.name}/{tenant}"
            running = DelayedJob.objects.filter(limit_key=key, status=JobStatus.RUNNING)
            assert set(running.values_list("pk", flat=True)) == self.model.running.get(key, set())
            assert running.count() <= self.model.concurrency
            starts = sorted(
                started
                for started, count in LimitStart.objects.filter(limit_key=key).values_list(
                    "started", "count"
                )
                for _ in range(count)
            )
            for i, start in enumerate(starts):
                inside = [s for s in starts[i:] if s < start + self.model.per]
                assert len(inside) <= self.model.rate


def test_the_limiter_matches_its_sequential_model() -> None:
    run_state_machine_as_test(
        LimiterMachine,
        settings=settings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )


# Seen: the status, the admin's dashboard, the metrics -------------------------------------


def busy_limits() -> datetime:
    """Tenant a: 2 running of 2, 1 waiting; the whole type "whole": 1 running, 2 waiting.
    Returns the moment of their claim (the starts leave the window a second later)."""
    jobs = [due(Keyed.name, "a") for _ in range(3)] + [due(Whole.name) for _ in range(3)]
    at = time.time()
    claim([job.pk for job in jobs], at=at)
    return datetime.fromtimestamp(at, UTC)


def test_the_status_lists_the_limits_at_work() -> None:
    claimed = busy_limits()
    usage = {u.label: u for u in stats.collect(now=claimed).limits}
    keyed = usage["tests.limiter.keyed / a"]
    assert (keyed.running, keyed.waiting, keyed.window_starts) == (2, 1, 2)
    assert (keyed.shown_running, keyed.shown_starts) == ("2 / 2", "2 / 3 per 1.0 s")
    whole = usage["tests.limiter.whole"]
    assert (whole.running, whole.waiting, whole.shown_starts) == (1, 2, "-")
    out = io.StringIO()
    call_command("delayjobs_status", stdout=out)
    text = out.getvalue()
    assert "Fleet-wide limits (2 key(s) busy):" in text
    # The starts in the window depend on how long ago the claim was: any count.
    assert re.search(r"tests\.limiter\.keyed / a\s+2 / 2\s+\d / 3 per 1\.0 s\s+1", text)
    out = io.StringIO()
    call_command("delayjobs_status", "--json", stdout=out)
    limits = {u["group"]: u for u in json.loads(out.getvalue())["limits"]}
    assert limits["tests.limiter.whole"]["waiting"] == 2


def test_no_query_for_limits_in_a_project_without_them() -> None:
    for cls in (Keyed, Whole):
        registry.remove(cls.name)
    with CaptureQueriesContext(connection) as queries:
        assert limit_usage(timezone.now()) == []
    assert len(queries) == 0


def test_the_dashboard_shows_the_limits(admin_client: Any) -> None:
    busy_limits()
    page = admin_client.get(reverse("admin:delayjobs_delayedjob_dashboard")).content.decode()
    assert "Fleet-wide limits" in page
    assert re.search(r"tests\.limiter\.keyed / a.*?2 / 2.*?\d / 3 per 1\.0 s", page, re.S)


def test_the_metrics_have_gauges_of_the_limits() -> None:
    busy_limits()
    families = {f.name: f for f in metrics.BacklogCollector().collect()}
    running = {
        s.labels["limit_group"]: s.value for s in families["delayjobs_limit_running"].samples
    }
    waiting = {
        s.labels["limit_group"]: s.value for s in families["delayjobs_limit_waiting"].samples
    }
    assert running == {"tests.limiter.keyed": 2, "tests.limiter.whole": 1}
    assert waiting == {"tests.limiter.keyed": 1, "tests.limiter.whole": 2}
