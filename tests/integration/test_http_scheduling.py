"""Scheduling over HTTP (POST jobs/, jobs/bulk/): what is scheduled, what is refused (by
status, error code and the path of the field at fault), key conflicts and replace, which
job types a key may schedule, and what a reply shows to whom."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

import delayjobs
from delayjobs.http.schemas import MAX_BULK_JOBS
from delayjobs.jobtypes import registry
from delayjobs.models import DelayedJob, JobStatus
from tests.conftest import ConsumerFactory
from tests.integration.http_client import (
    ALL_PERMISSIONS,
    BASE,
    SCRIPTED,
    Api,
    assert_error,
    key_of,
    make_user,
    rows,
)
from tests.integration.test_admin import make_job
from tests.utils import wait_for

pytestmark = pytest.mark.django_db

FUTURE = datetime(2030, 1, 15, 14, 30, tzinfo=UTC)


def test_schedule_with_every_field_returns_201_and_the_job(api: Api) -> None:
    response = api.post(
        "jobs/",
        {
            "job_type": SCRIPTED,
            "payload": {"order_id": 42, "note": "café"},
            "run_at": "2030-01-15T16:30:00.000001+02:00",
            "key": "order:42:close",
            "queue": "orders",
            "max_attempts": 7,
            "max_lateness": 90.5,
            "priority": 10,
        },
    )
    assert response.status_code == 201
    data = response.json()
    job = DelayedJob.objects.get()
    assert response["Location"] == f"http://testserver{BASE}jobs/{job.pk}/"
    assert (job.job_type, job.payload, job.run_at, job.key, job.queue) == (
        SCRIPTED,
        {"order_id": 42, "note": "café"},
        FUTURE + timedelta(microseconds=1),
        "order:42:close",
        "orders",
    )
    assert (job.max_attempts, job.max_lateness, job.priority) == (7, timedelta(seconds=90.5), 10)
    assert (data["id"], data["status"], data["trace_id"]) == (job.pk, "scheduled", job.trace_id)
    assert (data["run_at"], data["max_lateness"], data["object"]) == (
        "2030-01-15T14:30:00.000001Z",
        90.5,
        None,
    )


def test_schedule_with_only_a_job_type_takes_the_defaults(api: Api) -> None:
    before = timezone.now()
    data = api.post("jobs/", {"job_type": "tests.noop"}).json()
    job = DelayedJob.objects.get(pk=data["id"])
    assert before <= job.run_at <= timezone.now()
    assert (job.queue, job.payload, job.key, job.priority, job.max_lateness) == (
        "other",
        {},
        None,
        0,
        None,
    )
    assert job.max_attempts == 5


def test_schedule_with_a_delay(api: Api) -> None:
    before = timezone.now()
    data = api.post("jobs/", {"job_type": SCRIPTED, "delay": 3600}).json()
    run_at = DelayedJob.objects.get(pk=data["id"]).run_at
    assert before + timedelta(hours=1) <= run_at <= timezone.now() + timedelta(hours=1)


#: A body, and the fields its 422 names. Types and bounds are the schema's; the rest is
#: schedule()'s, named by the InvalidJob it raises.
INVALID_SCHEDULES: dict[str, tuple[Any, tuple[str, ...]]] = {
    "unknown field (a typo)": ({"job_type": SCRIPTED, "dealy": 5}, ("dealy",)),
    "no job type": ({"payload": {}}, ("job_type",)),
    "job type not a string": ({"job_type": 5}, ("job_type",)),
    "unknown job type": ({"job_type": "nope.never"}, ("job_type",)),
    "naive run_at": ({"job_type": SCRIPTED, "run_at": "2030-01-15T14:30:00"}, ("run_at",)),
    "run_at without seconds": ({"job_type": SCRIPTED, "run_at": "2030-01-15T14:30Z"}, ("run_at",)),
    "run_at not a date": ({"job_type": SCRIPTED, "run_at": "tomorrow"}, ("run_at",)),
    "run_at a number": ({"job_type": SCRIPTED, "run_at": 1700000000}, ("run_at",)),
    "run_at a day February lacks": (
        {"job_type": SCRIPTED, "run_at": "2030-02-30T00:00:00Z"},
        ("run_at",),
    ),
    "run_at before the year 1 in UTC": (
        {"job_type": SCRIPTED, "run_at": "0001-01-01T00:30:00+01:00"},
        ("run_at",),
    ),
    "run_at past MAX_SCHEDULE_AHEAD": (
        {"job_type": SCRIPTED, "run_at": "9999-12-31T00:00:00Z"},
        ("run_at",),
    ),
    "run_at and delay": (
        {"job_type": SCRIPTED, "run_at": "2030-01-15T14:30:00Z", "delay": 5},
        ("delay",),
    ),
    "delay as text": ({"job_type": SCRIPTED, "delay": "10"}, ("delay",)),
    "negative delay": ({"job_type": SCRIPTED, "delay": -1}, ("delay",)),
    "boolean delay": ({"job_type": SCRIPTED, "delay": True}, ("delay",)),
    "delay past MAX_SCHEDULE_AHEAD": ({"job_type": SCRIPTED, "delay": 8e13}, ("delay",)),
    "delay no timedelta holds": ({"job_type": SCRIPTED, "delay": 1e20}, ("delay",)),
    "empty key": ({"job_type": SCRIPTED, "key": ""}, ("key",)),
    "key too long": ({"job_type": SCRIPTED, "key": "k" * 256}, ("key",)),
    "key with NUL": ({"job_type": SCRIPTED, "key": "a\x00b"}, ("key",)),
    "key a lone surrogate": ({"job_type": SCRIPTED, "key": "\ud800"}, ("key",)),
    "queue with spaces": ({"job_type": SCRIPTED, "queue": "a b"}, ("queue",)),
    "max_attempts zero": ({"job_type": SCRIPTED, "max_attempts": 0}, ("max_attempts",)),
    "max_attempts 1e300": ({"job_type": SCRIPTED, "max_attempts": 1e300}, ("max_attempts",)),
    "max_attempts fractional": ({"job_type": SCRIPTED, "max_attempts": 1.5}, ("max_attempts",)),
    "max_lateness zero": ({"job_type": SCRIPTED, "max_lateness": 0}, ("max_lateness",)),
    "max_lateness just under 1 ms": (
        {"job_type": SCRIPTED, "max_lateness": 0.0009999996},
        ("max_lateness",),
    ),
    "max_lateness over 366 days": (
        {"job_type": SCRIPTED, "max_lateness": 31622400.5},
        ("max_lateness",),
    ),
    "priority out of range": ({"job_type": SCRIPTED, "priority": 101}, ("priority",)),
    "priority as text": ({"job_type": SCRIPTED, "priority": "high"}, ("priority",)),
    "priority true": ({"job_type": SCRIPTED, "priority": True}, ("priority",)),
    "replace without a key": ({"job_type": SCRIPTED, "replace": True}, ("key",)),
    "replace not a boolean": ({"job_type": SCRIPTED, "key": "k", "replace": "yes"}, ("replace",)),
    "payload with NUL": ({"job_type": SCRIPTED, "payload": {"text": "a\x00b"}}, ("payload",)),
    "payload over the limit": (
        {"job_type": SCRIPTED, "payload": {"blob": "x" * (65 * 1024)}},
        ("payload",),
    ),
    "payload with a lone surrogate": ({"job_type": SCRIPTED, "payload": "\ud800"}, ("payload",)),
    "payload nested past MAX_PAYLOAD_DEPTH": (
        {"job_type": SCRIPTED, "payload": {"a": json.loads("[" * 64 + "]" * 64)}},
        ("payload",),
    ),
    "body an array": ([{"job_type": SCRIPTED}], ()),
    "body null": (None, ()),
    "several problems": ({"job_type": 1, "priority": "x"}, ("job_type", "priority")),
}


@pytest.mark.parametrize(
    ("body", "fields"), list(INVALID_SCHEDULES.values()), ids=list(INVALID_SCHEDULES)
)
def test_schedule_refuses_invalid_input_with_422_naming_the_fields(
    api: Api, body: Any, fields: tuple[str, ...]
) -> None:
    response = api.post("jobs/", body)
    assert_error(response, 422, "invalid", *fields)
    assert response.json()["detail"]
    assert not DelayedJob.objects.exists()


def test_a_payload_as_deep_as_max_payload_depth_is_scheduled(api: Api) -> None:
    deepest = json.loads("[" * 64 + "]" * 64)
    assert api.post("jobs/", {"job_type": SCRIPTED, "payload": deepest}).status_code == 201


def test_a_held_key_is_409_with_the_holder_and_replace_moves_it(api: Api) -> None:
    first = api.post("jobs/", {"job_type": SCRIPTED, "key": "order:1", "delay": 60}).json()
    response = api.post("jobs/", {"job_type": SCRIPTED, "key": "order:1", "delay": 5})
    assert assert_error(response, 409, "duplicate_key", "key")["existing_id"] == first["id"]
    moved = api.post(
        "jobs/",
        {"job_type": SCRIPTED, "key": "order:1", "run_at": "2030-01-15T14:30:00Z", "replace": True},
    )
    assert (moved.status_code, moved.json()["id"]) == (201, first["id"])
    assert DelayedJob.objects.get().run_at == FUTURE


def test_replace_of_a_running_job_is_409_and_changes_nothing(api: Api) -> None:
    job = make_job(JobStatus.RUNNING, key="order:2")
    before = rows()
    response = api.post(
        "jobs/", {"job_type": SCRIPTED, "key": "order:2", "delay": 5, "replace": True}
    )
    assert assert_error(response, 409, "duplicate_key", "key")["existing_id"] == job.pk
    assert rows() == before


VICTIM = {"job_type": SCRIPTED, "key": "order:42:close", "queue": "default"}
#: A replace of another service's job that would rewrite all of it.
HIJACK = {
    "job_type": "tests.noop",
    "payload": {"x": 1},
    "key": "order:42:close",
    "replace": True,
    "run_at": "2100-01-01T00:00:00Z",
    "queue": "nowhere",
}


def test_replace_needs_the_reschedule_permission_too(client: Client) -> None:
    make_job(key="order:42:close", delay=timedelta(hours=1))
    before = rows()
    scheduler = Api(client, key_of(make_user("add_delayedjob", "view_delayedjob")))
    same_type = {"job_type": SCRIPTED, "key": "order:42:close", "replace": True, "delay": 5}
    for route, body in (
        ("jobs/", HIJACK),
        ("jobs/", same_type),
        ("jobs/bulk/", {"jobs": [{"job_type": SCRIPTED}, same_type]}),
    ):
        assert_error(scheduler.post(route, body), 403, "permission_denied")
        assert rows() == before
    # Without replace, add_delayedjob is enough, and the held key is a plain 409.
    response = scheduler.post("jobs/", {"job_type": SCRIPTED, "key": "order:42:close"})
    assert_error(response, 409, "duplicate_key", "key")
    assert rows() == before


@pytest.mark.parametrize(
    "change",
    [{"job_type": "tests.noop", "queue": "default"}, {"queue": "elsewhere"}, {"queue": None}],
    ids=["another job type", "another queue", "the job type's queue"],
)
def test_replace_never_changes_the_job_type_or_queue_of_the_held_job(
    api: Api, change: dict[str, Any]
) -> None:
    job = make_job(key="order:42:close", queue="orders", delay=timedelta(hours=1))
    before = rows()
    body = {**VICTIM, "queue": "orders", "replace": True, "delay": 5, **change}
    for route, sent, field in (
        ("jobs/", body, "key"),
        ("jobs/bulk/", {"jobs": [{"job_type": SCRIPTED}, body]}, "jobs.1.key"),
    ):
        response = api.post(route, sent)
        assert assert_error(response, 409, "duplicate_key", field)["existing_id"] == job.pk
        assert rows() == before
    moved = api.post("jobs/", {**VICTIM, "queue": "orders", "replace": True, "delay": 5})
    assert (moved.status_code, moved.json()["id"]) == (201, job.pk)


def test_replies_show_a_job_only_to_callers_who_may_view_jobs(client: Client) -> None:
    """Scheduling does not let a caller read jobs: without view_delayedjob it gets the
    job's id, never its fields nor the id of a job holding a key it asks for."""
    other = make_job(key="order:42:close", delay=timedelta(hours=1))
    blind = Api(client, key_of(make_user("add_delayedjob", "reschedule_delayedjob")))
    created = blind.post("jobs/", {"job_type": SCRIPTED, "payload": {"a": 1}})
    new = DelayedJob.objects.latest("pk")
    assert (created.status_code, created.json()) == (201, {"id": new.pk})
    assert created["Location"].endswith(f"{BASE}jobs/{new.pk}/")
    bulk = blind.post("jobs/bulk/", {"jobs": [{"job_type": SCRIPTED}]})
    assert bulk.json() == {"jobs": [{"id": DelayedJob.objects.latest("pk").pk}]}
    # A key conflict tells such a caller only that the key is taken: one answer whatever
    # holds it (another job type, a running job, or plainly).
    answers = [
        blind.post("jobs/", {"job_type": SCRIPTED, "key": "order:42:close"}),
        blind.post("jobs/", {**HIJACK, "run_at": None, "queue": None}),
    ]
    moved = blind.post("jobs/", {**VICTIM, "replace": True, "payload": {"b": 2}, "delay": 9})
    assert moved.json() == {"id": other.pk}
    DelayedJob.objects.filter(pk=other.pk).update(status=JobStatus.RUNNING)
    answers.append(blind.post("jobs/", {**VICTIM, "replace": True}))
    bodies = [assert_error(answer, 409, "duplicate_key", "key") for answer in answers]
    assert bodies[0] == bodies[1] == bodies[2]
    assert "existing_id" not in bodies[0]
    assert str(other.pk) not in json.dumps(bodies[0])


