"""The HTTP API against its own OpenAPI document, with Schemathesis.

Every built-in check Schemathesis has runs on every operation, with requests generated from
the document both valid (which must be accepted: a 400 for a request the document calls
valid is a lie in the document) and invalid (which must be refused). Then the stateful
phase follows the document's links from POST /jobs/ to the operations on the job made.
Bounded numbers of examples, derandomized: the same requests in every CI run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from delayjobs import api_keys as keys
from delayjobs.models import DelayedJob
from tests.utils import fuzz_settings

pytestmark = pytest.mark.django_db

DOCUMENT = "/delayjobs/api/openapi.json"
schema = schemathesis.openapi.from_wsgi(DOCUMENT, get_wsgi_application())

#: Per operation: the API has 8, so about 400 requests, in a few seconds.
EXAMPLES = fuzz_settings(max_examples=50)


@pytest.fixture(autouse=True)
def connections_kept_open() -> Iterator[None]:
    """The WSGI handler closes the database connection after each request, as it should
    in production; here that would end the test's transaction. Django's test client
    disconnects the same receiver."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


# Each test's key: its database rows are rolled back after the test.
current_key: dict[str, str] = {}


@schema.auth(refresh_interval=None)
class SuperuserKey:
    """The API key of the test's superuser, on every request but those Schemathesis makes
    without it on purpose (its ignored_auth check): a provider, not fixed headers."""

    def get(self, case: Any, context: Any) -> str:
        # Asked once at collection too, before any test has a key: then no key is sent.
        return current_key.get("plaintext", "")

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture(autouse=True)
def superuser_key() -> Iterator[None]:
    """A superuser's key: every operation is allowed, so a refusal is about the request."""
    user = User.objects.create_superuser("schemathesis", "st@example.com", "x")
    current_key["plaintext"] = keys.create_api_key(user, "schemathesis")[1]
    yield
    current_key.clear()


@schema.parametrize()
@EXAMPLES
def test_every_operation_keeps_its_document(case: Any) -> None:
    case.call_and_validate()


def test_operations_linked_from_a_new_job_keep_the_document() -> None:
    """POST /jobs/, then what its links lead to (get, cancel, reschedule, retry the job),
    in generated sequences."""
    run_state_machine_as_test(
        FromTheSameState, settings=settings(EXAMPLES, max_examples=25, stateful_step_count=6)
    )


class FromTheSameState(schema.as_state_machine()):
    """Each sequence starts with no jobs. Hypothesis replays a sequence to shrink it or to
    check it: with the previous sequence's jobs still there, a key it used would be taken
    (409 instead of 201) and the replay would take another path ("Inconsistent data
    generation")."""

    def teardown(self) -> None:
        DelayedJob.objects.all().delete()


# What the document says beyond generated requests: tests/integration/test_http_openapi.py
