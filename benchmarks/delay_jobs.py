"""The job type the benchmarks schedule, autodiscovered like any app's ``delay_jobs``."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING

import delayjobs
from delayjobs.limits import MAX_GLOBAL_CONCURRENCY, MAX_RATE_COUNT

if TYPE_CHECKING:  # core.py imports the names below before Django is set up
    from delayjobs.models import DelayedJob

BENCH_JOB_TYPE = "bench.noop"
BENCH_QUEUE = "bench"


@delayjobs.register
class BenchNoop(delayjobs.JobType):
    """``benchmarks.core``'s job: the selected body only (nothing for ``noop``, the
    default), so that what is measured is delayjobs' own overhead and timing.

    delayjobs records each execution's start, end and lateness in ``JobAttempt``.
    """

    name = BENCH_JOB_TYPE
    queue = BENCH_QUEUE
    max_attempts = 1

    def execute(self, job: DelayedJob) -> None:
        from benchmarks.bodies import run

        run(job.pk)


RECORD_JOB_TYPE = "bench.record"

#: DELAYJOBS_BENCH_LIMIT=concurrency|rate: the comparison suite's job type declares a
#: fleet-wide limit that never binds (the largest allowed), to measure what a limit costs
#: when there is room. Unset: no limit, the plain claim.
BENCH_LIMIT = os.environ.get("DELAYJOBS_BENCH_LIMIT", "")


@delayjobs.register
class BenchRecord(delayjobs.JobType):
    """The comparison suite's job: records its start, then runs the selected body, like
    every other system's job."""

    name = RECORD_JOB_TYPE
    queue = BENCH_QUEUE
    max_attempts = 1
    if BENCH_LIMIT == "concurrency":
        global_concurrency = MAX_GLOBAL_CONCURRENCY
    elif BENCH_LIMIT == "rate":
        rate_limit = delayjobs.Rate(MAX_RATE_COUNT, per=timedelta(seconds=1))

    def execute(self, job: DelayedJob) -> None:
        from benchmarks.bodies import job as bench_job

        bench_job(job.payload["i"], job.payload["t"])
