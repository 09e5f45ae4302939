"""A peer's scheduling client in a process of its own, for the peers the driver cannot load.

The driver runs on ``.venv-bench`` with ``benchmarks.settings``; Oban for Python and dj-queue
need Python 3.12 (``.venv-bench-py312``), and Django Tasks' backends need Django settings
of their own. Their systems schedule through this client: ``python -m benchmarks.remote
MODULE`` imports MODULE, which defines ``versions()``, ``schedule_one(job)`` and
``schedule_many(jobs)``, and serves one call per line of its standard input (a JSON array:
the function's name, then its arguments) with one line on its standard output (a JSON
object: ``{"ok": result}`` or ``{"error": traceback}``).

Each call costs one pipe round trip more than an in-process call (about 25 microseconds
here, for a call that does nothing), which the W3 figures of these peers include.

Standard library only: it runs in either venv.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parent.parent


class RemoteError(RuntimeError):
    """The client process failed a call, or exited."""


class Client:
    """The driver's end: the client process, started on the first call."""

    def __init__(self, python: str, module: str, env: dict[str, str], log: Path) -> None:
        self.command = [python, "-m", "benchmarks.remote", module]
        self.env = env
        self.log = log
        self._process: subprocess.Popen[bytes] | None = None

    def call(self, function: str, *args: Any) -> Any:
        process = self._process or self._start()
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps([function, *args]).encode() + b"\n")
        process.stdin.flush()
        line = process.stdout.readline()
        if not line:
            self.close()
            raise RemoteError(f"{self.command[-1]} exited:\n{self._log_tail()}")
        reply = json.loads(line)
        if "error" in reply:
            raise RemoteError(f"{self.command[-1]}.{function}: {reply['error']}")
        return reply["ok"]

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            assert process.stdin is not None
            process.stdin.close()  # end of input: the client exits
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _start(self) -> subprocess.Popen[bytes]:
        from tests.support.processes import pdeathsig_preexec

        with open(self.log, "ab") as log:
            self._process = subprocess.Popen(
                self.command,
                cwd=REPO_ROOT,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                preexec_fn=pdeathsig_preexec(os.getpid()),
            )
        return self._process

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"


def serve(module: Any, lines: IO[str], out: IO[str]) -> None:
    """Answer each call read from ``lines`` until they end."""
    for line in lines:
        function, *args = json.loads(line)
        try:
            reply = {"ok": getattr(module, function)(*args)}
        except Exception:
            reply = {"error": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def main(argv: Sequence[str]) -> None:
    serve(importlib.import_module(argv[0]), sys.stdin, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
