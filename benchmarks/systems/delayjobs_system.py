"""delayjobs: ``manage.py run_delay_consumer`` processes on the durable PostgreSQL.

The pre-loader runs inside the consumers (a Redis lock keeps it to one at a time), so
the consumer side is exactly the consumer processes: with the default configuration, the
command's supervisor and the consumer processes it forks (one per CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import version
from typing import Any, ClassVar

from benchmarks import harness
from benchmarks.delay_jobs import RECORD_JOB_TYPE
from benchmarks.systems.base import Job, System, aware, python


def usable_cpus() -> int:
    """How many consumer processes the command's default starts (delayjobs' own count)."""
    from delayjobs.engine.supervisor import usable_cpus as count

    return count()


class DelayJobsSystem(System):
    name = "delayjobs"
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        # What users run: `run_delay_consumer` with no option at all. One consumer process
        # per CPU under one supervisor (two on this 2-vCPU machine), DELAYJOBS' default
        # threads each; whatever the defaults are when the suite runs.
        "default": {"processes": None, "concurrency": None},
        # One process (--processes 1) per command, as many commands as "processes".
        "1x20": {"processes": 1, "concurrency": 20},
        "2x10": {"processes": 2, "concurrency": 10},
        "1x10": {"processes": 1, "concurrency": 10},
        # For job bodies that wait on I/O: more threads (or async job types).
        "1x50": {"processes": 1, "concurrency": 50},
        "2x25": {"processes": 2, "concurrency": 25},
        "2x32": {"processes": 2, "concurrency": 32},
        "2x50": {"processes": 2, "concurrency": 50},
    }

    def versions(self) -> dict[str, str]:
        return {"django-delayjobs": version("django-delayjobs"), "django": version("django")}

    def describe(self) -> str:
        if self.config["processes"] is None:
            from delayjobs.conf import settings

            return (
                f"`run_delay_consumer` with no option: {usable_cpus()} consumer processes (one "
                f"per CPU) x {settings.CONCURRENCY} threads, under its supervisor; pre-loader "
                f"in the first; default DELAYJOBS settings"
            )
        return (
            f"{self.config['processes']} x `run_delay_consumer --processes 1 --concurrency "
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
        processes = self.config["processes"]
        return usable_cpus() if processes is None else int(processes)

    def consumer_commands(self) -> list[list[str]]:
        if self.config["processes"] is None:
            return [[python(), "manage.py", "run_delay_consumer"]]
        command = [
            python(),
            "manage.py",
            "run_delay_consumer",
            "--processes",
            "1",
            "--concurrency",
            str(self.config["concurrency"]),
            "--verbosity",
            "0",
        ]
        return [command] * int(self.config["processes"])

    def consumer_env(self) -> dict[str, str]:
        return {**super().consumer_env(), "DJANGO_SETTINGS_MODULE": harness.SETTINGS_MODULE}
