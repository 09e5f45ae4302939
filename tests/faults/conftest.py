"""Fixtures of the fault suite: its own servers, the results file, one run per scenario."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.harness import FaultRun
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
    runs: list[FaultRun] = []

    def start(scenario: str, title: str) -> FaultRun:
        run = FaultRun(scenario, title, fault_services, tmp_path, fault_results)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.stop_all()
