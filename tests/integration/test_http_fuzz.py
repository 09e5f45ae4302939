"""Hostile request bodies against the HTTP API: property-based (Hypothesis).

Whatever a client sends, the API answers a documented JSON response, never a 500: a
request either schedules valid jobs (201) or is refused (4xx) having written nothing.
Schemathesis (test_openapi_conformance.py) generates requests from the document; these
go where the document does not lead: bytes that are not JSON, nesting past the limit,
NUL characters, lone surrogates, numbers no double holds, fields of every JSON type.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import event, given
from hypothesis import strategies as st

from delayjobs.conf import settings as conf
from delayjobs.models import DelayedJob
from tests.integration.http_client import Api, rows
from tests.utils import fuzz_settings

pytestmark = pytest.mark.django_db

SCRIPTED = "tests.scripted"
EXAMPLES = fuzz_settings(max_examples=150)

# Values -------------------------------------------------------------------------------

#: Strings a client can send in JSON: NUL, lone surrogates (as \ud800 escapes), anything.
NASTY_TEXT = st.text(max_size=12) | st.sampled_from(
    ["", "\x00", "a\x00b", "\ud800", "x\udfff", "é" * 300, "2030-01-15T14:30:00Z", " ", "\n"]
)
NUMBERS = (
    st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0, -1, 1e308, -1e308, 5e-324, 2**63, -(2**63) - 1, 10**30, 0.0005])
)
SCALARS = st.none() | st.booleans() | NUMBERS | NASTY_TEXT
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(NASTY_TEXT, children, max_size=3)
    ),
    max_leaves=12,
)


def nested(depth: int, inner: Any = 1) -> Any:
    for level in range(depth):
        inner = [inner] if level % 2 else {"a": inner}
    return inner


#: Payloads around the depth limit: DELAYJOBS["MAX_PAYLOAD_DEPTH"] levels, and one more.
DEEP_PAYLOADS = st.integers(conf.MAX_PAYLOAD_DEPTH - 2, conf.MAX_PAYLOAD_DEPTH + 3).map(nested)


def mostly(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A valid value three times in four, anything at all otherwise: enough valid requests
    that scheduling is exercised, enough invalid ones that refusals are."""
    return st.one_of(valid, valid, valid, JSON_VALUES)


#: Each field of a schedule request.
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "payload": mostly(JSON_VALUES | DEEP_PAYLOADS),
    "run_at": mostly(
        st.sampled_from(
            [
                "2030-01-15T14:30:00Z",
                "2030-01-15t14:30:00.5z",
                "0002-01-01T00:00:00+15:59",
                "2030-01-15T14:30:00+23:59",
                "9999-12-31T23:59:59Z",
                "2030-02-30T00:00:00Z",
                "2030-01-15T14:30:00",
            ]
        )
    ),
    "delay": mostly(NUMBERS),
    "key": mostly(NASTY_TEXT),
    "replace": mostly(st.booleans()),
    "queue": mostly(st.sampled_from(["default", "q-1", "a b", "x" * 101])),
    "max_attempts": mostly(st.integers(-2, 2**40)),
    "max_lateness": mostly(NUMBERS),
    "priority": mostly(st.integers(-200, 200)),
}


SAFE_TEXT = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=20
)
#: Values every one of which is valid: half the bodies are made of these alone.
VALID_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "payload": st.recursive(
        st.none() | st.booleans() | st.integers(-(2**53), 2**53) | SAFE_TEXT,
        lambda children: (
            st.lists(children, max_size=3) | st.dictionaries(SAFE_TEXT, children, max_size=3)
        ),
        max_leaves=8,
    ),
    "delay": st.floats(0, 1e6),
    "key": SAFE_TEXT,
    "queue": st.sampled_from(["default", "q-1", "a.b_c"]),
    "max_attempts": st.integers(1, 100),
    "max_lateness": st.floats(0.001, 1e6),
    "priority": st.integers(-100, 100),
}


