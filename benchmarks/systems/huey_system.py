"""Huey with its Redis storage; also the Huey instance its consumers load.

``schedule(eta=...)`` puts the task on the queue; a worker that dequeues it before it is
due moves it to the schedule (a sorted set), from which the consumer's scheduler thread
enqueues due tasks once per ``--scheduler-interval`` (1 s at least).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any, ClassVar

from huey import RedisHuey

from benchmarks import bodies, harness
from benchmarks.systems.base import Job, System, aware, script

huey = RedisHuey(
    "bench",
    url=os.environ.get(harness.REDIS_URL_ENV, "redis://127.0.0.1:6379/0"),
    results=False,  # no result store: the record file is the result
)


@huey.task()
def work(job_id: int, run_at: float) -> None:
    bodies.job(job_id, run_at)


class HueySystem(System):
    name = "huey"
    has_bulk = False  # no bulk enqueue in Huey: schedule_many is a loop of schedule()
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        "threads-2x8": {
            "describe": "2 x `huey_consumer -k thread -w 8` (a scheduler thread in each, "
            "interval 1 s, the minimum), Redis storage, blocking reads, no results",
            "processes": 2,
        },
        "threads-1x8": {
            "describe": "1 `huey_consumer -k thread -w 8` (scheduler thread inside, interval "
            "1 s, the minimum), Redis storage, blocking reads, no results",
            "processes": 1,
        },
    }

    def versions(self) -> dict[str, str]:
        return {"huey": version("huey"), "redis": version("redis")}

    def reset(self) -> None:
        harness.flush_redis()

    def schedule_one(self, job: Job) -> None:
        work.schedule(args=job, eta=aware(job[1]))

    def schedule_many(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            work.schedule(args=job, eta=aware(job[1]))

    @property
    def executors(self) -> int:
        return int(self.config["processes"])

    def consumer_commands(self) -> list[list[str]]:
        command = [
            script("huey_consumer"),
            f"{__name__}.huey",
            "-k",
            "thread",
            "-w",
            "8",
            "-s",
            "1",
            "--quiet",
        ]
        return [command] * int(self.config["processes"])
