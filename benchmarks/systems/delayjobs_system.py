"""delayjobs: ``manage.py run_delay_consumer`` processes on the durable PostgreSQL.

The pre-loader runs inside the consumers (a Redis lock keeps it to one at a time), so
the consumer side is exactly the consumer processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import version
from typing import Any, ClassVar

from benchmarks import harness
from benchmarks.delay_jobs import RECORD_JOB_TYPE
from benchmarks.systems.base import Job, System, aware, python


class DelayJobsSystem(System):
    name = "delayjobs"
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        # One process of 20 threads: on this 2-vCPU machine, with PostgreSQL and Redis on
        # the same CPUs, a second process adds ~60 MB (Django, psycopg, redis loaded again)
        # and competes with the first for the CPUs at every due moment (W1 p99 1.5 ms
        # instead of 0.4 ms), for ~10% more W2 throughput. Measured in docs/benchmarks.md.
        "1x20": {"processes": 1, "concurrency": 20},
        "2x10": {"processes": 2, "concurrency": 10},
        "1x10": {"processes": 1, "concurrency": 10},
        # For job bodies that wait on I/O: more threads (or async job types).
        "1x50": {"processes": 1, "concurrency": 50},
        "2x25": {"processes": 2, "concurrency": 25},
        "2x50": {"processes": 2, "concurrency": 50},
    }

    def versions(self) -> dict[str, str]:
        return {"django-delayjobs": version("django-delayjobs"), "django": version("django")}

    def describe(self) -> str:
        return (
            f"{self.config['processes']} x `run_delay_consumer --concurrency "
            f"{self.config['concurrency']}` (pre-loader in-process), default DELAYJOBS settings"
        )

    def reset(self) -> None:
        harness.reset_state()

    def schedule_one(self, job: Job) -> None:
        import delayjobs

        job_id, run_at = job
        delayjobs.schedule(RECORD_JOB_TYPE, {"i": job_id, "t": run_at}, run_at=aware(run_at))

    def schedule_many(self, jobs: Sequence[Job]) -> None:
        import delayjobs

        delayjobs.schedule_many(
            [
                {"job_type": RECORD_JOB_TYPE, "payload": {"i": i, "t": t}, "run_at": aware(t)}
                for i, t in jobs
            ]
        )

    @property
    def executors(self) -> int:
        return int(self.config["processes"])

    def consumer_commands(self) -> list[list[str]]:
        command = [
            python(),
            "manage.py",
            "run_delay_consumer",
            "--concurrency",
            str(self.config["concurrency"]),
            "--verbosity",
            "0",
        ]
        return [command] * int(self.config["processes"])

    def consumer_env(self) -> dict[str, str]:
        return {**super().consumer_env(), "DJANGO_SETTINGS_MODULE": harness.SETTINGS_MODULE}
