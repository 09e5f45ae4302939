"""Which system checks ``run_delay_consumer`` runs before it starts: delayjobs' checks of
what a consumer reads (its settings, the job types), not the HTTP API's nor Django's, which
import the project's URLconf."""

from __future__ import annotations

from django.core.checks.registry import registry

from delayjobs.checks import CONSUMER_CHECKS, check_job_types, check_settings
from delayjobs.management.commands.run_delay_consumer import Command


def test_the_consumer_runs_the_checks_of_its_settings_and_job_types_only() -> None:
    assert Command.requires_system_checks == [CONSUMER_CHECKS]
    tagged = {check for check in registry.get_checks() if CONSUMER_CHECKS in check.tags}
    assert tagged == {check_settings, check_job_types}
