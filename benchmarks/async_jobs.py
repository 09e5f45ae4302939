"""The async job types of ``benchmarks.async_throughput``.

Not autodiscovered (``benchmarks/delay_jobs.py`` is the app's module): the benchmark's
processes load them through ``benchmarks.async_settings``, which imports this module.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING

import redis.asyncio

import delayjobs
from benchmarks.environment import REDIS_URL_ENV

if TYPE_CHECKING:
    from delayjobs.models import DelayedJob

ASYNC_QUEUE = "bench-async"
SLEEP_JOB_TYPE = "bench.async_sleep10"
REDIS_JOB_TYPE = "bench.async_redis"
SYNC_SLEEP_JOB_TYPE = "bench.sync_sleep10"
#: The list the redis body pushes to (database 1: apart from delayjobs' own keys).
PUSH_KEY = "bench:async:pushes"
#: Connections of the redis body's own pool: bodies beyond it wait for one (a pool per
#: event loop, as an application would keep one).
REDIS_POOL_SIZE = 50

_clients: dict[asyncio.AbstractEventLoop, redis.asyncio.Redis] = {}


def _client() -> redis.asyncio.Redis:
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            os.environ[REDIS_URL_ENV], db=1, max_connections=REDIS_POOL_SIZE
        )
        client = _clients[loop] = redis.asyncio.Redis(connection_pool=pool)
    return client


@delayjobs.register
class AsyncSleep(delayjobs.JobType):
    """Waits 10 ms without a thread: ``await asyncio.sleep(0.01)``."""

    name = SLEEP_JOB_TYPE
    queue = ASYNC_QUEUE
    max_attempts = 1

    async def execute(self, job: DelayedJob) -> None:
        await asyncio.sleep(0.01)


@delayjobs.register
class AsyncRedis(delayjobs.JobType):
    """One RPUSH through ``redis.asyncio`` on the body's own connection pool."""

    name = REDIS_JOB_TYPE
    queue = ASYNC_QUEUE
    max_attempts = 1

    async def execute(self, job: DelayedJob) -> None:
        await _client().rpush(PUSH_KEY, job.pk)


@delayjobs.register
class SyncSleep(delayjobs.JobType):
    """The sync counterpart of ``AsyncSleep`` (a thread per running job), for comparison."""

    name = SYNC_SLEEP_JOB_TYPE
    queue = ASYNC_QUEUE
    max_attempts = 1

    def execute(self, job: DelayedJob) -> None:
        time.sleep(0.01)
