"""The HTTP API's OpenAPI document (ninja's, served at openapi.json): valid, public, and
saying what the API does: permissions, errors, bounds, links. Schemathesis checks the API
against it with generated requests (test_openapi_conformance.py); these check what
generated requests cannot show."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi

from delayjobs.conf import settings as conf
from delayjobs.http.schemas import RFC3339, digits_between
from delayjobs.jobtypes import registry
from tests.integration.http_client import (
    ALL_PERMISSIONS,
    BASE,
    JSON,
    SCRIPTED,
    Api,
    document,
    key_of,
    make_user,
)
from tests.integration.test_admin import make_job

pytestmark = pytest.mark.django_db

VIEW = "delayjobs.view_delayedjob"
#: Every operation, and the permissions it needs.
PERMISSIONS = {
    "scheduleJob": ["delayjobs.add_delayedjob"],
    "scheduleJobs": ["delayjobs.add_delayedjob"],
    "listJobs": [VIEW],
    "getJob": [VIEW],
    "cancelJob": ["delayjobs.cancel_delayedjob", VIEW],
    "cancelJobByKey": ["delayjobs.cancel_delayedjob", VIEW],
    "rescheduleJob": ["delayjobs.reschedule_delayedjob", VIEW],
    "retryJob": ["delayjobs.retry_delayedjob", VIEW],
}
WRITES = {"scheduleJob", "scheduleJobs", "cancelJob", "cancelJobByKey", "rescheduleJob", "retryJob"}


def operations(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        item["operationId"]: item for methods in doc["paths"].values() for item in methods.values()
    }


def test_the_document_is_public_and_valid(client: Client) -> None:
    served = client.get(reverse("delayjobs_api:openapi-json"))
    assert served.status_code == 200
    doc = served.json()
    validate_openapi(doc)
    assert doc["openapi"] == "3.1.0"
    assert set(doc["paths"]) == {
        f"{BASE}jobs/",
        f"{BASE}jobs/bulk/",
        f"{BASE}jobs/cancel/",
        f"{BASE}jobs/{{job_id}}/",
        f"{BASE}jobs/{{job_id}}/cancel/",
        f"{BASE}jobs/{{job_id}}/reschedule/",
        f"{BASE}jobs/{{job_id}}/retry/",
    }
    schemes = doc["components"]["securitySchemes"]
    assert schemes["ApiKeyAuth"]["scheme"] == "bearer"
    assert (schemes["StaffSessionAuth"]["in"], schemes["StaffSessionAuth"]["name"]) == (
        "cookie",
        "sessionid",
    )
    assert {"skipped", "expired"} <= set(doc["components"]["schemas"]["JobStatus"]["enum"])


def test_every_operation_names_its_permissions_its_auth_and_its_errors() -> None:
    described = operations(document())
    assert set(described) == set(PERMISSIONS)
    for operation_id, item in described.items():
        assert item["x-permissions"] == PERMISSIONS[operation_id]
        assert item["security"] == [{"ApiKeyAuth": []}, {"StaffSessionAuth": []}]
        responses = item["responses"]
        assert {"401", "403", "405", "422", "500"} <= set(responses), operation_id
        assert "WWW-Authenticate" in responses["401"]["headers"]
        assert "Allow" in responses["405"]["headers"]
        assert responses["422"]["description"].endswith(": invalid")
        assert responses["403"]["description"].endswith(": permission_denied, csrf_failed")
        # A write may meet a deadlock (503); a read never does.
        assert ("503" in responses) == (operation_id in WRITES), operation_id
    error = document()["components"]["schemas"]["Error"]
    assert set(error["required"]) == {"error", "detail", "fields"}
    assert "duplicate_key" in error["properties"]["error"]["enum"]


def test_the_document_promises_no_404_where_none_can_come() -> None:
    described = operations(document())
    assert "404" not in described["listJobs"]["responses"]
    assert "404" not in described["scheduleJob"]["responses"]
    assert "404" not in described["scheduleJobs"]["responses"]
    assert "404" in described["cancelJobByKey"]["responses"]
    assert "404" in described["rescheduleJob"]["responses"]
    assert "409" not in described["getJob"]["responses"]


def test_the_api_is_mounted_under_its_namespace() -> None:
    assert reverse("delayjobs_api:jobs") == f"{BASE}jobs/"
    assert reverse("delayjobs_api:job", kwargs={"job_id": 7}) == f"{BASE}jobs/7/"
    assert reverse("delayjobs_api:openapi-json") == f"{BASE}openapi.json"


def request_schema(operation_id: str) -> Draft202012Validator:
    """A validator of the request body of one operation, as the document describes it."""
    content = operations(document())[operation_id]["requestBody"]["content"]
    return Draft202012Validator({**content[JSON]["schema"], **document()})


def test_the_document_describes_the_bodies_the_api_takes_and_refuses(client: Client) -> None:
    """Every body below is sent to the API too: the schema accepts exactly what it takes."""
    api = Api(client, key_of(make_user(*ALL_PERMISSIONS)))
    job = make_job(delay=timedelta(hours=1))
    at = "2030-01-15T14:30:00Z"
    cases = [
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "run_at": None, "delay": 5}, True),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "run_at": at}, True),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "run_at": at, "delay": 5}, False),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "max_attempts": 3.0}, True),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "max_attempts": 0}, False),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "max_lateness": 0.001}, True),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "max_lateness": 0.0009}, False),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "max_lateness": 366 * 86400}, True),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "max_lateness": 366 * 86400 + 1}, False),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "queue": "a.b-c_1"}, True),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "queue": "a b"}, False),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "priority": -101}, False),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "replace": True}, False),
        ("scheduleJob", "jobs/", {"job_type": SCRIPTED, "payload": {"a": ["\x00"]}}, False),
        ("scheduleJob", "jobs/", {"job_type": "tests.no_such_type"}, False),
        ("rescheduleJob", f"jobs/{job.pk}/reschedule/", {"delay": 5}, True),
        ("rescheduleJob", f"jobs/{job.pk}/reschedule/", {"run_at": at}, True),
        ("rescheduleJob", f"jobs/{job.pk}/reschedule/", {"run_at": "2030-01-15"}, False),
    ]
    for operation_id, route, body, valid in cases:
        assert request_schema(operation_id).is_valid(body) == valid, (operation_id, body)
        response = api.post(route, body)
        assert (response.status_code < 400) == valid, (body, response.json())


def test_the_document_lists_the_public_job_types_only() -> None:
    job_type = document()["components"]["schemas"]["ScheduleIn"]["properties"]["job_type"]
    public = sorted(name for name in registry.names() if registry.get(name).public)
    assert public and set(registry.names()) - set(public), "the test project has both"
    assert job_type["enum"] == public


def test_the_document_bounds_every_field_the_api_bounds() -> None:
    fields = document()["components"]["schemas"]["ScheduleIn"]["properties"]
    delay = fields["delay"]["anyOf"][0]
    assert (delay["minimum"], delay["maximum"]) == (0, conf.MAX_SCHEDULE_AHEAD.total_seconds())
    assert fields["key"]["anyOf"][0]["pattern"] == "^[^\\x00]*$"
    assert fields["payload"]["$ref"] == "#/components/schemas/Payload"
    payload = document()["components"]["schemas"]["Payload"]
    assert (payload["x-maxDepth"], payload["x-maxBytes"]) == (64, 64 * 1024)
    run_at = fields["run_at"]["anyOf"][0]
    assert run_at["format"] == "date-time"
    assert run_at["pattern"].startswith(f"^{digits_between(2, 2125, 4)}-")
    rules = document()["components"]["schemas"]["ScheduleIn"]
    assert rules["if"]["properties"]["replace"] == {"const": True}  # replace needs a key


def test_digits_between_matches_exactly_the_numbers_in_range() -> None:
    for low, high in ((2, 2125), (0, 9999), (100, 199), (1999, 2000), (7, 7)):
        pattern = re.compile(digits_between(low, high, 4))
        matched = [n for n in range(10_000) if pattern.fullmatch(str(n).zfill(4))]
        assert matched == list(range(low, high + 1)), (low, high)


def test_the_rfc3339_pattern_takes_what_json_schema_calls_a_date_time() -> None:
    pattern = re.compile(RFC3339.format(year="[0-9]{4}"))
    for text in (
        "2030-01-15T14:30:00Z",
        "2030-01-15t14:30:00.123456789z",
        "2030-01-15T14:30:00-23:59",
    ):
        assert pattern.fullmatch(text), text
    for text in (
        "2030-01-15T14:30Z",
        "2030-01-15 14:30:00Z",
        "20300115T143000Z",
        "2030-01-15T14:30:60Z",
    ):
        assert not pattern.fullmatch(text), text


def test_a_new_job_links_to_the_operations_on_it() -> None:
    created = operations(document())["scheduleJob"]["responses"]["201"]
    assert {name: link["operationId"] for name, link in created["links"].items()} == {
        "getJob": "getJob",
        "cancelJob": "cancelJob",
        "rescheduleJob": "rescheduleJob",
        "retryJob": "retryJob",
    }
    assert all(
        link["parameters"] == {"job_id": "$response.body#/id"} for link in created["links"].values()
    )
