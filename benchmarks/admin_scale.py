"""The admin at scale: each page of the job admin timed on a large table.

Pages: the job list (default view, each status filter, a job type filter, search by key),
one job's page and the dashboard, as a logged-in superuser through ``django.test.Client``.
Each page is loaded once to warm up, then ``--runs`` times: the median is reported, with
the SQL queries of a run (``CaptureQueriesContext``), the slowest one, and whether any is
a ``COUNT(*)`` of the whole job table (no WHERE): there must be none.

Usage, from the repository root, after ``benchmarks.scale_data`` filled a database::

    python -m benchmarks.scale_data --serve /tmp/scale-db.json &     # 10 M + 1 M rows
    python -m benchmarks.admin_scale --database /tmp/scale-db.json
    python -m benchmarks.admin_scale --finished 100000 --scheduled 100000  # its own servers

Django is configured here (``settings.configure``): the benchmarks' settings plus the
admin, sessions and messages, and this module as the URLconf.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from dataclasses import dataclass
from typing import Any

from benchmarks import harness

#: A COUNT of the whole job table: SELECT COUNT(*) ... FROM "delayjobs_delayedjob" and no WHERE.
WHOLE_TABLE_COUNT = re.compile(
    r'^SELECT COUNT\(\*\)[^;]*? FROM "delayjobs_delayedjob"(?![^;]*\b(?:WHERE|TABLESAMPLE)\b)',
    re.IGNORECASE,
)
TABLE = "delayjobs_delayedjob"
STATUSES = ("scheduled", "running", "succeeded", "failed", "cancelled", "skipped", "expired")
urlpatterns: list[Any] = []


def configure() -> None:
    """Django settings: the benchmarks' own, plus what the admin needs."""
    from django.conf import settings

    from benchmarks import settings as bench

    values = {name: getattr(bench, name) for name in dir(bench) if name.isupper()}
    values["INSTALLED_APPS"] = [
        *bench.INSTALLED_APPS,
        "django.contrib.admin",
        "django.contrib.sessions",
        "django.contrib.messages",
    ]
    values["MIDDLEWARE"] = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ]
    values["TEMPLATES"] = [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                    "django.contrib.messages.context_processors.messages",
                ]
            },
        }
    ]
    values["ROOT_URLCONF"] = __name__
    values["ALLOWED_HOSTS"] = ["testserver"]
    settings.configure(**values)
    import django

    django.setup()
    from django.contrib import admin
    from django.urls import path

    urlpatterns.append(path("admin/", admin.site.urls))
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def explain(sql: str) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of one captured query (its parameters inlined)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}")
        return "\n".join(row[0] for row in cursor.fetchall())


@dataclass
class PageResult:
    page: str
    url: str
    status: int
    median_ms: float
    runs_ms: list[float]
    queries: int
    slowest_query_ms: float
    slowest_query: str
    whole_table_counts: int
    #: The page's queries on delayjobs' tables with their plans (``--explain``).
    plans: list[str]


def pages() -> list[tuple[str, str]]:
    """(name, URL) of each page measured, on rows that scale_data wrote."""
    from delayjobs.models import DelayedJob, JobStatus

    base = "/admin/delayjobs/delayedjob/"
    # A recent failed job with a key (scale_data: its three attempts are in the history).
    job = (
        DelayedJob.objects.filter(status=JobStatus.FAILED, key__isnull=False)
        .order_by("-run_at", "-id")
        .values_list("pk", "key")
        .first()
    )
    assert job is not None, "no failed job with a key: fill the database with scale_data"
    pk, key = job
    listed = [("list (default)", base)]
    listed += [(f"list status={status}", f"{base}?status__exact={status}") for status in STATUSES]
    listed += [
        ("list job_type filter", f"{base}?job_type__exact=billing.charge_renewal"),
        ("list search by key", f"{base}?q={key}"),
        ("job page", f"{base}{pk}/change/"),
        ("dashboard", f"{base}dashboard/"),
    ]
    return listed


def measure(client: Any, name: str, url: str, runs: int, plans: bool = False) -> PageResult:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get(url)  # warm-up
    times: list[float] = []
    captured: list[dict[str, str]] = []
    status = 0
    for _ in range(runs):
        with CaptureQueriesContext(connection) as context:
            started = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
        status = response.status_code
        captured = list(context.captured_queries)
    slowest = max(captured, key=lambda query: float(query["time"]), default=None)
    return PageResult(
        page=name,
        url=url,
        status=status,
        median_ms=round(statistics.median(times), 1),
        runs_ms=[round(value, 1) for value in times],
        queries=len(captured),
        slowest_query_ms=round(float(slowest["time"]) * 1000, 1) if slowest else 0.0,
        slowest_query=slowest["sql"][:300] if slowest else "",
        whole_table_counts=sum(1 for q in captured if WHOLE_TABLE_COUNT.match(q["sql"])),
        plans=[
            f"{q['sql']}\n{explain(q['sql'])}"
            for q in captured
            if plans and '"delayjobs_' in q["sql"] and not q["sql"].startswith("EXPLAIN")
        ],
    )


def table(results: list[PageResult]) -> str:
    lines = [
        "| page | median ms | queries | slowest query ms | whole-table COUNT(*) | HTTP |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.page} | {r.median_ms:.1f} | {r.queries} | {r.slowest_query_ms:.1f} | "
        f"{r.whole_table_counts} | {r.status} |"
        for r in results
    ]
    return "\n".join(lines)


def run(runs: int, plans: bool = False) -> list[PageResult]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user_model = get_user_model()
    user, _created = user_model.objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    print(f"{TABLE}: planner rows {_rows()}", flush=True)
    return [measure(client, name, url, runs, plans) for name, url in pages()]


def _rows() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = %s", [TABLE])
        return int(cursor.fetchone()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", metavar="FILE", help="a scale_data --serve file")
    parser.add_argument("--finished", type=int, default=100_000)
    parser.add_argument("--scheduled", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--explain", action="store_true", help="print each page's query plans (ANALYZE)"
    )
    args = parser.parse_args()

    def measure_all() -> None:
        results = run(args.runs, args.explain)
        print(table(results), flush=True)
        for result in results if args.explain else []:
            print(f"\n### {result.page}\n", *result.plans, sep="\n\n", flush=True)
        if args.json:
            with open(args.json, "w") as out:
                json.dump([r.__dict__ for r in results], out, indent=2)

    if args.database:
        with open(args.database) as info_file:
            info = json.load(info_file)
        os.environ[harness.DATABASE_ENV] = info[harness.DATABASE_ENV]
        os.environ[harness.REDIS_URL_ENV] = info[harness.REDIS_URL_ENV]
        configure()
        measure_all()
        return
    with harness.services(durable=False):
        configure()
        from benchmarks import scale_data

        report = scale_data.fill(args.finished, args.scheduled)
        print(f"generation took {report.total_seconds:.1f} s", flush=True)
        measure_all()


if __name__ == "__main__":
    main()
