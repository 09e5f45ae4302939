"""Bulk-schedule throughput through the HTTP API (POST jobs/bulk/), in process.

    .venv/bin/python -m benchmarks.http_bulk [--requests 20] [--jobs 500] [--runs 3]

What it measures: the whole request path of the API (URL resolution, key authentication,
permission checks, body parsing and validation, ``schedule_many()``, the audit log entries,
the JSON reply) through Django's test client, on a fresh SQLite file (WAL, as the sample
project configures it). No server and no network: the figure is the API's own cost plus
the database's. Jobs are due in a day, outside the pre-loader's window, so that no Redis
hand-off happens: Redis is not needed, and its cost is not the API's.

Each run posts ``--requests`` bulk requests of ``--jobs`` jobs each (after one unmeasured
warm-up request) and reports jobs per second; the median of ``--runs`` runs is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()

    directory = Path(tempfile.mkdtemp(prefix="delayjobs-http-bench-"))
    os.environ["DATABASE_PATH"] = str(directory / "bench.sqlite3")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sampleproject.settings")
    os.environ["DEBUG"] = "0"  # DEBUG keeps every query in memory: not what production does

    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import Permission, User
    from django.core.management import call_command
    from django.test import Client

    from delayjobs.api_keys import create_api_key
    from delayjobs.models import DelayedJob

    settings.ALLOWED_HOSTS = ["testserver"]
    call_command("migrate", verbosity=0)
    user = User.objects.create_user("bench")
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["add_delayedjob", "view_delayedjob"])
    )
    _key, plaintext = create_api_key(user, "bench")
    client = Client(headers={"authorization": f"Bearer {plaintext}"})

    def body(request: int) -> bytes:
        jobs = [
            {"job_type": "meetings.remind", "delay": 86400, "payload": {"request": request, "n": n}}
            for n in range(options.jobs)
        ]
        return json.dumps({"jobs": jobs}).encode()

    def post(data: bytes) -> None:
        response = client.post("/delayjobs/api/jobs/bulk/", data, content_type="application/json")
        if response.status_code != 201:
            sys.exit(f"unexpected {response.status_code}: {response.content[:500]!r}")

    post(body(-1))  # warm-up: imports, the first queries, caches
    rates = []
    for run in range(options.runs):
        bodies = [body(request) for request in range(options.requests)]
        started = time.perf_counter()
        for data in bodies:
            post(data)
        elapsed = time.perf_counter() - started
        rate = options.requests * options.jobs / elapsed
        rates.append(rate)
        print(
            f"run {run + 1}: {options.requests} requests x {options.jobs} jobs in "
            f"{elapsed:.2f} s: {rate:,.0f} jobs/s, {elapsed / options.requests * 1000:.0f} ms "
            f"per request"
        )
    print(
        f"median: {statistics.median(rates):,.0f} jobs/s "
        f"({DelayedJob.objects.count()} jobs in the database)"
    )


if __name__ == "__main__":
    main()