# Job types: private unless they say public; a key may list private ones -------------


class Internal(delayjobs.JobType):
    """A job type that says nothing about the HTTP API: private, as every type by default."""

    name = "tests.internal"

    def execute(self, job: DelayedJob) -> None:
        return None


@pytest.fixture
def internal() -> Iterator[type[Internal]]:
    delayjobs.register(Internal)
    try:
        yield Internal
    finally:
        registry.remove(Internal.name)


def test_a_job_type_closed_to_the_key_is_refused_exactly_as_an_unknown_one(
    api: Api, internal: type[Internal]
) -> None:
    closed = [jobtype.name for jobtype in registry if not jobtype.public]
    assert Internal.public is False and Internal.name in closed  # and django.task
    for name in closed:
        for route, body in (
            ("jobs/", {"job_type": name, "payload": {"task": "x"}}),
            ("jobs/bulk/", {"jobs": [{"job_type": SCRIPTED}, {"job_type": name}]}),
        ):
            response = api.post(route, body)
            unknown = api.post(route, json.loads(json.dumps(body).replace(name, "no.such")))
            field = "job_type" if route == "jobs/" else "jobs.1.job_type"
            assert_error(response, 422, "invalid", field)
            assert response.json() == json.loads(
                json.dumps(unknown.json()).replace("no.such", name)
            )
            # The error names no job type but the one sent.
            registered = [other for other in registry.names() if other != name]
            assert not [other for other in registered if other in json.dumps(response.json())]
    assert not DelayedJob.objects.exists()
    # Python code still schedules it, and its key cannot be taken over by a replace.
    job = delayjobs.schedule(Internal, key="internal:1")
    response = api.post(
        "jobs/", {"job_type": SCRIPTED, "key": "internal:1", "queue": "default", "replace": True}
    )
    assert_error(response, 409, "duplicate_key", "key")
    assert DelayedJob.objects.get().job_type == job.job_type == Internal.name


