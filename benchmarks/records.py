"""The one job body every system runs, and the reading of what it wrote.

Every system's no-op job calls :func:`record` first thing, so that each start time is
taken the same way: ``time.time()`` (the wall clock, the clock ``run_at`` is given in),
written as one line with one ``os.write`` to a file opened with ``O_APPEND``, one file per
process. Nothing is buffered and no lock is taken, so no system pays more for it than
another; a line shorter than a page is written whole even by forked children.

Standard library only: the peers' worker processes import this module too.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

RECORD_DIR_ENV = "DELAYJOBS_BENCH_RECORD_DIR"

_fd: int | None = None
_fd_pid: int | None = None


def record(job_id: int, run_at: float) -> None:
    """Append ``job_id run_at start`` to this process's record file."""
    start = time.time()
    global _fd, _fd_pid
    pid = os.getpid()
    if _fd is None or _fd_pid != pid:  # first job, or a forked child (prefork pools)
        directory = os.environ[RECORD_DIR_ENV]
        path = os.path.join(directory, f"{pid}.rec")
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _fd_pid = pid
    os.write(_fd, f"{job_id} {run_at!r} {start!r}\n".encode())


@dataclass
class Execution:
    job_id: int
    run_at: float
    start: float
    pid: int

    @property
    def lateness(self) -> float:
        """Seconds; negative when a job started before it was due."""
        return self.start - self.run_at


@dataclass
class RecordReader:
    """Reads the record files of one directory incrementally (cheap to poll)."""

    directory: Path
    executions: list[Execution] = field(default_factory=list)
    _offsets: dict[Path, int] = field(default_factory=dict)
    _partial: dict[Path, bytes] = field(default_factory=dict)

    def poll(self) -> int:
        """Read what was appended since the last call; the number of executions so far."""
        for path in sorted(self.directory.glob("*.rec")):
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as file:
                file.seek(offset)
                chunk = file.read()
            if not chunk:
                continue
            self._offsets[path] = offset + len(chunk)
            data = self._partial.pop(path, b"") + chunk
            *lines, rest = data.split(b"\n")
            if rest:
                self._partial[path] = rest  # a line caught half-written
            pid = int(path.stem)
            for line in lines:
                job_id, run_at, start = line.split()
                self.executions.append(Execution(int(job_id), float(run_at), float(start), pid))
        return len(self.executions)

    def count(self, ids: range) -> int:
        """How many executions of ids in ``ids`` were read (duplicates included)."""
        return sum(1 for execution in self.executions if execution.job_id in ids)

    def pids(self) -> set[int]:
        return {execution.pid for execution in self.executions}
