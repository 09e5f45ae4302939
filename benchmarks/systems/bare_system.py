"""The bare runner: the least a timer and a Redis sorted set can do, as the floor of the
figures (what no job system can beat on this machine), not a product.

Scheduling is one ``ZADD`` of the job id scored by its run_at (one for many jobs in the
bulk call), pipelined with a ``PUBLISH`` that wakes the workers: one round trip either way.
Each worker process (``bare_worker``) runs one loop: sleep until the earliest score, or
until a job is announced; pop the due ids (a Lua script: ``ZRANGEBYSCORE`` and ``ZREM``,
atomic, so no id runs twice); run each body inline, one at a time. Nothing is durable:
no database row, no acknowledgement, no retry; a worker that dies loses the ids it popped.

As many worker processes as the peers run (2, one per CPU of this machine). The whole
comparison, medians of 3 on a quiet machine::

    benchmarks/run.sh --runs 3 --timeout 300 --workloads W1 W2 W3 \\
        --bodies noop redis sleep10 --systems bare delayjobs celery huey rq \\
        procrastinate oban pgqueuer djqueue django-tasks-db

The floor holds for bodies that keep a CPU busy (noop, redis, http): it runs one body at a
time per process, so bodies that wait (orm's commit, sleep10) leave it idle, and peers
with threads go faster there.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any, ClassVar

import redis

from benchmarks import harness
from benchmarks.systems.bare_worker import CHANNEL, KEY
from benchmarks.systems.base import Job, System, python


class BareSystem(System):
    name = "bare"
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        "2": {"processes": 2},
        "1": {"processes": 1},
    }

    def __init__(self, config: str | None = None) -> None:
        super().__init__(config)
        self._client: redis.Redis | None = None

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis.from_url(os.environ[harness.REDIS_URL_ENV])
        return self._client

    def versions(self) -> dict[str, str]:
        return {"redis": version("redis")}

    def describe(self) -> str:
        return (
            f"{self.config['processes']} x one loop: sleep to the earliest score of a Redis "
            "sorted set (woken by a publish on ZADD), pop the due ids (Lua), body inline, "
            "nothing durable"
        )

    def reset(self) -> None:
        harness.flush_redis()

    def schedule_one(self, job: Job) -> None:
        self.schedule_many([job])

    def schedule_many(self, jobs: Sequence[Job]) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(KEY, dict(jobs))  # id -> score: its run_at
        pipe.publish(CHANNEL, b"")
        pipe.execute()

    @property
    def executors(self) -> int:
        return int(self.config["processes"])

    def consumer_commands(self) -> list[list[str]]:
        command = [python(), "-m", "benchmarks.systems.bare_worker"]
        return [command] * int(self.config["processes"])
