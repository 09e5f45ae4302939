"""Fixtures a directory opts into by importing them into its conftest.py."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, name="_clean_redis")
def clean_redis_autouse(_clean_redis: None) -> None:
    """tests/conftest.py's ``_clean_redis``, autouse in the directory that imports this:
    every test there starts and ends with an empty Redis."""