def test_a_key_listing_a_private_job_type_may_schedule_it_and_no_other_key(
    client: Client, internal: type[Internal]
) -> None:
    user = make_user(*ALL_PERMISSIONS)
    listed = Api(client, key_of(user, Internal.name))
    plain = Api(Client(), key_of(user))
    assert listed.post("jobs/", {"job_type": Internal.name}).status_code == 201
    assert_error(plain.post("jobs/", {"job_type": Internal.name}), 422, "invalid", "job_type")
    bulk = {"jobs": [{"job_type": SCRIPTED}, {"job_type": Internal.name}]}
    assert listed.post("jobs/bulk/", bulk).status_code == 201
    assert_error(plain.post("jobs/bulk/", bulk), 422, "invalid", "jobs.1.job_type")
    assert DelayedJob.objects.filter(job_type=Internal.name).count() == 2


# Bulk ------------------------------------------------------------------------------------


def test_bulk_schedules_all_in_order(api: Api) -> None:
    response = api.post(
        "jobs/bulk/",
        {
            "jobs": [
                {"job_type": SCRIPTED, "key": "a", "run_at": "2030-01-15T14:30:00Z"},
                {"job_type": "tests.noop", "delay": 60, "priority": -5},
            ]
        },
    )
    assert response.status_code == 201
    jobs = response.json()["jobs"]
    assert [job["job_type"] for job in jobs] == [SCRIPTED, "tests.noop"]
    assert [job["id"] for job in jobs] == list(
        DelayedJob.objects.order_by("pk").values_list("pk", flat=True)
    )
    assert DelayedJob.objects.get(pk=jobs[1]["id"]).priority == -5


