"""Job types with fleet-wide limits, for tests/e2e/test_limits.py and its neighbours.

Not autodiscovered with tests/delay_jobs.py: a type with limits has lanes of its own in
every queue, which would change what every other test's consumer pops (and the round-trip
budgets). A test registers them with the ``limit_types`` fixture; its consumer processes
import this module when started with ``LIMITS_ENV`` set (tests/delay_jobs.py does).
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import delayjobs
from delayjobs.models import DelayedJob
from tests.models import Span

LIMITS_ENV = "DELAYJOBS_TEST_LIMITS"


def real_time() -> float:
    """The host's real clock: tests/skewed_clock.py shifts time.time, not this."""
    return time.clock_gettime(time.CLOCK_REALTIME)


class Spanned(delayjobs.JobType):
    """Records when its body ran, as a span row.

    Payload: ``seconds`` (default 0.2) to run: the span is written once, at the end, so
    that the body lasts ``seconds`` and one write (a limit's precision is measured against
    it); ``release_file``: hold until it exists, the span written at the start (a test
    waits for it) and ended at the end.
    """

    time_to_run = timedelta(seconds=3)
    max_attempts = 10

    def execute(self, job: DelayedJob) -> None:
        fields = {"job_id": job.pk, "attempt": job.attempts, "limit_key": job.limit_key or ""}
        payload = job.payload if isinstance(job.payload, dict) else {}
        release = payload.get("release_file")
        if not release:
            started = real_time()
            time.sleep(payload.get("seconds", 0.2))
            Span.objects.create(**fields, started=started, ended=real_time())
            return
        span = Span.objects.create(**fields, started=real_time())
        deadline = time.monotonic() + 60
        while not Path(release).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        span.ended = real_time()
        span.save(update_fields=["ended"])


class Concurrency3(Spanned):
    name = "tests.limits.concurrency"
    queue = "limits"
    global_concurrency = 3


class Rate20(Spanned):
    name = "tests.limits.rate"
    queue = "limits"
    rate_limit = delayjobs.Rate(20, per=timedelta(seconds=1))


class PerTenant(Spanned):
    """One job at a time per tenant, and at most 5 starts per tenant per second."""

    name = "tests.limits.tenant"
    queue = "limits"
    global_concurrency = 1
    rate_limit = delayjobs.Rate(5, per=timedelta(seconds=1))

    def limit_key(self, job: DelayedJob) -> str | None:
        return str(job.payload["tenant"])


class ProviderA(Spanned):
    name = "tests.limits.provider_a"
    queue = "limits"
    limit_group = "tests.limits.provider"
    global_concurrency = 2


class ProviderB(Spanned):
    name = "tests.limits.provider_b"
    queue = "limits"
    limit_group = "tests.limits.provider"
    global_concurrency = 2


class Roomy(Spanned):
    """Limits that never bind here: its claims reserve room and spend it."""

    name = "tests.limits.roomy"
    queue = "limits"
    global_concurrency = 10_000
    rate_limit = delayjobs.Rate(100_000, per=timedelta(seconds=1))


TYPES = (Concurrency3, Rate20, PerTenant, ProviderA, ProviderB, Roomy)


def register_all() -> None:
    for cls in TYPES:
        delayjobs.register(cls)
