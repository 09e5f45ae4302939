"""The test suite's own services are real and behave as the fixtures assume."""

from __future__ import annotations

import os

import pytest
import redis
from django.conf import settings
from django.db import connection

from tests.support.redis_server import RedisServer, redis_ping
from tests.utils import wait_for


def test_test_redis_answers_ping(redis_client: redis.Redis) -> None:
    assert redis_client.ping() is True
    assert settings.DELAYJOBS["REDIS_URL"] == os.environ["DELAYJOBS_TEST_REDIS_URL"]


def test_redis_is_flushed_between_tests_part_one(redis_client: redis.Redis) -> None:
    redis_client.set("dj-test:leftover", "1")


def test_redis_is_flushed_between_tests_part_two(redis_client: redis.Redis) -> None:
    assert redis_client.dbsize() == 0


def test_redis_server_restart_loses_data_keeps_port() -> None:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        try:
            client.set("k", "v")
            old_pid, url = server.pid, server.url
            server.restart()
            assert server.url == url
            assert server.pid != old_pid
            # Started without persistence: a restart is an empty Redis.
            assert client.get("k") is None
        finally:
            client.close()
    port = server.port
    assert port is not None
    wait_for(lambda: not redis_ping(port), timeout=5, message="redis-server still answers")


@pytest.mark.django_db
def test_database_is_the_selected_vendor() -> None:
    expected = {"sqlite": "sqlite", "postgres": "postgresql"}[
        os.environ.get("DELAYJOBS_TEST_DB", "sqlite")
    ]
    assert connection.vendor == expected
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
    if connection.vendor == "sqlite":
        # A file shared with consumer subprocesses, never an in-memory database.
        assert os.path.isfile(connection.settings_dict["NAME"])
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode")
            assert cursor.fetchone() == ("wal",)