BULK_REFUSALS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "a naive time in the second job": (
        [{"job_type": SCRIPTED}, {"job_type": SCRIPTED, "run_at": "2030-01-15T14:30:00"}],
        ("jobs.1.run_at",),
    ),
    "a typo in the first job": ([{"job_type": SCRIPTED, "payloda": {}}], ("jobs.0.payloda",)),
    "a job that is not an object": ([{"job_type": SCRIPTED}, "tests.noop"], ("jobs.1",)),
    "an unknown job type": ([{"job_type": SCRIPTED}, {"job_type": "nope"}], ("jobs.1.job_type",)),
    "a run_at past MAX_SCHEDULE_AHEAD in the third job": (
        [{"job_type": SCRIPTED}] * 2 + [{"job_type": SCRIPTED, "run_at": "9999-01-01T00:00:00Z"}],
        ("jobs.2.run_at",),
    ),
    "a payload over the limit in the second job": (
        [{"job_type": SCRIPTED}, {"job_type": SCRIPTED, "payload": "x" * (65 * 1024)}],
        ("jobs.1.payload",),
    ),
    "no jobs": ([], ("jobs",)),
    "too many jobs": ([{"job_type": SCRIPTED}] * (MAX_BULK_JOBS + 1), ("jobs",)),
    "not a list": ({"job_type": SCRIPTED}, ("jobs",)),
}


