"""Reading jobs over HTTP: one job with its history (GET jobs/<id>/), and the list
(GET jobs/): its filters, its pages and what it refuses."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import delayjobs
from delayjobs.http.schemas import MAX_LIMIT
from delayjobs.models import DelayedJob, JobStatus
from sampleproject.meetings.models import Room
from tests.integration.http_client import (
    BASE,
    NOTHING,
    SCRIPTED,
    Api,
    assert_error,
)
from tests.integration.test_admin import TRACEBACK, failed_with_history, make_job

pytestmark = pytest.mark.django_db


def test_get_a_job_with_its_history_oldest_first(api: Api) -> None:
    job = failed_with_history()
    DelayedJob.objects.filter(pk=job.pk).update(result={"sent": 3}, last_error="ScriptedFailure")
    room = Room.objects.create(name="Blue")
    linked = make_job(obj=room)
    data = api.get(f"jobs/{job.pk}/").json()
    assert (data["id"], data["status"], data["key"], data["attempts"]) == (
        job.pk,
        "failed",
        "order:42",
        2,
    )
    assert (data["result"], data["last_error"]) == ({"sent": 3}, "ScriptedFailure")
    assert [attempt["number"] for attempt in data["history"]] == [1, 2]
    assert (data["history"][1]["outcome"], data["history"][1]["traceback"]) == (
        "failed",
        TRACEBACK,
    )
    assert data["history"][0]["lateness"] == 0.003
    assert api.get(f"jobs/{linked.pk}/").json()["object"] == {
        "type": "meetings.room",
        "id": str(room.pk),
    }


def test_an_unknown_job_is_404_on_every_job_route_and_an_impossible_id_422(api: Api) -> None:
    assert_error(api.get("jobs/999999/"), 404, "not_found")
    for action, body in (("cancel", NOTHING), ("retry", NOTHING), ("reschedule", {"delay": 1})):
        assert_error(api.post(f"jobs/999999/{action}/", body), 404, "not_found")
    # No job can have an id past a 64-bit key: the document says so, and it is refused.
    assert_error(api.get(f"jobs/{2**64}/"), 422, "invalid", "job_id")


def test_list_filters_by_status_type_queue_key_and_object(api: Api) -> None:
    room = Room.objects.create(name="Blue")
    scheduled = make_job(key="k1")
    failed = make_job(JobStatus.FAILED)
    expired = make_job(JobStatus.EXPIRED)
    noop = make_job(job_type="tests.noop")
    linked = delayjobs.schedule(SCRIPTED, obj=room)

    def ids(**query: Any) -> list[int]:
        response = api.get("jobs/", **query)
        assert response.status_code == 200
        return [job["id"] for job in response.json()["jobs"]]

    assert ids() == [linked.pk, noop.pk, expired.pk, failed.pk, scheduled.pk]
    assert ids(status="failed") == [failed.pk]
    assert ids(status=["failed", "expired"]) == [expired.pk, failed.pk]
    assert ids(job_type="tests.noop") == [noop.pk]
    assert ids(queue="other") == [noop.pk]
    assert ids(key="k1") == [scheduled.pk]
    assert ids(object_type="meetings.room") == [linked.pk]
    assert ids(object_type="meetings.Room", object_id=str(room.pk)) == [linked.pk]
    assert ids(object_type="meetings.room", object_id="0") == []
    assert ids(object_id=str(room.pk)) == [linked.pk]
    assert ids(status="skipped") == []
    # A well-formed label of no model: no job is about it (the document calls it valid).
    assert ids(object_type="nope.nothing") == []


def test_list_pages_with_a_cursor_through_every_job_once(api: Api) -> None:
    created = [make_job().pk for _ in range(5)]
    seen: list[int] = []
    page = api.get("jobs/", limit=2).json()
    while True:
        seen += [job["id"] for job in page["jobs"]]
        if page["next"] is None:
            assert page["next_cursor"] is None
            break
        assert urlsplit(page["next"]).path == BASE + "jobs/"
        assert "limit=2" in page["next"]
        # Jobs added meanwhile are newer: they do not shift the pages still to come.
        make_job(JobStatus.CANCELLED)
        page = api.get("jobs/", limit=2, cursor=page["next_cursor"]).json()
    assert seen == sorted(created, reverse=True)


def test_list_follows_the_next_link_as_given(api: Api) -> None:
    for _ in range(3):
        make_job()
    first = api.get("jobs/", limit=2, status="scheduled").json()
    response = api.client.get(first["next"], headers={"authorization": f"Bearer {api.key}"})
    assert len(response.json()["jobs"]) == 1


def test_a_cursor_past_every_id_lists_from_the_newest_and_a_limit_may_have_zeros(
    api: Api,
) -> None:
    newest = make_job()
    for cursor in ("9" * 19, str(2**63), str(newest.pk + 1)):
        assert [job["id"] for job in api.get("jobs/", cursor=cursor).json()["jobs"]] == [newest.pk]
    assert api.get("jobs/", cursor=str(newest.pk)).json()["jobs"] == []
    make_job()
    page = api.get("jobs/", limit="01").json()
    assert (len(page["jobs"]), page["next_cursor"] is not None) == (1, True)


#: Each query, refused naming its parameter (a repeated one by its position: status.1).
LIST_REFUSALS: dict[str, dict[str, Any]] = {
    "limit zero": {"limit": "0"},
    "limit too high": {"limit": str(MAX_LIMIT + 1)},
    "limit not a number": {"limit": "ten"},
    # More digits than int() converts (sys.get_int_max_str_digits(), 4300): no 500.
    "limit of 5000 digits": {"limit": "9" * 5000},
    "unknown status": {"status": ["failed", "done"]},
    "garbage cursor": {"cursor": "abc"},
    "empty cursor": {"cursor": ""},
    "cursor of 20 digits": {"cursor": "9" * 20},
    "not a model label": {"object_type": "nothing"},
    "NUL in a model label": {"object_type": "a.b\x00"},
    "NUL in a filter": {"key": "a\x00b"},
}


@pytest.mark.parametrize("query", list(LIST_REFUSALS.values()), ids=list(LIST_REFUSALS))
def test_list_refuses_bad_query_parameters_naming_them(api: Api, query: dict[str, Any]) -> None:
    fields = ["status.1" if name == "status" else name for name in query]
    assert_error(api.get("jobs/", **query), 422, "invalid", *fields)


def test_a_page_costs_the_same_queries_whatever_its_size(api: Api) -> None:
    room = Room.objects.create(name="Blue")
    api.get("jobs/")  # the key's first use writes last_used_at: not part of a page's cost

    def queries(count: int) -> int:
        DelayedJob.objects.all().delete()
        for _ in range(count):
            delayjobs.schedule(SCRIPTED, obj=room)
        with CaptureQueriesContext(connection) as captured:
            assert len(api.get("jobs/").json()["jobs"]) == count
        return len(captured)

    assert queries(2) == queries(12)
