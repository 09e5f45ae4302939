"""A consumer whose host clock is off: what VMs resumed from pause and containers without
time sync look like. Installed by tests/settings.py in a process started with
``SKEW_FILE_ENV`` naming a file that holds the offset in seconds (``+60``, ``-60``);
rewriting the file makes the clock jump while the process runs.

The offset is applied where Python reads the wall clock: ``time.time``,
``time.time_ns`` and ``django.utils.timezone.now`` (what delayjobs and Django read). The C
clock stays true: the job bodies of these tests record their start with
``time.clock_gettime(CLOCK_REALTIME)``, the host's real time, which on one host is also the
database server's.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta

SKEW_FILE_ENV = "DELAYJOBS_TEST_CLOCK_SKEW_FILE"


class SkewFile:
    """The offset in a file, re-read whenever the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._offset = 0.0

    def seconds(self) -> float:
        stat = os.stat(self.path)
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            with open(self.path) as file:
                self._offset = float(file.read().strip() or 0)
            self._stamp = stamp
        return self._offset


def install(path: str) -> None:
    """Shift this process's wall clock by the offset in ``path``, from now on."""
    from django.utils import timezone

    skew = SkewFile(path)
    real_time, real_time_ns, real_now = time.time, time.time_ns, timezone.now

    def skewed_time() -> float:
        return real_time() + skew.seconds()

    def skewed_time_ns() -> int:
        return real_time_ns() + round(skew.seconds() * 1e9)

    def skewed_now() -> datetime:
        return real_now() + timedelta(seconds=skew.seconds())

    time.time = skewed_time
    time.time_ns = skewed_time_ns
    timezone.now = skewed_now


def install_from_environment() -> None:
    path = os.environ.get(SKEW_FILE_ENV)
    if path:
        install(path)
