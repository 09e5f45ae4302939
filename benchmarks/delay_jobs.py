"""The job type the benchmarks schedule, autodiscovered like any app's ``delay_jobs``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import delayjobs

if TYPE_CHECKING:  # core.py imports the names below before Django is set up
    from delayjobs.models import DelayedJob

BENCH_JOB_TYPE = "bench.noop"
BENCH_QUEUE = "bench"


@delayjobs.register
class BenchNoop(delayjobs.JobType):
    """Does nothing: what is measured is delayjobs' own overhead and timing.

    delayjobs records each execution's start, end and lateness in ``JobAttempt``.
    """

    name = BENCH_JOB_TYPE
    queue = BENCH_QUEUE
    max_attempts = 1

    def execute(self, job: DelayedJob) -> None:
        return None


RECORD_JOB_TYPE = "bench.record"


@delayjobs.register
class BenchRecord(delayjobs.JobType):
    """The comparison suite's job: records its start like every other system's job."""

    name = RECORD_JOB_TYPE
    queue = BENCH_QUEUE
    max_attempts = 1

    def execute(self, job: DelayedJob) -> None:
        from benchmarks.records import record

        record(job.payload["i"], job.payload["t"])
