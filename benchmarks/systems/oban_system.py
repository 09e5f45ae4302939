"""Oban for Python (the ``oban`` package; Python >= 3.12, so its workers and its client run
in ``.venv-bench-py312``) on its own database of the benchmark's PostgreSQL.

Scheduling is ``Work.new(args, scheduled_at=...)`` through ``Oban.enqueue`` (one
``INSERT``), many at once through ``Oban.enqueue_many`` (one ``INSERT``), from an Oban
instance without queues in a client process (``benchmarks.remote``, ``oban_app``).

A job scheduled for later is ``scheduled`` until the stager, a loop of every node, makes
it ``available`` and wakes the queue's producer: every ``[stager] interval`` seconds (1 s
by default, so jobs start up to 1 s late; the one knob for that resolution). Best
configuration, from its docs ("Defining queues", "Ready for production", the CLI):

- ``oban start`` (its recommended way to run workers) on 2 processes, one per CPU: each
  is one asyncio event loop (uvloop), its node named by host and pid;
- queue ``bench`` with a limit of 20 jobs at once per node;
- stager interval 0.1 s (``benchmarks/systems/oban.toml``);
- ``--log-level WARNING``: the CLI's telemetry logger writes a line per job at INFO;
- workers must be ``async``; the bodies block, so each runs on a pool of as many threads
  as the queue's limit (``asyncio.to_thread``'s own pool has 6 on this machine);
  ``-inline`` configurations run it on the event loop instead, which a body that waits
  stalls, but which saves the hand-off to a thread for bodies that do not;
- job retention, pruning and rescue at their defaults.

Full run: see ``benchmarks/systems/bare_system.py``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from benchmarks import harness
from benchmarks.systems.base import RemoteScheduling, python312

DATABASE = harness.peer_database("oban")
CONFIG_FILE = "benchmarks/systems/oban.toml"
THREADS_ENV = "DELAYJOBS_BENCH_OBAN_THREADS"  # oban_app's: it is not loaded here


def _config(limit: int, threads: int) -> dict[str, Any]:
    where = f"{threads} threads" if threads else "the event loop"
    return {
        "describe": f"2 x `oban start --queues bench:{limit}` (uvloop), stager interval "
        f"0.1 s, bodies on {where}, `scheduled_at`, `enqueue_many`",
        "limit": limit,
        "threads": threads,
    }


class ObanSystem(RemoteScheduling):
    name = "oban"
    client_module = "benchmarks.systems.oban_app"
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        "2x20": _config(20, 20),
        "2x20-inline": _config(20, 0),
        "2x50": _config(50, 50),
    }

    def client_python(self) -> str:
        return python312()

    def consumer_env(self) -> dict[str, str]:
        return {
            **super().consumer_env(),
            "OBAN_DSN": harness.dsn(DATABASE),
            THREADS_ENV: str(self.config["threads"]),
        }

    def setup(self) -> None:
        if harness.create_database(DATABASE):
            harness.run_command(self._oban("install"), self.consumer_env())

    def reset(self) -> None:
        harness.truncate_tables(DATABASE, "oban_")

    def _oban(self, *args: str) -> list[str]:
        return [python312(), "-m", "oban", *args]

    @property
    def executors(self) -> int:
        return 2

    def consumer_commands(self) -> list[list[str]]:
        command = self._oban(
            "start",
            "--config",
            CONFIG_FILE,
            "--queues",
            f"bench:{self.config['limit']}",
            "--log-level",
            "WARNING",
        )
        return [command] * self.executors
