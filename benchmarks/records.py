"""What every system's benchmark job writes about itself, and the reading of it.

Every system's job (``benchmarks.bodies.job``) calls :func:`record` first thing, so that
each start time is taken the same way: ``time.time()`` (the wall clock, the clock
``run_at`` is given in), written as one line with one ``os.write`` to a file opened with
``O_APPEND``, one file per process. Nothing is buffered and no lock is taken, so no system
pays more for it than another; a line shorter than a page is written whole even by forked
children. After its body, the job calls :func:`record_end` the same way (another file): a
start without an end is a body that failed or never finished.

Standard library only: the peers' worker processes import this module too.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

RECORD_DIR_ENV = "DELAYJOBS_BENCH_RECORD_DIR"

#: File descriptor by suffix (``rec``, ``end``), and the pid that opened them.
_fds: dict[str, int] = {}
_fds_pid: int | None = None


def record(job_id: int, run_at: float) -> None:
    """Append ``job_id run_at start`` to this process's record file."""
    start = time.time()
    os.write(_fd("rec"), f"{job_id} {run_at!r} {start!r}\n".encode())


def record_end(job_id: int) -> None:
    """Append ``job_id end`` to this process's end file, once the job's body returned."""
    end = time.time()
    os.write(_fd("end"), f"{job_id} {end!r}\n".encode())


def _fd(suffix: str) -> int:
    global _fds_pid
    pid = os.getpid()
    if _fds_pid != pid:  # first job, or a forked child (prefork pools): files of its own
        _fds.clear()
        _fds_pid = pid
    fd = _fds.get(suffix)
    if fd is None:
        path = os.path.join(os.environ[RECORD_DIR_ENV], f"{pid}.{suffix}")
        fd = _fds[suffix] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    return fd


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
    #: job id -> end times (``record_end``), one per execution whose body returned.
    ends: dict[int, list[float]] = field(default_factory=dict)
    _offsets: dict[Path, int] = field(default_factory=dict)
    _partial: dict[Path, bytes] = field(default_factory=dict)

    def poll(self) -> int:
        """Read what was appended since the last call; the number of executions so far."""
        for path in sorted(self.directory.glob("*.rec")):
            pid = int(path.stem)
            for line in self._new_lines(path):
                job_id, run_at, start = line.split()
                self.executions.append(Execution(int(job_id), float(run_at), float(start), pid))
        for path in sorted(self.directory.glob("*.end")):
            for line in self._new_lines(path):
                job_id, end = line.split()
                self.ends.setdefault(int(job_id), []).append(float(end))
        return len(self.executions)

    def _new_lines(self, path: Path) -> list[bytes]:
        """The whole lines appended to ``path`` since the last call."""
        offset = self._offsets.get(path, 0)
        with open(path, "rb") as file:
            file.seek(offset)
            chunk = file.read()
        if not chunk:
            return []
        self._offsets[path] = offset + len(chunk)
        data = self._partial.pop(path, b"") + chunk
        *lines, rest = data.split(b"\n")
        if rest:
            self._partial[path] = rest  # a line caught half-written
        return lines

    def count(self, ids: range) -> int:
        """How many executions of ids in ``ids`` were read (duplicates included)."""
        return sum(1 for execution in self.executions if execution.job_id in ids)

    def pids(self) -> set[int]:
        return {execution.pid for execution in self.executions}
