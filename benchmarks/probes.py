"""Probes behind the two columns of the comparison that delayjobs does not lead.

``benchmarks/run.sh probe schedule``: ``schedule()`` one by one against the very same
``INSERT`` sent by bare psycopg, on the benchmark's own durable PostgreSQL, and a cProfile
of where a ``schedule()`` call spends its time. It shows what a committed PostgreSQL row
per job costs, which Redis-only systems (Huey, RQ) do not pay.

``benchmarks/run.sh probe memory``: the resident memory of a consumer process, step by
step from the bare interpreter to the consumer's modules, each step in a fresh process.
It shows what Django itself costs, which a worker without Django (Procrastinate) does not
pay.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta

from benchmarks import harness

SCHEDULE_CALLS = 5_000
SCHEDULE_ROUNDS = 3
WARM_UP_CALLS = 200
# The profile lines that split a schedule() call: delayjobs' part, Django's save and its
# INSERT compilation, psycopg's parameter adaptation, and the wait for the server.
PROFILE_LINES = (
    r"api.py:\d+\(schedule\)|base.py:\d+\(save\)|compiler.py:\d+\(as_sql\)"
    r"|_cursor_base.py:\d+\(_execute_gen\)|psycopg/connection.py:\d+\(wait\)"
)

# Each step of the memory probe runs in its own interpreter and prints its RSS in kB.
MEMORY_STEPS = {
    "interpreter": "",
    "django.setup(): contenttypes, auth, PostgreSQL backend": """
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth"],
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}},
    USE_TZ=True,
)
django.setup()
from django.db import connection
connection.ops
""",
    "... plus redis-py": "import redis",
    "the benchmark consumer's settings and its run_delay_consumer command": """
import django
django.setup()
import delayjobs.management.commands.run_delay_consumer
""",
}
PRINT_RSS = """
for line in open("/proc/self/status"):
    if line.startswith("VmRSS"):
        print(line.split()[1])
"""


def _rates(label: str, calls: Callable[[], None]) -> float:
    started = time.perf_counter()
    calls()
    rate = SCHEDULE_CALLS / (time.perf_counter() - started)
    print(f"  {label}: {rate:,.0f} calls/s")
    return rate


def probe_schedule() -> None:
    with harness.services(durable=True):
        harness.setup_django()
        from django.db import connection
        from django.db.models.sql import InsertQuery
        from django.utils import timezone

        import delayjobs
        from benchmarks.delay_jobs import RECORD_JOB_TYPE
        from delayjobs.models import DelayedJob

        run_at = timezone.now() + timedelta(hours=1)  # outside the pre-load window: no Redis

        def schedule_loop() -> None:
            for i in range(SCHEDULE_CALLS):
                delayjobs.schedule(RECORD_JOB_TYPE, {"i": i, "t": 1.5}, run_at=run_at)

        # The statement schedule() sends, compiled once by Django from a row it wrote.
        delayjobs.schedule(RECORD_JOB_TYPE, {"i": 0, "t": 1.5}, run_at=run_at)
        row = DelayedJob.objects.latest("pk")
        fields = [f for f in DelayedJob._meta.concrete_fields if not f.primary_key]
        query = InsertQuery(DelayedJob)
        query.insert_values(fields, [row])
        compiler = query.get_compiler(connection.alias)
        compiler.returning_fields = [DelayedJob._meta.pk]
        ((sql, params),) = compiler.as_sql()
        raw_connection = connection.connection  # autocommit, as Django left it

        def bare_loop() -> None:
            with raw_connection.cursor() as cursor:
                for _ in range(SCHEDULE_CALLS):
                    cursor.execute(sql, params)

        for _ in range(WARM_UP_CALLS):
            delayjobs.schedule(RECORD_JOB_TYPE, {"i": 0, "t": 1.5}, run_at=run_at)
        schedule_rates, bare_rates = [], []
        for round_number in range(1, SCHEDULE_ROUNDS + 1):
            print(f"round {round_number} of {SCHEDULE_CALLS:,} calls")
            schedule_rates.append(_rates("schedule()", schedule_loop))
            bare_rates.append(_rates("the same INSERT by bare psycopg", bare_loop))
        schedule_median = statistics.median(schedule_rates)
        bare_median = statistics.median(bare_rates)
        print(
            f"medians: schedule() {schedule_median:,.0f}/s, bare INSERT {bare_median:,.0f}/s "
            f"(schedule() at {schedule_median / bare_median:.0%} of it)"
        )

        profiler = cProfile.Profile()
        profiler.runcall(schedule_loop)
        stats = pstats.Stats(profiler)
        total = stats.total_tt  # type: ignore[attr-defined]  # set by Stats, not in stubs
        print(f"cProfile of {SCHEDULE_CALLS:,} schedule() calls ({total:.2f} s), cumulative:")
        stats.sort_stats("cumulative").print_stats(PROFILE_LINES)


def probe_memory() -> None:
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": harness.SETTINGS_MODULE}
    # The settings only need to parse: nothing connects while modules are imported.
    environment.setdefault(
        "DELAYJOBS_BENCH_DATABASE",
        json.dumps({"ENGINE": "django.db.backends.postgresql", "NAME": "unused"}),
    )
    environment.setdefault("DELAYJOBS_BENCH_REDIS_URL", "redis://127.0.0.1:1/0")
    previous = ""
    for step, code in MEMORY_STEPS.items():
        if step.startswith("..."):
            code = previous + "\n" + code
        previous = code
        result = subprocess.run(
            [sys.executable, "-c", code + PRINT_RSS],
            cwd=harness.REPO_ROOT,
            env=environment,
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"{int(result.stdout.split()[-1]) / 1024:6.1f} MB  {step}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probe", choices=["schedule", "memory"])
    arguments = parser.parse_args()
    {"schedule": probe_schedule, "memory": probe_memory}[arguments.probe]()


if __name__ == "__main__":
    main()
