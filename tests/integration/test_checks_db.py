"""delayjobs' system checks inside Django's full check run, which needs a database.

The settings checks themselves are unit tests (tests/unit/test_checks.py).
"""

from __future__ import annotations

import pytest
from django.core import checks

from delayjobs.checks import check_settings
from tests.unit.test_checks import delayjobs_ids, delayjobs_settings  # noqa: F401 (a fixture)


# Django's full check run includes model checks, which on Django 6 query the database
# (JSONField support), hence the database mark on the two tests that run them all.
@pytest.mark.django_db
def test_test_settings_pass_every_delayjobs_check():
    assert check_settings() == []
    assert delayjobs_ids(checks.run_checks()) == []


@pytest.mark.django_db
def test_checks_are_registered_with_django(delayjobs_settings):  # noqa: F811 (the fixture)
    delayjobs_settings(PRELOAD_INTERVAL=60, PRELOAD_WINDOW=30)
    assert delayjobs_ids(checks.run_checks()) == ["delayjobs.E006"]
    assert delayjobs_ids(checks.run_checks(tags=["delayjobs"])) == ["delayjobs.E006"]
    # `manage.py check --tag delayjobs` runs them alone.
    assert delayjobs_ids(checks.run_checks(tags=[checks.Tags.models])) == []
