"""Every test in tests/scale carries the ``scale`` marker, so the main runs leave it out.

The scenarios reuse the fault suite's harness (tests/faults): its servers, its ledger job
and its checks (nothing lost, no attempt run twice, a job runs twice only if a lease of a
consumer the fault hit expired). Their figures go to a results file of their own.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.conftest import fault_run, fault_services
from tests.faults.results import REPO_ROOT, Results, environment
from tests.faults.services import FaultServices

HERE = Path(__file__).resolve().parent
RESULTS_ENV = "DELAYJOBS_SCALE_RESULTS"
DEFAULT_RESULTS = REPO_ROOT / "build" / "scale" / "results.json"

__all__ = ["fault_run", "fault_services"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.scale)


@pytest.fixture(scope="session")
def fault_results(fault_services: FaultServices) -> Results:
    """This suite's figures, apart from the fault suite's (docs/reliability.md's)."""
    path = Path(os.environ.get(RESULTS_ENV) or DEFAULT_RESULTS)
    return Results(path, environment(fault_services.versions()))
