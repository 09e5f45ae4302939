"""Benchmarks against real local PostgreSQL and Redis servers (docs/benchmarks.md).

``benchmarks/run.sh`` runs the comparison suite (``benchmarks.suite``: delayjobs, Celery,
Huey, RQ, Procrastinate); ``benchmarks/run.sh core`` the delayjobs-only ``benchmarks.core``.
The package is also a Django app: its ``delay_jobs`` module registers the job types the
benchmarks schedule.
"""
