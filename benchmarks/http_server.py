"""The local HTTP server the ``http`` benchmark body calls, and its start and stop.

A fixed ``200 ok`` to every request, HTTP/1.1 keep-alive, on one asyncio event loop in a
process of its own: parsing is a search for the blank line that ends a request, so that
the server is never what limits a benchmark. The driver binds the listening socket itself
and hands it to the server process, so there is no port to guess and no start-up race:
connections queue in the socket's backlog until the server accepts them.

``python -m benchmarks.http_server FD`` serves on the inherited socket ``FD``.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

from benchmarks.environment import HTTP_ADDRESS_ENV

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
END_OF_REQUEST = b"\r\n\r\n"  # GET requests have no body


class Responder(asyncio.Protocol):
    """Answers every complete request received on one connection (pipelined ones too)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        data = self.pending + data
        complete = data.count(END_OF_REQUEST)
        if complete and self.transport is not None:
            self.transport.write(RESPONSE * complete)
            data = data[data.rfind(END_OF_REQUEST) + len(END_OF_REQUEST) :]
        self.pending = data


async def serve(listener: socket.socket) -> None:
    server = await asyncio.get_running_loop().create_server(Responder, sock=listener)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def running() -> Iterator[str]:
    """The server in a subprocess on 127.0.0.1; yields (and exports) its ``host:port``,
    after one request answered. Stopped by its pid on the way out."""
    from tests.support.processes import pdeathsig_preexec

    listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
    host, port = listener.getsockname()[:2]
    address = f"{host}:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.http_server", str(listener.fileno())],
        pass_fds=[listener.fileno()],
        stdin=subprocess.DEVNULL,
        preexec_fn=pdeathsig_preexec(os.getpid()),
    )
    listener.close()  # the server's copy stays open
    try:
        _check(host, port)
        os.environ[HTTP_ADDRESS_ENV] = address
        yield address
    finally:
        os.environ.pop(HTTP_ADDRESS_ENV, None)
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _check(host: str, port: int) -> None:
    connection = http.client.HTTPConnection(host, port, timeout=10)
    try:
        connection.request("GET", "/")
        response = connection.getresponse()
        if response.read() != b"ok":
            raise RuntimeError("the benchmark HTTP server did not answer 'ok'")
    finally:
        connection.close()


def main(argv: list[str]) -> int:
    listener = socket.socket(fileno=int(argv[0]))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(listener))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
