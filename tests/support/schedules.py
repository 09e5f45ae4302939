"""Recurring job types for the schedules' admin tests (integration and browser), registered
only by the ``code_types`` fixture: in tests/delay_jobs.py every test would get tick jobs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import delayjobs
from delayjobs.jobtypes import registry
from delayjobs.models import DelayedJob


class Nightly(delayjobs.JobType):
    """A code schedule in a time zone of its own, ticking days apart: its ticks in the
    list are stable to read."""

    name = "tests.admin_nightly"
    recurrence = delayjobs.Cron("0 8 * * MON-FRI", tz="Europe/Berlin")

    def execute(self, job: DelayedJob) -> None:
        pass


class Ticking(delayjobs.JobType):
    """A code schedule with ticks in every pre-load window: jobs for a pause to cancel."""

    name = "tests.admin_ticking"
    recurrence = delayjobs.Every(seconds=10)

    def execute(self, job: DelayedJob) -> None:
        pass


@pytest.fixture
def code_types() -> Iterator[None]:
    registry.add(Nightly)
    registry.add(Ticking)
    yield
    registry.remove(Nightly.name)
    registry.remove(Ticking.name)
