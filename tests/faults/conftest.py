"""Fixtures of the fault suite: its own servers, the results file, one run per scenario."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.harness import FaultRun, fault_runs
from tests.faults.results import Results, environment, results_path
from tests.faults.services import FaultServices


@pytest.fixture(scope="session")
def fault_services() -> Iterator[FaultServices]:
    """A PostgreSQL and a Redis for the suite alone, migrated; stopped by pid at the end."""
    services = FaultServices().start()
    try:
        yield services
    finally:
        services.stop()


@pytest.fixture(scope="session")
def fault_results(fault_services: FaultServices) -> Results:
    return Results(results_path(), environment(fault_services.versions()))


@pytest.fixture
def fault_run(
    fault_services: FaultServices, fault_results: Results, tmp_path: Path
) -> Iterator[Callable[[str, str], FaultRun]]:
    """Factory ``fault_run(scenario, title)``; its consumers are SIGKILLed at teardown."""
    with fault_runs(fault_services, fault_results, tmp_path) as start:
        yield start
