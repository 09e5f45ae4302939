"""The interface every system adapter implements, so that the workloads treat them alike.

A job is ``(job_id, run_at)``: an int, and the epoch seconds it is due at. What it does is
``benchmarks.bodies.job(job_id, run_at)`` in every system: record its start, then the body
selected for the run (``DELAYJOBS_BENCH_BODY``, inherited from the driver's environment).
"""

from __future__ import annotations

import os
import sys
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from benchmarks import harness, remote
from benchmarks.records import RECORD_DIR_ENV

Job = tuple[int, float]


def aware(timestamp: float) -> datetime:
    """An aware UTC datetime from epoch seconds, microseconds kept."""
    return datetime.fromtimestamp(timestamp, UTC)


class System(ABC):
    """One job system: how it schedules, and its consumer processes."""

    name: ClassVar[str]
    #: Configuration name -> parameters; the first one is the default.
    configs: ClassVar[dict[str, dict[str, Any]]]
    #: True if schedule_many uses a bulk API of the system; False: it loops.
    has_bulk: ClassVar[bool] = True

    def __init__(self, config: str | None = None) -> None:
        self.config_name = config or next(iter(self.configs))
        if self.config_name not in self.configs:
            raise ValueError(f"{self.name}: unknown configuration {self.config_name!r}")
        self.config = self.configs[self.config_name]
        self.group: harness.ProcessGroup | None = None
        #: Where the system's own processes log (the suite sets the run's work directory).
        self.log_dir = Path(tempfile.gettempdir())

    # Set-up and data ----------------------------------------------------------------

    @abstractmethod
    def versions(self) -> dict[str, str]:
        """Package versions that matter for this system."""

    def describe(self) -> str:
        """The configuration in words, for the report."""
        return str(self.config["describe"])

    def setup(self) -> None:  # noqa: B027 - optional hook
        """Once per suite, servers up: schemas and the like."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """After the system's last run: processes of its own beyond the consumers."""

    @abstractmethod
    def reset(self) -> None:
        """Remove every job and every trace of earlier runs (consumers are stopped)."""

    # Scheduling ---------------------------------------------------------------------

    @abstractmethod
    def schedule_one(self, job: Job) -> None:
        """The system's usual call for one delayed job."""

    @abstractmethod
    def schedule_many(self, jobs: Sequence[Job]) -> None:
        """The system's fastest way to schedule many jobs (a loop if it has none)."""

    # Consumers ----------------------------------------------------------------------

    #: Processes that execute jobs (write records); readiness waits for all of them.
    @property
    @abstractmethod
    def executors(self) -> int: ...

    @abstractmethod
    def consumer_commands(self) -> list[list[str]]:
        """Commands of the consumer processes (at most 2 OS processes in all)."""

    def consumer_env(self) -> dict[str, str]:
        return dict(os.environ)

    def start_consumers(self, record_dir: Path, log_dir: Path) -> harness.ProcessGroup:
        env = {**self.consumer_env(), RECORD_DIR_ENV: str(record_dir)}
        self.group = harness.ProcessGroup(log_dir, env)
        for command in self.consumer_commands():
            self.group.start(command, self.name)
        return self.group

    def stop_consumers(self) -> None:
        if self.group is not None:
            self.group.stop()
            self.group = None


def python() -> str:
    return sys.executable


def script(name: str) -> str:
    """A console script of the benchmark's venv (celery, huey_consumer.py, rq, ...)."""
    return str(Path(sys.executable).parent / name)


#: The Python of the venv for the peers that need Python 3.12 (Oban, dj-queue): run.sh
#: creates it and exports its path.
PY312_ENV = "DELAYJOBS_BENCH_PY312"


def python312() -> str:
    default = harness.REPO_ROOT / ".venv-bench-py312" / "bin" / "python"
    return os.environ.get(PY312_ENV) or str(default)


class RemoteScheduling(System):
    """A system whose scheduling calls run in a client process (``benchmarks.remote``):
    ``client_module`` is the module it serves, run by ``client_python()`` in
    ``consumer_env()``, the environment of the consumers."""

    client_module: ClassVar[str]

    def __init__(self, config: str | None = None) -> None:
        super().__init__(config)
        self._client: remote.Client | None = None

    def client_python(self) -> str:
        return python()

    @property
    def client(self) -> remote.Client:
        if self._client is None:
            log = self.log_dir / f"{self.name}-client.log"
            env = self.consumer_env()
            self._client = remote.Client(self.client_python(), self.client_module, env, log)
        return self._client

    def versions(self) -> dict[str, str]:
        versions: dict[str, str] = self.client.call("versions")
        return versions

    def schedule_one(self, job: Job) -> None:
        self.client.call("schedule_one", job)

    def schedule_many(self, jobs: Sequence[Job]) -> None:
        self.client.call("schedule_many", list(jobs))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
