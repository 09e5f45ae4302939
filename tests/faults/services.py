"""The fault suite's own PostgreSQL and Redis, which its scenarios stop and start.

They are separate from the servers of the main test run, so the suite does not depend on
which database that run uses, and taking them down disturbs no other test.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import redis

from tests.faults.jobs import LEDGER_ENV
from tests.support.postgres import PostgresServer
from tests.support.processes import LOOPBACK
from tests.support.redis_server import RedisServer

REPO_ROOT = Path(__file__).resolve().parents[2]
MIGRATE_TIMEOUT = 120.0
#: A JSON object that tests.settings merges into the child processes' DATABASES["default"].
DB_OVERRIDES_ENV = "DELAYJOBS_TEST_DB_OVERRIDES"

#: Variables of the main test run that must not leak into the suite's processes.
MAIN_RUN_ONLY = (
    "DELAYJOBS_TEST_OVERRIDES",
    "DELAYJOBS_TEST_SQLITE_DIR",
    DB_OVERRIDES_ENV,
    LEDGER_ENV,
)


class FaultServices:
    """The suite's servers, and how its subprocesses and checks reach them.

    Its scenarios take each server down and bring it up again (``take_down``,
    ``bring_up``): PostgreSQL keeps its data, Redis comes back empty.
    """

    def __init__(self, *, listen: tuple[str, ...] = (), trusted: tuple[str, ...] = ()) -> None:
        """``listen``: addresses both servers listen on besides 127.0.0.1; ``trusted``:
        networks PostgreSQL lets in (tests/scale's network namespaces reach them so)."""
        self.postgres = PostgresServer(listen=listen, trusted=trusted)
        self.redis = RedisServer(listen=listen)

    def start(self) -> FaultServices:
        try:
            self.postgres.start()
            self.redis.start()
            self.migrate()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        # Each stop() signals its own server by pid; a failing one must not skip the other.
        with contextlib.suppress(Exception):
            self.redis.stop()
        self.postgres.stop()

    def env(self, **extra: str) -> dict[str, str]:
        """Environment of a child Django process (consumer, driver) on the suite's servers.

        tests.settings reads these and, finding every address given, starts nothing.
        """
        env = {key: value for key, value in os.environ.items() if key not in MAIN_RUN_ONLY}
        env.update(
            DJANGO_SETTINGS_MODULE="tests.settings",
            DELAYJOBS_TEST_DB="postgres",
            DELAYJOBS_TEST_PG_PORT=str(self.postgres.port),
            DELAYJOBS_TEST_DB_NAME=self.postgres.name,
            DELAYJOBS_TEST_REDIS_URL=self.redis.url,
            PYTHONUNBUFFERED="1",
        )
        overrides = self.database_overrides()
        if overrides:
            env[DB_OVERRIDES_ENV] = json.dumps(overrides)
        env.update(extra)
        return env

    def database_overrides(self) -> dict[str, Any]:
        """What the child processes' DATABASES["default"] changes: nothing, here.

        A subclass puts something between them and PostgreSQL (tests/scale's PgBouncer)
        by returning its port and settings; the checks (:meth:`connect`) still go
        straight to PostgreSQL, so they see the truth whatever the fault in between.
        """
        return {}

    def migrate(self) -> None:
        completed = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=REPO_ROOT,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=MIGRATE_TIMEOUT,
            check=False,
        )
        if completed.returncode != 0:
            raise RuntimeError(
                f"migrating the fault suite's database failed ({completed.returncode}):\n"
                f"{completed.stdout}\n{completed.stderr}"
            )

    def connect(self, port: int | None = None) -> psycopg.Connection[Any]:
        """A new autocommit connection to the suite's database, for the checks.

        ``port``: another way in than PostgreSQL's own port (a PgBouncer in front of it).
        """
        return psycopg.connect(
            host=LOOPBACK,
            port=port or self.postgres.port,
            user=self.postgres.user,
            dbname=self.postgres.name,
            autocommit=True,
            connect_timeout=5,
        )

    def redis_client(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis.url, socket_connect_timeout=1, socket_timeout=5)

    def versions(self) -> dict[str, str]:
        with self.connect() as connection:
            row = connection.execute("SHOW server_version").fetchone()
        client = self.redis_client()
        try:
            redis_version = str(client.info("server").get("redis_version"))
        finally:
            client.close()
        return {"postgresql": str(row[0]) if row else "?", "redis": redis_version}
