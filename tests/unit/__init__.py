"""Unit tests: no database, no Redis, no process; Django is configured (settings only).

Run alone without any server: ``DELAYJOBS_TEST_SERVICES=none pytest tests/unit``.
Every test here carries the ``unit`` marker (tests/conftest.py); tests/unit/conftest.py
fails a test here that asks for the database, Redis or a consumer process.
"""
