"""Procrastinate on its own database of the benchmark's PostgreSQL; also its App.

A worker fetches due jobs when PostgreSQL notifies it of a new job, or else every
``fetch_job_polling_interval``: a job deferred for later is only seen by that polling.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import version
from typing import Any, ClassVar

from procrastinate import App, PsycopgConnector

from benchmarks import bodies, harness
from benchmarks.systems.base import Job, System, aware, python

DATABASE = harness.peer_database("procrastinate")

app = App(connector=PsycopgConnector(conninfo=harness.conninfo(DATABASE)))


@app.task(name="bench.work")
def work(i: int, t: float) -> None:
    bodies.job(i, t)


class ProcrastinateSystem(System):
    name = "procrastinate"
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        "1x10-poll0.1": {
            "describe": "1 `procrastinate worker --concurrency 10 "
            "--fetch-job-polling-interval 0.1` (default 5 s), LISTEN/NOTIFY on",
            "processes": 1,
            "args": ["--concurrency", "10", "--fetch-job-polling-interval", "0.1"],
        },
        "2x10-poll0.1": {
            "describe": "2 x `procrastinate worker --concurrency 10 "
            "--fetch-job-polling-interval 0.1` (default 5 s), LISTEN/NOTIFY on",
            "processes": 2,
            "args": ["--concurrency", "10", "--fetch-job-polling-interval", "0.1"],
        },
    }

    def versions(self) -> dict[str, str]:
        return {"procrastinate": version("procrastinate"), "psycopg": version("psycopg")}

    def setup(self) -> None:
        # A run of several bodies sets up once per body: the schema comes with the database.
        if harness.create_database(DATABASE):
            with app.open():
                app.schema_manager.apply_schema()

    def reset(self) -> None:
        harness.truncate_tables(DATABASE, "procrastinate_")
        self._close()

    def _open(self) -> None:
        if not getattr(self, "_opened", False):
            app.open()
            self._opened = True

    def _close(self) -> None:
        if getattr(self, "_opened", False):
            app.close()
            self._opened = False

    def schedule_one(self, job: Job) -> None:
        self._open()
        i, t = job
        work.configure(schedule_at=aware(t)).defer(i=i, t=t)

    def schedule_many(self, jobs: Sequence[Job]) -> None:
        # batch_defer gives every job the same schedule_at; the job manager call under it
        # takes jobs with their own, in one INSERT.
        self._open()
        template = work.configure().job
        batch = [
            template.evolve(task_kwargs={"i": i, "t": t}, scheduled_at=aware(t)) for i, t in jobs
        ]
        app.job_manager.batch_defer_jobs(jobs=batch)

    @property
    def executors(self) -> int:
        return int(self.config["processes"])

    def consumer_commands(self) -> list[list[str]]:
        command = [
            python(),  # -m, not the console script: the app is found from the cwd
            "-m",
            "procrastinate",
            "--app",
            f"{__name__}.app",
            "worker",
            *self.config["args"],
        ]
        return [command] * int(self.config["processes"])
