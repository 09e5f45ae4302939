"""Helpers of the test suite that no single directory owns, imported by name.

The servers the tests and the benchmarks start, one module each: ``redis_server`` (plain,
password, TLS), ``postgres``, ``pgbouncer``, ``sentinel`` (and its django-redis cache),
``cluster``, and what they share, ``processes`` (free ports, children that die with the run).
``fixtures``: fixtures a directory's conftest opts into by importing them. ``round_trips``:
counting the round trips of a piece of code. ``schedules``: the schedules' admin tests' types.
Imports the test helpers at tests/ and the test extra's libraries, never a test module.
"""
