"""RQ with ``enqueue_at``: its scheduler moves due jobs from a sorted set to the queue.

The scheduler is a process that a worker started with ``--with-scheduler`` forks, so one
such worker is 2 OS processes. The default ``Worker`` forks a further work horse for every
job; ``SimpleWorker`` runs jobs in the worker itself, which keeps to 2 processes.
Scores in RQ's scheduled registry are whole seconds, and the scheduler runs once a second.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any, ClassVar

from benchmarks import bodies, harness
from benchmarks.systems.base import Job, System, aware, script

QUEUE = "bench"


def work(job_id: int, run_at: float) -> None:
    bodies.job(job_id, run_at)


class RQSystem(System):
    name = "rq"
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        "simple-1+scheduler": {
            "describe": "1 `rq worker --with-scheduler --worker-class SimpleWorker` (the "
            "worker and its forked scheduler: 2 OS processes), results not kept",
            "worker_class": "rq.worker.SimpleWorker",
        },
        "fork-1+scheduler": {
            "describe": "1 `rq worker --with-scheduler` (default Worker: a work horse forked "
            "per job, so 3 OS processes while a job runs), results not kept",
            "worker_class": "rq.worker.Worker",
        },
    }

    def __init__(self, config: str | None = None) -> None:
        super().__init__(config)
        self._queue: Any = None

    @property
    def queue(self) -> Any:
        if self._queue is None:
            from redis import Redis
            from rq import Queue

            connection = Redis.from_url(os.environ[harness.REDIS_URL_ENV])
            self._queue = Queue(QUEUE, connection=connection)
        return self._queue

    def versions(self) -> dict[str, str]:
        return {"rq": version("rq"), "redis": version("redis")}

    def reset(self) -> None:
        harness.flush_redis()

    def schedule_one(self, job: Job) -> None:
        self.queue.enqueue_at(aware(job[1]), work, *job, result_ttl=0)

    def schedule_many(self, jobs: Sequence[Job]) -> None:
        # No bulk scheduling call in RQ; enqueue_at takes a pipeline: one round trip.
        with self.queue.connection.pipeline() as pipe:
            for job in jobs:
                self.queue.enqueue_at(aware(job[1]), work, *job, result_ttl=0, pipeline=pipe)
            pipe.execute()

    @property
    def executors(self) -> int:
        return 1

    def consumer_commands(self) -> list[list[str]]:
        return [
            [
                script("rq"),
                "worker",
                "--url",
                os.environ[harness.REDIS_URL_ENV],
                "--with-scheduler",
                "--worker-class",
                self.config["worker_class"],
                "--quiet",
                QUEUE,
            ]
        ]