@st.composite
def schedule_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A schedule request: a job type (almost always), some fields, each valid or not;
    sometimes an unknown field. Or, half the time, a request valid in every field."""
    if draw(st.booleans()):
        names = draw(st.sets(st.sampled_from(sorted(VALID_FIELDS))))
        fields = {name: draw(VALID_FIELDS[name]) for name in names}
        return {"job_type": draw(st.sampled_from([SCRIPTED, "tests.noop"])), **fields}
    body: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        body["job_type"] = draw(mostly(st.sampled_from([SCRIPTED, "tests.noop", "nope"])))
    names = draw(st.sets(st.sampled_from(sorted(FIELD_VALUES)), max_size=4))
    body |= {name: draw(FIELD_VALUES[name]) for name in names}
    if draw(st.integers(0, 9)) == 0:
        body[draw(NASTY_TEXT)] = draw(JSON_VALUES)
    return body


#: Raw bytes of a body: JSON texts that Python's json refuses or cannot represent.
RAW_BODIES = st.binary(max_size=40) | st.sampled_from(
    [
        b"[" * 100_000,
        b'{"job_type": "tests.scripted", "payload": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"job_type": "tests.scripted", "delay": 1e400}',
        b'{"job_type": "tests.scripted", "delay": NaN}',
        b'{"job_type": "tests.scripted", "priority": ' + b"9" * 5000 + b"}",
        b'{"job_type": "tests.scripted", "job_type": "tests.noop"}',
        b'{"job_type": "tests.scripted", "key": "\\ud800"}',
        b'{"job_type": "tests.scripted"',
        b"\xff\xfe{}",
        b"null",
    ]
)


# Properties --------------------------------------------------------------------------


def assert_all_or_nothing(response: Any, before: list[dict[str, Any]]) -> list[int]:
    """A 201, or a 4xx that wrote nothing; never a 500 (``Api`` checks the reply against
    the OpenAPI document). The ids of the jobs a 201 scheduled."""
    event(f"answered {response.status_code}")  # --hypothesis-show-statistics: both kinds
    assert response.status_code < 500, response.content
    if response.status_code != 201:
        assert 400 <= response.status_code < 500
        assert rows() == before, "a refused request must write nothing"
        return []
    data = response.json()
    return [job["id"] for job in data.get("jobs", [data])]


def assert_valid(job_ids: list[int]) -> None:
    """Each job a 201 reported exists, within every bound the API promises."""
    ahead = timezone.now() + conf.MAX_SCHEDULE_AHEAD
    for job in DelayedJob.objects.filter(pk__in=job_ids):
        assert job.run_at <= ahead
        assert -100 <= job.priority <= 100
        assert job.key is None or (job.key and "\x00" not in job.key)
        assert "\x00" not in json.dumps(job.payload)
        assert job.max_lateness is None or timedelta(milliseconds=1) <= job.max_lateness
    assert DelayedJob.objects.filter(pk__in=job_ids).count() == len(job_ids)


@EXAMPLES
@given(body=schedule_bodies() | JSON_VALUES)
def test_any_schedule_body_schedules_a_valid_job_or_is_refused(api: Api, body: Any) -> None:
    before = rows()
    assert_valid(assert_all_or_nothing(api.post("jobs/", body), before))


@EXAMPLES
@given(jobs=st.lists(schedule_bodies(), min_size=1, max_size=4) | JSON_VALUES)
def test_any_bulk_body_schedules_all_its_jobs_or_none(api: Api, jobs: Any) -> None:
    before = rows()
    job_ids = assert_all_or_nothing(api.post("jobs/bulk/", {"jobs": jobs}), before)
    assert_valid(job_ids)
    if job_ids:
        assert len(job_ids) == len(jobs)


@EXAMPLES
@given(raw=RAW_BODIES, route=st.sampled_from(["jobs/", "jobs/bulk/", "jobs/cancel/"]))
def test_any_bytes_are_refused_in_json_without_a_write(api: Api, raw: bytes, route: str) -> None:
    before = rows()
    response = api.post(route, raw=raw)
    if response.status_code == 201:  # b"{}"-like bytes can be a valid body
        return
    assert 400 <= response.status_code < 500, response.content
    assert rows() == before


@EXAMPLES
@given(body=JSON_VALUES, action=st.sampled_from(["cancel", "reschedule", "retry"]))
def test_any_action_body_changes_the_job_validly_or_is_refused(
    api: Api, body: Any, action: str
) -> None:
    job = api.post("jobs/", {"job_type": SCRIPTED, "delay": 3600}).json()
    before = rows()
    response = api.post(f"jobs/{job['id']}/{action}/", body)
    assert response.status_code < 500, response.content
    if response.status_code >= 400:
        assert rows() == before
