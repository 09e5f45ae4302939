"""What tracing adds per job, in microseconds of one thread's time, without a database,
Redis or a consumer around it: the steps ``delayjobs.core.tracing`` takes for one
attempt (start its span, make it current around the body, end it with its outcome) and
for one ``schedule()`` (its send span and the context it stores).

    .venv/bin/python -m benchmarks.tracing_cost

Each setting runs in a fresh process (the global tracer provider can be set only once):
``off`` (``DELAYJOBS["TRACING"] = False``), ``api`` (opentelemetry-api, no SDK) and
``sdk`` (the SDK with a batch span processor and an exporter that drops the spans,
``benchmarks.tracing_sdk``). An attempt is measured for a job that stores a context (it
was scheduled in a trace) and for one that stores none. The best of 5 repeats of 20,000.
The whole consumer's throughput with each setting: ``DELAYJOBS_BENCH_TRACING`` (see
``benchmarks/settings.py``).
"""

from __future__ import annotations

import subprocess
import sys
import timeit
from collections.abc import Callable
from datetime import UTC, datetime

MODES = ("off", "api", "sdk")
NUMBER = 20_000
REPEATS = 5
STORED = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def measure(mode: str) -> dict[str, float]:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "delayjobs"],
        DATABASES={},
        USE_TZ=True,
        DELAYJOBS={"TRACING": mode != "off"},
    )
    django.setup()
    if mode == "sdk":
        from benchmarks.tracing_sdk import set_up_sdk

        set_up_sdk()
    from delayjobs.core import tracing
    from delayjobs.models import DelayedJob

    job = DelayedJob(pk=1, job_type="bench.noop", queue="default", attempts=1)
    job.run_at = datetime.now(UTC)

    def attempt() -> None:
        span = tracing.processing(job, "consumer", lateness_ms=1.0)
        if span is not None:
            tracing.attach(job, span)
            with span.current():
                pass
            span.finish("succeeded")

    def send() -> None:
        with tracing.producer("schedule", "default", "bench.noop") as sent:
            sent.mark(job)
            sent.sent([job])

    def best(step: Callable[[], None]) -> float:
        return min(timeit.repeat(step, number=NUMBER, repeat=REPEATS)) / NUMBER * 1e6

    figures = {}
    job.trace_context = STORED
    figures["attempt, context stored"] = best(attempt)
    job.trace_context = None
    figures["attempt, no context"] = best(attempt)
    figures["schedule()"] = best(send)
    return figures


def main() -> None:
    if len(sys.argv) > 1:
        for name, value in measure(sys.argv[1]).items():
            print(f"{name}\t{value:.1f}")
        return
    rows: dict[str, dict[str, str]] = {}
    for mode in MODES:
        output = subprocess.run(
            [sys.executable, "-m", "benchmarks.tracing_cost", mode],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for line in output.splitlines():
            name, value = line.split("\t")
            rows.setdefault(name, {})[mode] = value
    print("| µs per job | " + " | ".join(MODES) + " |")
    print("| --- |" + " --- |" * len(MODES))
    for name, values in rows.items():
        print(f"| {name} | " + " | ".join(values[mode] for mode in MODES) + " |")


if __name__ == "__main__":
    main()
