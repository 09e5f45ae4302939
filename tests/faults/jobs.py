"""The job type of the fault suite: it appends one line per execution to a ledger file.

The ledger is a plain file, not a table, so that it keeps counting while the database or
Redis is down. Each line is written with a single ``write()`` on a descriptor opened with
``O_APPEND``: the kernel appends it whole, so lines of concurrent threads and processes
never interleave, and a consumer SIGKILLed right after the write leaves a complete line.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import delayjobs
from delayjobs.models import DelayedJob

#: The environment variable naming the ledger file, set on the suite's consumers.
LEDGER_ENV = "DELAYJOBS_FAULTS_LEDGER"
NAME = "faults.ledger"
QUEUE = "faults"


def ledger_line(job_id: int, attempt: int, worker_id: str, started_at: float) -> bytes:
    return f"{job_id} {attempt} {worker_id} {started_at:.6f}\n".encode()


@delayjobs.register
class LedgerJob(delayjobs.JobType):
    """Writes "job_id attempt worker_id started_at" to the ledger, then works a little.

    ``payload["work_ms"]`` is the work, so that there are running jobs for a fault to
    interrupt.
    """

    name = NAME
    queue = QUEUE
    # Only lease expiries repeat an attempt (the job never raises); a bound anyway, so a
    # bug cannot loop for ever.
    max_attempts = 10
    # A short lease so that the jobs of a killed consumer come back within seconds.
    time_to_run = timedelta(seconds=3)

    def execute(self, job: DelayedJob) -> None:
        path = os.environ.get(LEDGER_ENV)
        if not path:
            raise RuntimeError(f"{NAME} needs {LEDGER_ENV}: the ledger file to append to")
        # The host's real clock, read in C: tests/scale/test_clocks.py skews what Python's
        # time.time() says in its consumers, and checks starts against the real time.
        started = time.clock_gettime(time.CLOCK_REALTIME)
        line = ledger_line(job.pk, job.attempts, job.worker_id, started)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        payload = job.payload if isinstance(job.payload, dict) else {}
        time.sleep(payload.get("work_ms", 5) / 1000)
