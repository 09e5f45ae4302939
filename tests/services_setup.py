"""Start the services the test suite needs, once per test run, and share them via env.

The first process that imports ``tests.settings`` (pytest) starts what is missing and
exports its address in ``os.environ``. Consumer subprocesses started by tests inherit that
environment, so they connect to the same servers and start nothing themselves. Only the
process that started a server stops it (atexit).

Under pytest-xdist the workers share the PostgreSQL server (and the SQLite directory) that
the main process started, each with a test database of its own (pytest-django names it
after the worker), but each starts a Redis of its own: the tests flush Redis, and its
pub/sub channels span all its databases. ``REDIS_OWNER_ENV`` says whose Redis the
environment names: a worker starts its own unless that is itself (its consumers inherit it).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support.postgres import PostgresServer
from tests.support.processes import LOOPBACK
from tests.support.redis_server import RedisServer

REDIS_URL_ENV = "DELAYJOBS_TEST_REDIS_URL"
REDIS_OWNER_ENV = "DELAYJOBS_TEST_REDIS_OWNER"
#: Set by pytest-xdist in each worker ("gw0", "gw1"...), and inherited by its children.
XDIST_WORKER_ENV = "PYTEST_XDIST_WORKER"
DB_ENV = "DELAYJOBS_TEST_DB"
PG_PORT_ENV = "DELAYJOBS_TEST_PG_PORT"
SQLITE_DIR_ENV = "DELAYJOBS_TEST_SQLITE_DIR"
#: "none": start nothing (a unit run: tests/unit needs settings only).
SERVICES_ENV = "DELAYJOBS_TEST_SERVICES"
#: Where a unit run's settings point Redis: a port nothing listens on, refused at once.
NO_REDIS_URL = "redis://127.0.0.1:1/0"

SQLITE_NAME = "delayjobs.sqlite3"
SQLITE_TEST_NAME = "test_delayjobs.sqlite3"


@dataclass(frozen=True)
class RunServices:
    redis_url: str
    db: str  # "sqlite", "postgres" or "none" (a unit run: an in-memory SQLite, no server)
    pg_port: int | None = None
    sqlite_dir: Path | None = None


_services: RunServices | None = None


def _stop_in_owner(stop: Callable[[], object], owner_pid: int) -> None:
    # A forked child inherits atexit handlers; it must not stop its parent's servers.
    if os.getpid() == owner_pid:
        stop()


def _own(stop: Callable[[], object]) -> None:
    atexit.register(_stop_in_owner, stop, os.getpid())


def ensure_services() -> RunServices:
    """Return the services of this test run, starting (and exporting) what is missing."""
    global _services
    if _services is not None:
        return _services
    if os.environ.get(SERVICES_ENV) == "none":
        _services = RunServices(redis_url=NO_REDIS_URL, db="none")
        return _services

    db = os.environ.get(DB_ENV, "sqlite")
    if db not in ("sqlite", "postgres"):
        raise RuntimeError(f"{DB_ENV} must be 'sqlite' or 'postgres', not {db!r}")

    redis_url = os.environ.get(REDIS_URL_ENV)
    worker = os.environ.get(XDIST_WORKER_ENV, "")
    if not redis_url or os.environ.get(REDIS_OWNER_ENV, "") != worker:
        redis = RedisServer().start()
        _own(redis.stop)
        redis_url = os.environ[REDIS_URL_ENV] = redis.url
        os.environ[REDIS_OWNER_ENV] = worker

    pg_port: int | None = None
    sqlite_dir: Path | None = None
    if db == "postgres":
        if os.environ.get(PG_PORT_ENV):
            pg_port = int(os.environ[PG_PORT_ENV])
        else:
            postgres = PostgresServer().start()
            _own(postgres.stop)
            assert postgres.port is not None
            pg_port = postgres.port
            os.environ[PG_PORT_ENV] = str(pg_port)
    elif os.environ.get(SQLITE_DIR_ENV):
        sqlite_dir = Path(os.environ[SQLITE_DIR_ENV])
    else:
        # A file, not :memory:, so that consumer subprocesses see the test database.
        created = Path(tempfile.mkdtemp(prefix="delayjobs-sqlite-"))
        _own(lambda: shutil.rmtree(created, ignore_errors=True))
        os.environ[SQLITE_DIR_ENV] = str(created)
        sqlite_dir = created

    _services = RunServices(redis_url=redis_url, db=db, pg_port=pg_port, sqlite_dir=sqlite_dir)
    return _services


__all__ = ["LOOPBACK", "RunServices", "ensure_services"]
