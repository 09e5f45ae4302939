"""Procrastinate on its own database of the benchmark's PostgreSQL; also its App.

A worker fetches due jobs when PostgreSQL notifies it of a new job, or else every
``fetch_job_polling_interval``: a job deferred for later is only seen by that polling.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any, ClassVar

from procrastinate import App, PsycopgConnector

from benchmarks import bodies, harness
from benchmarks.systems.base import Job, System, aware, python

DATABASE = "procrastinate"


def conninfo(database: str = DATABASE) -> str:
    settings = json.loads(os.environ.get(harness.DATABASE_ENV, "{}"))
    return (
        f"host={settings.get('HOST', '127.0.0.1')} port={settings.get('PORT', '5432')} "
        f"user={settings.get('USER', 'postgres')} dbname={database}"
    )


app = App(connector=PsycopgConnector(conninfo=conninfo()))


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
        import psycopg

        with psycopg.connect(conninfo("postgres"), autocommit=True) as connection:
            exists = connection.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
            ).fetchone()
            if not exists:
                connection.execute(f"CREATE DATABASE {DATABASE}")
        # A run of several bodies sets up once per body: the schema comes with the database.
        if not exists:
            with app.open():
                app.schema_manager.apply_schema()

    def reset(self) -> None:
        import psycopg

        with psycopg.connect(conninfo(), autocommit=True) as connection:
            tables = [
                row[0]
                for row in connection.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                )
            ]
            connection.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
            connection.execute("VACUUM ANALYZE")
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
