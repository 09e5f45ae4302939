"""The recorder in a consumer process: an outcome PostgreSQL text cannot hold is still written.

Moved out of tests/integration/test_recorder.py: it starts a consumer process.
"""

from __future__ import annotations

import pytest

import delayjobs
from delayjobs.models import JobAttempt, JobStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


def test_an_error_text_with_a_nul_character_is_recorded(consumer_process):
    """PostgreSQL text cannot hold NUL: the consumer escapes it instead of losing the outcome."""
    job = delayjobs.schedule("tests.nul_error")
    consumer = consumer_process("--burst", "--queue", "default")
    assert consumer.wait(60) == 0, consumer.output()
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert "\\x00" in job.last_error
    attempt = JobAttempt.objects.get(job=job)
    assert "\\x00" in attempt.error and "\\x00" in attempt.traceback
