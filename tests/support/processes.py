"""What the test servers share: loopback ports, child processes that die with the test run,
and ``Server``, a server process started, stopped, taken down and brought up by its pid.

Each server (``redis_server``, ``postgres``, ``pgbouncer``, ``sentinel``, ``cluster``) is a
direct child process bound to 127.0.0.1 on a free port, keeps its files in a private
temporary directory and is stopped by its pid. On Linux a child gets a parent-death signal,
so a test run that is SIGKILLed leaves no server behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

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


def pdeathsig_preexec(parent_pid: int) -> Callable[[], None]:
    """A Popen ``preexec_fn``: the child is SIGKILLed when ``parent_pid`` (the caller) dies.

    The kernel's parent-death signal (prctl, Linux only) is the one way a child learns of a
    parent that was SIGKILLed. preexec_fn runs after subprocess has switched uid/gid
    (``user=``/``group=``), which matters: changing credentials clears the signal.
    """

    def preexec() -> None:
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork() and prctl(): then no signal will come.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def read_tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no log)"


def stop_process(process: subprocess.Popen[bytes], sig: int, timeout: float = STOP_TIMEOUT) -> None:
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


class Started:
    """The context manager protocol over ``start()`` and ``stop()``."""

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


class Server(Started):
    """A server process on a loopback port: ``_launch()`` starts it and waits until it answers.

    ``take_down()`` stops the process by its pid and keeps its port and files;
    ``bring_up()`` starts it again there (for fault tests); ``stop()`` also removes the files.
    """

    port: int | None = None
    #: The port asked for; None: a free one is picked at each first start.
    _requested_port: int | None = None
    _process: subprocess.Popen[bytes] | None = None
    #: What stops the server by its pid (SIGKILL if it has not exited within STOP_TIMEOUT).
    _stop_signal: int = signal.SIGTERM

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def _launch(self) -> None:
        raise NotImplementedError

    def take_down(self) -> None:
        """Stop the server by its pid; its port and files stay for ``bring_up()``."""
        if self._process is not None:
            stop_process(self._process, self._stop_signal)
            self._process = None

    def bring_up(self) -> None:
        """Start again on the same port and files; returns once the server answers."""
        if self.port is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        self._launch()

    def restart(self) -> Self:
        self.take_down()
        self.bring_up()
        return self

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

    def _spawn(self, command: list[str], log_path: Path, **popen: Any) -> None:
        """Start the server process, its output to ``log_path``."""
        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=pdeathsig_preexec(os.getpid()),
                # Out of the terminal's process group: a Ctrl-C meant for pytest must not kill
                # the server before pytest's own clean-up stops it.
                start_new_session=True,
                **popen,
            )

    def _await_ready(self, ready: Callable[[], bool], what: str, *logs: Path) -> None:
        """Until ``ready()``; if the process exits or START_TIMEOUT passes first, kill it and
        raise RuntimeError with the end of its ``logs``."""
        assert self._process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and self._process.poll() is None:
            if ready():
                return
            time.sleep(0.02)  # a poll of the server, not a wait for timing
        process, self._process = self._process, None
        stop_process(process, signal.SIGKILL)
        raise RuntimeError(
            f"{what} did not answer on {LOOPBACK}:{self.port} within {START_TIMEOUT:.0f}s "
            f"(exit code {process.returncode}). Log:\n" + "".join(read_tail(log) for log in logs)
        )
