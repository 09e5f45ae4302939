"""Integration tests: in-process, against the run's real Redis and database (SQLite or PostgreSQL).

A file here may hold a few tests that start processes: those carry the ``subprocess`` marker,
and with it the ``e2e`` kind (tests/conftest.py), so the matrix's core legs leave them out.
Every other test here carries the ``integration`` marker.
"""
