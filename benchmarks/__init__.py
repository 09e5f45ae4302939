"""Benchmarks against real local PostgreSQL and Redis servers (docs/benchmarks.md).

``benchmarks/run.sh`` runs the comparison suite (``benchmarks.suite``: delayjobs, Celery,
Huey, RQ, Procrastinate, Oban for Python, PgQueuer, dj-queue, django-tasks-db and the bare
runner); ``benchmarks/run.sh core`` the delayjobs-only ``benchmarks.core``.
The package is also a Django app: its ``delay_jobs`` module registers the job types the
benchmarks schedule.
"""

from pathlib import Path

#: Where a benchmark writes its results unless told otherwise: under build/, which git
#: ignores. benchmarks/results/ keeps only the runs the documentation cites.
OUTPUT_DIR = Path(__file__).resolve().parent.parent / "build" / "benchmarks"