@pytest.mark.parametrize(("jobs", "fields"), list(BULK_REFUSALS.values()), ids=list(BULK_REFUSALS))
def test_bulk_refuses_the_whole_batch_for_one_bad_job(
    api: Api, jobs: Any, fields: tuple[str, ...]
) -> None:
    assert_error(api.post("jobs/bulk/", {"jobs": jobs}), 422, "invalid", *fields)
    assert not DelayedJob.objects.exists()


def test_bulk_with_a_key_twice_is_a_409_conflict_and_schedules_none(api: Api) -> None:
    """Two jobs of one request cannot both hold a key: a conflict, as with a key an active
    job holds, not an invalid request (which the document could not say)."""
    jobs = [{"job_type": SCRIPTED, "key": "k"}, {"job_type": SCRIPTED, "key": "k"}]
    assert_error(api.post("jobs/bulk/", {"jobs": jobs}), 409, "duplicate_key", "jobs.1.key")
    assert not DelayedJob.objects.exists()


def test_bulk_with_a_key_already_held_is_409_and_schedules_none(api: Api) -> None:
    holder = make_job(key="taken")
    before = rows()
    response = api.post(
        "jobs/bulk/", {"jobs": [{"job_type": SCRIPTED}, {"job_type": SCRIPTED, "key": "taken"}]}
    )
    assert assert_error(response, 409, "duplicate_key", "jobs.1.key")["existing_id"] == holder.pk
    assert rows() == before


# End to end ------------------------------------------------------------------------------


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_job_scheduled_over_http_runs_in_a_consumer_and_shows_succeeded(
    client: Client, consumer_process: ConsumerFactory
) -> None:
    api = Api(client, key_of(make_user(*ALL_PERMISSIONS)))
    consumer = consumer_process("--worker-id", "http-e2e")
    job = api.post("jobs/", {"job_type": SCRIPTED, "payload": {"via": "http"}}).json()

    def finished() -> dict[str, Any] | None:
        assert consumer.returncode is None, consumer.output()
        data = api.get(f"jobs/{job['id']}/").json()
        return data if data["status"] == "succeeded" else None

    data = wait_for(finished, message="the job scheduled over HTTP never succeeded")
    assert [(a["number"], a["outcome"], a["worker_id"]) for a in data["history"]] == [
        (1, "succeeded", "http-e2e")
    ]
