"""The figures of the fault suite's latest run, kept in a JSON file for the report.

Each scenario's figures are written as soon as it ends (passed or failed), merged into
what the file already holds, so running one scenario alone updates only its entry.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.harness import cpu_model, git_commit

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_ENV = "DELAYJOBS_FAULTS_RESULTS"
DEFAULT_PATH = REPO_ROOT / "build" / "faults" / "results.json"


def results_path() -> Path:
    return Path(os.environ.get(RESULTS_ENV) or DEFAULT_PATH)


class Results:
    def __init__(self, path: Path, environment: dict[str, Any]) -> None:
        self.path = path
        self.environment = environment

    def load(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            data = {}
        data.setdefault("scenarios", {})
        return data

    def record(self, scenario: str, figures: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Scenarios of one file may end at once in two pytest-xdist workers (.ci/scale):
        # one merges at a time, or the other's entry would be lost.
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self.load()
            data["scenarios"][scenario] = {**figures, "environment": self.environment}
            temporary = self.path.with_suffix(".tmp")
            temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
            temporary.replace(self.path)


def environment(versions: dict[str, str]) -> dict[str, Any]:
    """Machine, versions and commit, stored with each scenario's figures."""
    import django

    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "load_average": [round(value, 2) for value in os.getloadavg()],
        **versions,
    }
