"""Benchmarks of delayjobs against real local PostgreSQL and Redis servers.

Run ``python -m benchmarks.core`` from the repository root (or ``benchmarks/run.sh``).
The package is also a Django app: its ``delay_jobs`` module registers the no-op job type
the benchmarks schedule.
"""
