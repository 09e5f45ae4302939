"""Small helpers shared by the tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings

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


def wait_listening(client: Any, consumers: Sequence[Any], queue: str = "default") -> None:
    """Wait until every consumer listens on ``queue``'s wake channel: started and idle.

    ``consumers`` are ``ConsumerProcess`` objects; one that exits meanwhile fails the wait
    with its output, rather than timing out.
    """
    from delayjobs.index.keys import wake_channel

    channel = wake_channel(queue)

    def listening() -> bool:
        for consumer in consumers:
            if consumer.returncode is not None:
                raise AssertionError(
                    f"consumer {consumer.pid} exited with {consumer.returncode}:\n"
                    f"{consumer.output()}"
                )
        return dict(client.pubsub_numsub(channel)).get(channel.encode(), 0) >= len(consumers)

    wait_for(listening, message=f"{len(consumers)} consumer(s) not listening on {channel}")


def in_thread(call: Callable[[], object]) -> threading.Thread:
    """``call`` in a started daemon thread, which closes its own database connections when
    it is done (the test database is dropped after the test: open ones would hold it)."""
    from django.db import connections

    def run() -> None:
        try:
            call()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@contextmanager
def row_locked(model: Any, pk: int) -> Iterator[None]:
    """Hold a row lock (SELECT ... FOR UPDATE) from another connection while in the block.

    Stands in for a caller's open transaction on the row (a replace, a cancel ...).
    """
    import threading

    from django.db import connections, transaction

    holding, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        try:
            with transaction.atomic():
                model.objects.select_for_update().get(pk=pk)
                holding.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_lock)
    holder.start()
    try:
        assert holding.wait(30), "could not take the row lock"
        yield
    finally:
        release.set()
        holder.join(30)


def fuzz_settings(max_examples: int) -> settings:
    """Hypothesis settings for CI: a fixed number of examples, the same ones in every run
    (derandomized), no example database in the working tree, no deadline (a request may
    wait for the database), and fixtures set up once per test rather than per example."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
