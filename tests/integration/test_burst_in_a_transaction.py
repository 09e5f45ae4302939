"""``run_delay_consumer --burst`` called in-process inside the caller's transaction, as a
project's test (Django's ``TestCase``) drains what is due: the consumer's row is written
and withdrawn on the caller's connection, so that the rollback takes it back. Written from
another connection, it was committed there, outlived the rollback, and showed as a live
consumer to every later test (on SQLite, once the caller's lock let it write)."""

from __future__ import annotations

import threading

import pytest
import redis
from django.core.management import call_command
from django.db import DEFAULT_DB_ALIAS, connections

from delayjobs.models import Consumer

pytestmark = pytest.mark.django_db  # the test's own transaction, rolled back at its end


def test_a_burst_in_the_callers_transaction_commits_no_consumer_row(
    redis_client: redis.Redis,
) -> None:
    call_command("run_delay_consumer", "--burst", "--no-preload", "--worker-id", "drain")

    # None of its threads outlives it: one still writing could commit after the rollback.
    assert [t.name for t in threading.enumerate() if t.name.startswith("delayjobs-")] == []

    # What any other connection sees: what was committed.
    other = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with other.cursor() as cursor:
            table = other.ops.quote_name(Consumer._meta.db_table)
            cursor.execute(f"SELECT COUNT(*) FROM {table} WHERE worker_id = %s", ["drain"])
            assert cursor.fetchone() == (0,)
    finally:
        other.close()
