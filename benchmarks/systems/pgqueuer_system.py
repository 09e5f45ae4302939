"""PgQueuer on its own database of the benchmark's PostgreSQL; also the factory its
``pgq run`` workers load.

Scheduling is ``Queries.enqueue(..., execute_after=...)`` through PgQueuer's synchronous
driver on psycopg (one ``INSERT``; a list of jobs is one ``INSERT`` too). ``execute_after``
takes a delay, not a time (its docs): each job's is its run_at less the clock at the call,
added by PostgreSQL to its own ``NOW()``, so a job can be late by the call's round trip
but never early.

The worker's best configuration, from PgQueuer's docs ("Performance tuning"; "Deferred
execution"; the CLI reference):

- 2 ``pgq run`` processes (one per CPU): each is one asyncio event loop;
- a direct asyncpg connection for the queue manager, as its tuning guide advises;
- ``--batch-size 10`` (its default) and ``--max-concurrent-tasks 20``, the least it
  allows (twice the batch), enough to keep 20 threads busy;
- a job due later is found by the manager itself: between batches it sleeps until the
  earliest ``execute_after`` (or a NOTIFY of a new job), so no polling interval to tune;
- entrypoints must be ``async``; for blocking code its docs say to wrap it in
  ``asyncio.to_thread``: each job's body runs on a thread pool of as many threads as
  tasks may run at once (``asyncio.to_thread``'s default pool has 6 on this machine);
  ``-inline`` configurations run it on the event loop instead, which a body that waits
  stalls, but which saves the hand-off to a thread for bodies that do not;
- the schema's default durability (every table logged, as every system here is durable),
  and the autovacuum settings its checklist recommends (``pgq autovac``); ``-balanced``
  configurations leave its log and statistics tables unlogged, as its docs offer ("~2x").

Full run: see ``benchmarks/systems/bare_system.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import timedelta
from importlib.metadata import version
from typing import Any, ClassVar

from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver, SyncPsycopgDriver
from pgqueuer.models import Job as PgqJob
from pgqueuer.queries import SyncQueries

from benchmarks import bodies, harness
from benchmarks.systems.base import Job, System, python

DATABASE = harness.peer_database("pgqueuer")
ENTRYPOINT = "bench.work"


@asynccontextmanager
async def factory(args: Sequence[str] = ("0",)) -> AsyncIterator[PgQueuer]:
    """The worker's PgQueuer: ``pgq run benchmarks.systems.pgqueuer_system:factory --
    THREADS``; 0 threads: bodies run on the event loop."""
    import asyncpg

    threads = int(args[0])
    connection = await asyncpg.connect(harness.dsn(DATABASE))
    pgq = PgQueuer(AsyncpgDriver(connection))
    pool = ThreadPoolExecutor(max_workers=threads) if threads else None

    @pgq.entrypoint(ENTRYPOINT)
    async def work(job: PgqJob) -> None:
        job_id, run_at = json.loads(job.payload or b"")
        if pool is None:
            bodies.job(job_id, run_at)
        else:
            await asyncio.get_running_loop().run_in_executor(pool, bodies.job, job_id, run_at)

    try:
        yield pgq
    finally:
        await connection.close()


def _config(threads: int, batch: int, durability: str = "durable") -> dict[str, Any]:
    where = f"{threads} threads" if threads else "the event loop"
    return {
        "describe": f"2 x `pgq run --batch-size {batch} --max-concurrent-tasks "
        f"{max(threads, 2 * batch)}`, asyncpg connection, bodies on {where}, "
        f"`execute_after`, {durability} tables, `pgq autovac`",
        "threads": threads,
        "batch": batch,
        "durability": durability,
    }


class PgQueuerSystem(System):
    name = "pgqueuer"
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        "2x20": _config(20, 10),
        "2x20-inline": _config(0, 10),
        "2x50": _config(50, 25),
        "2x20-balanced": _config(20, 10, "balanced"),
    }

    def __init__(self, config: str | None = None) -> None:
        super().__init__(config)
        self._connection: Any = None
        self._queries: SyncQueries | None = None

    @property
    def queries(self) -> SyncQueries:
        if self._queries is None:
            import psycopg

            self._connection = psycopg.connect(harness.conninfo(DATABASE), autocommit=True)
            self._queries = SyncQueries(SyncPsycopgDriver(self._connection))
        return self._queries

    def versions(self) -> dict[str, str]:
        return {"pgqueuer": version("pgqueuer"), "asyncpg": version("asyncpg")}

    def setup(self) -> None:
        if harness.create_database(DATABASE):
            self._pgq("install")
            self._pgq("autovac")
        self._pgq("durability", self.config["durability"])

    def _pgq(self, *args: str) -> None:
        harness.run_command([python(), "-m", "pgqueuer", "--pg-dsn", harness.dsn(DATABASE), *args])

    def reset(self) -> None:
        harness.truncate_tables(DATABASE, "pgqueuer")

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = self._queries = None

    def schedule_one(self, job: Job) -> None:
        delay = timedelta(seconds=job[1] - time.time())
        self.queries.enqueue(ENTRYPOINT, _payload(job), 0, execute_after=delay)

    def schedule_many(self, jobs: Sequence[Job]) -> None:
        now = time.time()
        self.queries.enqueue(
            [ENTRYPOINT] * len(jobs),
            [_payload(job) for job in jobs],
            [0] * len(jobs),
            execute_after=[timedelta(seconds=run_at - now) for _, run_at in jobs],
        )

    @property
    def executors(self) -> int:
        return 2

    def consumer_commands(self) -> list[list[str]]:
        batch, threads = self.config["batch"], self.config["threads"]
        command = [
            python(),
            "-m",
            "pgqueuer",
            "run",
            f"{__name__}:factory",
            "--batch-size",
            str(batch),
            "--max-concurrent-tasks",
            str(max(threads, 2 * batch)),
            "--",
            str(threads),
        ]
        return [command] * self.executors


def _payload(job: Job) -> bytes:
    return json.dumps(job).encode()
