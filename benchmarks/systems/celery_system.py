"""Celery with ETA tasks on the Redis broker; also the Celery app its workers load.

ETA tasks are fetched by a worker as soon as they are published and held in its memory
until due (the broker's QoS prefetch limit is raised for each ETA task it holds).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any, ClassVar

from celery import Celery

from benchmarks import bodies, harness
from benchmarks.systems.base import Job, System, aware, script

QUEUE = "bench"

app = Celery("bench", broker=os.environ.get(harness.REDIS_URL_ENV, "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_ignore_result=True,  # no result backend: the record file is the result
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench.work")
def work(job_id: int, run_at: float) -> None:
    bodies.job(job_id, run_at)


# Flags that take work off the workers that a benchmark does not need: no remote control
# chatter between nodes at start-up (mingle), no gossip or event heartbeats.
QUIET = ["--without-mingle", "--without-gossip", "--without-heartbeat", "--loglevel", "WARNING"]


def _thread_workers(processes: int, threads: int) -> dict[str, Any]:
    """``processes`` worker processes, each ``--pool threads --concurrency threads``."""
    return {
        "describe": f"{processes} worker processes x `--pool threads --concurrency {threads}`, "
        "Redis broker, `apply_async(eta=...)`, results ignored, prefetch multiplier 4 (default)",
        "workers": [["--pool", "threads", "--concurrency", str(threads)]] * processes,
        "executors": processes,
    }


class CelerySystem(System):
    name = "celery"
    has_bulk = False  # no bulk call for ETA tasks: schedule_many is a loop
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        # 8 threads a worker: the best with bodies that do not wait; 25 for bodies that
        # wait (sleep10); 50 was slower than 25 (docs/benchmarks.md).
        **{f"threads-2x{threads}": _thread_workers(2, threads) for threads in (8, 25, 50)},
        "prefork-2": {
            "describe": "1 worker `--pool prefork --concurrency 2` (a parent and 2 children: "
            "3 OS processes), Redis broker, `apply_async(eta=...)`, results ignored",
            "workers": [["--pool", "prefork", "--concurrency", "2"]],
            "executors": 2,
        },
    }

    def versions(self) -> dict[str, str]:
        return {"celery": version("celery"), "kombu": version("kombu"), "redis": version("redis")}

    def reset(self) -> None:
        harness.flush_redis()

    def schedule_one(self, job: Job) -> None:
        work.apply_async(job, eta=aware(job[1]))

    def schedule_many(self, jobs: Sequence[Job]) -> None:
        # No bulk call for ETA tasks in Celery (a group was slower, measured): one producer,
        # and so one connection, for all the messages.
        with app.producer_or_acquire() as producer:
            for job in jobs:
                work.apply_async(job, eta=aware(job[1]), producer=producer)

    @property
    def executors(self) -> int:
        return int(self.config["executors"])

    def consumer_commands(self) -> list[list[str]]:
        return [
            [
                script("celery"),
                "-A",
                __name__,
                "worker",
                "-Q",
                QUEUE,
                "-n",
                f"bench{index}@%h",
                *pool,
                *QUIET,
            ]
            for index, pool in enumerate(self.config["workers"])
        ]
