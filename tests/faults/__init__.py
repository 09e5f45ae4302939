"""The fault-injection suite: real consumers, Redis and PostgreSQL, faults injected under load.

Run it alone with ``pytest -m faults tests/faults``; ``python -m tests.faults.report``
renders docs/reliability.md from the figures of the latest run.
"""
