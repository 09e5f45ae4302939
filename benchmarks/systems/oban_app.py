"""Oban for Python's side of its benchmark, in ``.venv-bench-py312``: the worker its
``oban start`` processes run, and its scheduling client (``benchmarks.remote`` serves this
module's functions). See ``oban_system`` for the configuration.

The database comes from ``OBAN_DSN``, which Oban's CLI and ``Oban.create_pool`` read; the
threads that run the bodies from ``DELAYJOBS_BENCH_OBAN_THREADS`` (0: on the event loop).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import cache
from importlib.metadata import version
from typing import Any

from oban import Oban, worker

from benchmarks import bodies

QUEUE = "bench"
THREADS_ENV = "DELAYJOBS_BENCH_OBAN_THREADS"


@cache
def _threads() -> ThreadPoolExecutor | None:
    threads = int(os.environ.get(THREADS_ENV) or 0)
    return ThreadPoolExecutor(max_workers=threads) if threads else None


@worker(queue=QUEUE, max_attempts=1)
class Work:
    """The benchmark's job; a blocking body goes to a thread, as asyncio code must."""

    async def process(self, job: Any) -> None:
        job_id, run_at = job.args["i"], job.args["t"]
        pool = _threads()
        if pool is None:
            bodies.job(job_id, run_at)
        else:
            await asyncio.get_running_loop().run_in_executor(pool, bodies.job, job_id, run_at)


# The scheduling client: an Oban instance without queues (its "client mode") on one loop.

_loop = asyncio.new_event_loop()


@cache
def _client() -> Oban:
    async def start() -> Oban:
        return Oban(pool=await Oban.create_pool())

    return _loop.run_until_complete(start())


def _job(job: Sequence[Any]) -> Any:
    job_id, run_at = job
    return Work.new({"i": job_id, "t": run_at}, scheduled_at=datetime.fromtimestamp(run_at, UTC))


def versions() -> dict[str, str]:
    return {"oban": version("oban"), "psycopg": version("psycopg")}


def schedule_one(job: Sequence[Any]) -> None:
    _loop.run_until_complete(_client().enqueue(_job(job)))


def schedule_many(jobs: Sequence[Sequence[Any]]) -> None:
    _loop.run_until_complete(_client().enqueue_many([_job(job) for job in jobs]))
