"""Helpers of the test suite that no single directory owns, imported by name.

``sentinel_settings``: the Redis Sentinel names tests/settings.py and tests/scale share.
``fixtures``: fixtures a directory's conftest opts into by importing them.
Imports only the test helpers at tests/ and the standard library, never a test module.
"""
