"""Small helpers shared by the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.02,
    message: str = "",
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that value.

    This waits for an event with a deadline instead of sleeping a fixed time, so fast
    machines stay fast and slow ones are not flaky. On timeout, AssertionError(message).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(message or f"condition not met within {timeout}s: {predicate!r}")
        time.sleep(interval)
