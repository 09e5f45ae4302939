"""A throwaway PgBouncer on 127.0.0.1 in front of a ``PostgresServer``, for tests/scale."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from tests.support.postgres import PostgresServer, postgres_user_if_root, run_as_kwargs
from tests.support.processes import LOOPBACK, Server

#: Where Debian's ``pgbouncer`` package puts its binary.
SYSTEM_PGBOUNCER = "/usr/sbin/pgbouncer"


def find_pgbouncer() -> str:
    """Path of a ``pgbouncer`` binary (``DELAYJOBS_PGBOUNCER``, PATH, Debian's), or RuntimeError."""
    explicit = os.environ.get("DELAYJOBS_PGBOUNCER")
    candidates = [explicit] if explicit else [shutil.which("pgbouncer"), SYSTEM_PGBOUNCER]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError(
        f"No pgbouncer binary found ({explicit or 'PATH, ' + SYSTEM_PGBOUNCER}). Install it "
        "with `apt-get install pgbouncer` (.ci/scale does this when run as root), or point "
        "DELAYJOBS_PGBOUNCER at one."
    )


class PgBouncerServer(Server):
    """A throwaway PgBouncer on 127.0.0.1 in front of a :class:`PostgresServer`.

    Transaction pooling, one database entry for the server's database. Auth is ``trust``
    as on the server behind it: the user must still be listed in PgBouncer's auth file,
    which holds it without a password, and PgBouncer logs in to PostgreSQL as that user
    (trust there too). ``settings`` are more ``[pgbouncer]`` directives
    (``default_pool_size``, ``query_wait_timeout``...). Its user may also open the admin
    console (:meth:`admin`). Like PostgreSQL, it refuses to run as root: as root it runs as
    the ``postgres`` system user.
    """

    database = PostgresServer.name
    user = PostgresServer.user
    #: PgBouncer's immediate shutdown: connections are cut, in transactions or not
    #: (SIGINT would wait for every transaction to end).
    _stop_signal = signal.SIGTERM

    def __init__(
        self, postgres: PostgresServer, *, settings: dict[str, str | int] | None = None
    ) -> None:
        self.postgres = postgres
        self.settings = dict(settings or {})
        self._root: Path | None = None
        self._run_as = postgres_user_if_root("PgBouncer")

    @property
    def log_path(self) -> Path:
        if self._root is None:
            raise RuntimeError("PgBouncerServer is not started")
        return self._root / "pgbouncer.log"

    def settings_dict(self) -> dict[str, Any]:
        """A Django DATABASES entry through this PgBouncer, as transaction pooling needs.

        Server-side cursors (``.iterator()``) would outlive the transaction that declared
        them on a server connection another client may get next: Django's documented
        setting turns them off.
        """
        if self.port is None:
            raise RuntimeError("PgBouncerServer is not started")
        return {
            **self.postgres.settings_dict(),
            "PORT": str(self.port),
            "DISABLE_SERVER_SIDE_CURSORS": True,
        }

    def start(self) -> PgBouncerServer:
        if self._process is not None:
            return self
        if self.postgres.port is None:
            raise RuntimeError("Start the PostgresServer before its PgBouncer")
        self._root = Path(tempfile.mkdtemp(prefix="delayjobs-pgbouncer-"))
        try:
            if self._run_as is not None:
                os.chown(self._root, self._run_as.pw_uid, self._run_as.pw_gid)
            (self._root / "userlist.txt").write_text(f'"{self.user}" ""\n')
            self._launch_on_a_free_port()
        except BaseException:
            self.stop()
            raise
        return self

    def _config(self) -> str:
        assert self._root is not None and self.port is not None
        directives: dict[str, str | int] = {
            "listen_addr": LOOPBACK,
            "listen_port": self.port,
            "unix_socket_dir": "",  # TCP on loopback only
            "auth_type": "trust",
            "auth_file": str(self._root / "userlist.txt"),
            "admin_users": self.user,
            "pool_mode": "transaction",
            "logfile": str(self.log_path),
            "pidfile": "",
            # psycopg2 sends it at startup; PgBouncer refuses unknown startup parameters.
            "ignore_startup_parameters": "extra_float_digits",
            **self.settings,
        }
        server = f"host={LOOPBACK} port={self.postgres.port} dbname={self.database}"
        lines = ["[databases]", f"{self.database} = {server}", "", "[pgbouncer]"]
        lines += [f"{name} = {value}" for name, value in directives.items()]
        return "\n".join(lines) + "\n"

    def _launch(self) -> None:
        assert self._root is not None and self.port is not None
        config = self._root / "pgbouncer.ini"
        config.write_text(self._config())
        if self._run_as is not None:  # it reads its files as that user
            for path in (config, self._root / "userlist.txt"):
                os.chown(path, self._run_as.pw_uid, self._run_as.pw_gid)
        stdout = self._root / "stdout.log"
        self._spawn(
            [find_pgbouncer(), str(config)],
            stdout,
            cwd=self._root,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
            **run_as_kwargs(self._run_as),
        )
        # Ready once its admin console answers: the configuration is loaded and the
        # listening socket open.
        self._await_ready(self._answers, "pgbouncer", self.log_path, stdout)

    def _answers(self) -> bool:
        with contextlib.suppress(psycopg.Error):
            self.admin("SHOW VERSION")
            return True
        return False

    def admin(self, command: str) -> list[dict[str, Any]]:
        """Run an admin console command (``SHOW POOLS``, ``SHOW CLIENTS``...): its rows.

        The console speaks only the simple query protocol: psycopg's ClientCursor uses it.
        """
        if self.port is None:
            raise RuntimeError("PgBouncerServer is not started")
        with psycopg.connect(
            host=LOOPBACK,
            port=self.port,
            user=self.user,
            dbname="pgbouncer",
            autocommit=True,
            connect_timeout=2,
            cursor_factory=psycopg.ClientCursor,
        ) as connection:
            cursor = connection.cursor(row_factory=dict_row)
            return cursor.execute(command).fetchall()

    def stop(self) -> None:
        self.take_down()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
