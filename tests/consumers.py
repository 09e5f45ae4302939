"""Waiting for and inspecting what consumer subprocesses did, for the end-to-end tests."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence

from delayjobs.models import DelayedJob, JobStatus
from tests.conftest import ConsumerProcess
from tests.models import Execution
from tests.support.processes import free_port
from tests.support.redis_server import RedisServer
from tests.utils import wait_for

ACTIVE = (JobStatus.SCHEDULED, JobStatus.RUNNING)


def check_alive(consumers: Iterable[ConsumerProcess]) -> None:
    """Fail at once, with its output, if a consumer that should be running has exited."""
    for consumer in consumers:
        if consumer.returncode is not None:
            raise AssertionError(
                f"consumer {consumer.pid} exited with {consumer.returncode}:\n{consumer.output()}"
            )


def wait_final(
    ids: Sequence[int],
    consumers: Sequence[ConsumerProcess] = (),
    timeout: float = 60.0,
    interval: float = 0.02,
) -> None:
    """Wait until none of the jobs is scheduled or running any more."""

    def done() -> bool:
        check_alive(consumers)
        return not DelayedJob.objects.filter(pk__in=ids, status__in=ACTIVE).exists()

    try:
        wait_for(done, timeout=timeout, interval=interval)
    except AssertionError:
        left = Counter(DelayedJob.objects.filter(pk__in=ids).values_list("status", flat=True))
        logs = "\n".join(consumer.output()[-3000:] for consumer in consumers)
        raise AssertionError(f"jobs not final within {timeout}s: {dict(left)}\n{logs}") from None


def wait_executed(job: DelayedJob, consumers: Sequence[ConsumerProcess], attempt: int = 1) -> None:
    def started() -> bool:
        check_alive(consumers)
        return Execution.objects.filter(job_id=job.pk, attempt=attempt).exists()

    wait_for(started, message=f"job {job.pk} attempt {attempt} never started")


def wait_output(consumer: ConsumerProcess, text: str, timeout: float = 30.0) -> None:
    """Wait until ``text`` is in the consumer's output. On timeout, or if the consumer exits
    without writing it, fail with the end of its output (what it was doing instead)."""
    deadline = time.monotonic() + timeout
    while True:
        exited = consumer.returncode is not None  # before reading: all it wrote is there
        output = consumer.output()
        if text in output:
            return
        if exited:
            raise AssertionError(
                f"consumer {consumer.pid} exited with {consumer.returncode} without writing "
                f"{text!r}; its output ends with:\n{output[-5000:]}"
            )
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"{text!r} not in the output of consumer {consumer.pid} within {timeout}s; "
                f"its output ends with:\n{output[-5000:]}"
            )
        time.sleep(0.02)


def statuses(ids: Iterable[int]) -> Counter[str]:
    return Counter(DelayedJob.objects.filter(pk__in=list(ids)).values_list("status", flat=True))


def executions_per_job() -> Counter[int]:
    return Counter(Execution.objects.values_list("job_id", flat=True))


def history(job: DelayedJob) -> list[tuple[int, str, str]]:
    """The job's attempt rows as (number, worker, outcome), in order."""
    return list(job.history.order_by("number").values_list("number", "worker_id", "outcome"))


class Outage:
    """A Redis on a fixed port that a test can stop and start again, empty."""

    def __init__(self) -> None:
        self.port = free_port()
        self.server: RedisServer | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert self.server is None
        self.server = RedisServer(port=self.port).start()

    def stop(self) -> None:
        assert self.server is not None
        self.server.stop()
        self.server = None
