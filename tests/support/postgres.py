"""A throwaway PostgreSQL cluster for the tests and the benchmarks: ``initdb`` into a private
temporary directory, then ``postgres`` on a loopback port, trust auth."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.support.processes import LOOPBACK, Server, read_tail

#: No flush to disk on commit: fine for throwaway test data, never for real data.
FAST_UNSAFE_OPTIONS = (
    "-c",
    "fsync=off",
    "-c",
    "synchronous_commit=off",
    "-c",
    "full_page_writes=off",
)


def find_postgres_bin() -> Path:
    """The bin directory holding ``initdb`` and ``postgres`` (Debian keeps it off PATH)."""
    candidates: list[Path] = []
    initdb = shutil.which("initdb")
    if initdb:
        # /usr/local/bin/initdb may be a symlink: its siblings live in the real directory.
        candidates.append(Path(os.path.realpath(initdb)).parent)

    def version(path: str) -> tuple[int, ...]:
        name = Path(path).parent.name
        return tuple(int(part) for part in name.split(".") if part.isdigit())

    for path in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        candidates.append(Path(path))
    for directory in candidates:
        if all((directory / name).is_file() for name in ("initdb", "postgres", "pg_isready")):
            return directory
    raise RuntimeError(
        "PostgreSQL server binaries (initdb, postgres) not found on PATH or in "
        "/usr/lib/postgresql/*/bin. Install them with `apt-get install postgresql` "
        "(tests/run.sh does this when run as root)."
    )


def postgres_user_if_root(program: str) -> pwd.struct_passwd | None:
    """The ``postgres`` system user when we run as root (``program`` refuses root), else None."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError as exc:
        raise RuntimeError(
            f"Running as root, but there is no 'postgres' user to run {program} as "
            "(apt-get install postgresql creates it)."
        ) from exc


def run_as_kwargs(user: pwd.struct_passwd | None) -> dict[str, Any]:
    """Popen arguments that start a child as ``user`` (nothing if None).

    subprocess applies them before preexec_fn, so the parent-death signal survives the switch.
    """
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


class PostgresServer(Server):
    """A throwaway PostgreSQL cluster, trust auth on 127.0.0.1, tuned for speed not safety.

    ``initdb`` refuses to run as root, so as root the cluster and the server run as the
    ``postgres`` system user (the child drops privileges before exec).
    """

    user = "postgres"
    name = "delayjobs"
    host = LOOPBACK
    #: PostgreSQL's "fast shutdown": abort sessions, checkpoint, exit.
    _stop_signal = signal.SIGINT

    def __init__(
        self,
        port: int | None = None,
        *,
        durable: bool = False,
        listen: tuple[str, ...] = (),
        trusted: tuple[str, ...] = (),
    ) -> None:
        """``durable=False`` (tests) trades crash safety for speed: no fsync on commit.

        ``durable=True`` keeps PostgreSQL's defaults, as a production server runs, for
        benchmarks whose figures must mean something outside this machine.

        ``listen``: addresses to listen on besides 127.0.0.1 (each must exist);
        ``trusted``: networks (CIDR) whose clients may connect without a password, as
        127.0.0.1 may.
        """
        self._requested_port = self.port = port
        self.listen = (LOOPBACK, *listen)
        self.trusted = trusted
        self.durable = durable
        self._root: Path | None = None
        self._bin = find_postgres_bin()
        self._run_as = postgres_user_if_root("PostgreSQL")

    @property
    def data_dir(self) -> Path:
        if self._root is None:
            raise RuntimeError("PostgresServer is not started")
        return self._root / "data"

    def settings_dict(self) -> dict[str, Any]:
        """A Django DATABASES entry for this server."""
        if self.port is None:
            raise RuntimeError("PostgresServer is not started")
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": self.name,
            "USER": self.user,
            "PASSWORD": "",
            "HOST": self.host,
            "PORT": str(self.port),
        }

    def _child_kwargs(self) -> dict[str, Any]:
        env = {
            "PATH": f"{self._bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "LC_ALL": "C",
            "LANG": "C",
            "HOME": str(self._root),
            "TZ": "UTC",
        }
        return {"env": env, "cwd": self._root, **run_as_kwargs(self._run_as)}

    def _run(self, args: list[str], log_path: Path) -> None:
        with open(log_path, "ab") as log:
            completed = subprocess.run(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
                **self._child_kwargs(),
            )
        if completed.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed with exit code {completed.returncode}:\n"
                f"{read_tail(log_path)}"
            )

    def start(self) -> PostgresServer:
        if self._process is not None:
            return self
        self._root = Path(tempfile.mkdtemp(prefix="delayjobs-pg-"))
        try:
            if self._run_as is not None:
                os.chown(self._root, self._run_as.pw_uid, self._run_as.pw_gid)
            initdb = [str(self._bin / "initdb"), "-D", str(self.data_dir), "-A", "trust"]
            initdb += ["-U", self.user, "-E", "UTF8", "--locale=C", "--no-sync"]
            self._run(initdb, self._root / "initdb.log")
            if self.trusted:
                with open(self.data_dir / "pg_hba.conf", "a") as hba:
                    hba.writelines(f"host all all {network} trust\n" for network in self.trusted)
            self._launch_on_a_free_port()
            createdb = [str(self._bin / "createdb"), "-h", self.host, "-p", str(self.port)]
            self._run([*createdb, "-U", self.user, self.name], self._root / "createdb.log")
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self) -> None:
        assert self._root is not None and self.port is not None
        log_path = self._root / "postgres.log"
        command = [str(self._bin / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        command += ["-k", str(self._root), "-c", f"listen_addresses={','.join(self.listen)}"]
        command += ["-c", "max_connections=200", *([] if self.durable else FAST_UNSAFE_OPTIONS)]
        self._spawn(command, log_path, **self._child_kwargs())
        self._await_ready(self._accepting_connections, "PostgreSQL", log_path)

    def _accepting_connections(self) -> bool:
        # A TCP connect succeeds while the server is still recovering; pg_isready only
        # reports success once it accepts real connections.
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=0.5):
                pass
        except OSError:
            return False
        completed = subprocess.run(
            [str(self._bin / "pg_isready"), "-q", "-h", LOOPBACK, "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        return completed.returncode == 0

    def stop(self) -> None:
        self.take_down()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
