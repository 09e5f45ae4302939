"""The supervisor: one process that keeps N consumer processes running on this host.

``run_delay_consumer --processes N`` with N above 1 (the default, ``auto``, is one per
usable CPU) makes the command's own process a supervisor. It forks the consumers after
Django's set-up, as gunicorn's arbiter forks its workers: each child starts in
milliseconds, shares the set-up's memory with its siblings until it writes to it, and
runs one ``Consumer`` exactly as ``--processes 1`` would. The supervisor itself runs no
job and stays single-threaded; it holds no database connection and no Redis client when
it forks (it closes them first), so no child inherits a socket another process uses.

What it does:

- starts N children, each with its slot (1 to N) to name it; a child that exits while
  nobody asked it to is started again, at once if it had run a while, else after a
  back-off that doubles up to RESTART_BACKOFF_CAP (a child that fails at start never
  turns into a fork loop), each restart logged at WARNING with the exit status;
- on SIGTERM or SIGINT, sends SIGTERM to every child, which finishes its running jobs and
  exits, and waits for them all; a second signal is passed on too, and the children exit
  at once. Children ignore SIGINT: Ctrl-C in a terminal reaches every process of the
  foreground group, and each child must hear the supervisor's signal once, not twice;
- a child whose supervisor died (SIGKILL, say) notices at once, through a pipe whose only
  writer was the supervisor, and stops as on SIGTERM;
- with ``burst``, a child that exits is done: the supervisor exits once every child did;
- a child that cannot start as configured exits with EXIT_CONFIG, and the supervisor
  stops the others rather than restart it forever.

It returns 0 if every child exited 0 in the end, else 1.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any, NoReturn

from django.db import connections

from delayjobs.core import metrics
from delayjobs.core.backoff import equal_jitter_backoff
from delayjobs.index.client import reset_client

logger = logging.getLogger("delayjobs.supervisor")

#: A child that could not start as configured (sysexits' EX_CONFIG): starting it again
#: would fail the same way, so the supervisor stops instead.
EXIT_CONFIG = 78
#: The signals a child stops on; it ignores SIGINT (see the module's docstring).
CHILD_STOP_SIGNALS = (signal.SIGTERM,)
#: A child that ran this long before it died is started again at once; one that died
#: sooner waits a back-off that doubles with each such death in a row.
STABLE_AFTER = 30.0
RESTART_BACKOFF = timedelta(seconds=1)
RESTART_BACKOFF_CAP = timedelta(seconds=60)
#: The longest the supervisor sleeps without looking at its children. Only a safety net:
#: a child's exit and a signal wake it at once (SIGCHLD, through the wake-up pipe).
IDLE_WAIT = 5.0
_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the OS says), else all of them."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def describe_status(code: int) -> str:
    """An exit code as ``os.waitstatus_to_exitcode`` returns it, in words."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class Child:
    slot: int
    pid: int
    started: float  # time.monotonic()


@dataclass
class Slot:
    """One of the N places a child fills, across its restarts."""

    number: int
    #: Deaths in a row, each soon after its start (reset by a child that ran STABLE_AFTER).
    quick_deaths: int = 0
    #: When to start its next child (time.monotonic()), if it has none now.
    restart_at: float | None = None
    #: The seconds its latest restart waited (the back-off).
    waited: float = 0.0
    #: Its last child's exit code, once it is done (burst, or stopping).
    final: int | None = None


class Supervisor:
    """Starts ``processes`` children, each running ``run_child(slot)`` (its return value
    is the child's exit code), and keeps them running until a signal or, with ``burst``,
    until each is done."""

    def __init__(
        self, processes: int, run_child: Callable[[int], int], *, burst: bool = False
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, got {processes}")
        self.run_child = run_child
        self.burst = burst
        self.slots = {number: Slot(number) for number in range(1, processes + 1)}
        self.children: dict[int, Child] = {}  # by pid
        self.stopping = False
        self._signals: list[int] = []
        self._stop_signals = 0
        self._failed = False
        self._wake_r = self._wake_w = self._lifeline_r = self._lifeline_w = -1
        self._previous: dict[int, Any] = {}
        self._previous_wakeup = -1

    # Lifecycle ------------------------------------------------------------------------

    def run(self) -> int:
        """Supervise until every child has exited; 0 if each exited 0 in the end, else 1."""
        logger.info(
            "Supervisor %d: starting %d consumer processes%s.",
            os.getpid(),
            len(self.slots),
            ", each in burst mode" if self.burst else "",
        )
        self._install()
        try:
            # What Django's set-up loaded lives as long as every child: out of the garbage
            # collector's sight, a collection in a child neither walks it nor copies its
            # pages (CPython's advice for a process that forks, gc.freeze). No collection
            # first: start-up leaves no garbage to speak of, and one would cost every
            # child's first job about 30 ms (see freeze_startup_objects).
            gc.freeze()
            for slot in self.slots.values():
                self._start(slot)
            while self.children or self._restarts_pending():
                self._wait()
                self._handle_signals()
                self._reap()
                self._restart_due()
        finally:
            self._uninstall()
        logger.info("Supervisor %d: every consumer process has exited.", os.getpid())
        return 1 if self._failed else 0

    def _install(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        # Written to by no one: a child reads end-of-file once the supervisor is gone.
        self._lifeline_r, self._lifeline_w = os.pipe()
        self._previous_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for signum in _HANDLED:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def _uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._previous_wakeup)
        for fd in (self._wake_r, self._wake_w, self._lifeline_r, self._lifeline_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only noted here: the loop acts on it once the wake-up pipe has woken it, so that
        # a signal never lands halfway through starting a child.
        self._signals.append(signum)

    def _wait(self) -> None:
        """Sleep until a signal (a child's exit is SIGCHLD) or the next restart is due."""
        timeout = IDLE_WAIT
        restarts = [slot.restart_at for slot in self.slots.values() if slot.restart_at]
        if restarts:
            timeout = min(timeout, max(0.0, min(restarts) - time.monotonic()))
        if self._signals:
            timeout = 0.0
        readable, _, _ = select.select([self._wake_r], [], [], timeout)
        if readable:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)

    # Signals --------------------------------------------------------------------------

    def _handle_signals(self) -> None:
        received, self._signals = self._signals, []
        for signum in received:
            if signum != signal.SIGCHLD:
                self.stop(signal.Signals(signum).name)

    def stop(self, name: str) -> None:
        """Stop every child (SIGTERM): the first time gracefully, again at once."""
        self._stop_signals += 1
        if self._stop_signals == 1:
            logger.warning(
                "%s: stopping %d consumer process(es); each finishes its running jobs "
                "(again to make them exit at once).",
                name,
                len(self.children),
            )
        else:
            logger.warning("%s again: the consumer processes exit at once.", name)
        self.stopping = True
        for slot in self.slots.values():
            slot.restart_at = None
        for child in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)

    # Children -------------------------------------------------------------------------

    def _restarts_pending(self) -> bool:
        return any(slot.restart_at is not None for slot in self.slots.values())

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots.values():
            if slot.restart_at is not None and slot.restart_at <= now and not self.stopping:
                slot.restart_at = None
                self._start(slot)

    def _start(self, slot: Slot) -> None:
        self._before_fork()
        # Blocked across fork(): a stop signal sent to the new child before it can honour
        # it waits until it can (see CHILD_STOP_SIGNALS), and one meant for the supervisor
        # is not taken by the child's copy of its handler.
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        try:
            pid = os.fork()
        except OSError as exc:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            self._schedule_restart(slot, f"{self._name(slot)} could not be forked ({exc})", True)
            return
        if pid == 0:
            self._child_main(slot.number, old_mask)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        self.children[pid] = Child(slot.number, pid, time.monotonic())
        logger.info("%s started (pid %d).", self._name(slot), pid)

    def _before_fork(self) -> None:
        """Nothing a child could share with the supervisor: no database connection, no
        Redis client. Django's set-up and the system checks may have opened either."""
        connections.close_all()
        reset_client()
        for stream in (sys.stdout, sys.stderr):  # else each child writes its copy again
            stream.flush()
        others = [
            thread.name for thread in threading.enumerate() if thread is not threading.main_thread()
        ]
        if others:
            # Only this thread goes on in the child: a lock another thread holds now stays
            # held there. Project code that starts threads at import does this.
            logger.warning(
                "Supervisor %d forks with other threads running (%s): a consumer process "
                "that hangs at start is a sign of one; run --processes 1 per process then.",
                os.getpid(),
                ", ".join(others),
            )

    def _reap(self) -> None:
        for pid, child in list(self.children.items()):
            try:
                waited, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: its status is lost
                waited, status = pid, 255 << 8
            if waited == 0:
                continue
            del self.children[pid]
            metrics.process_gone(pid)
            self.child_exited(child, os.waitstatus_to_exitcode(status))

    def child_exited(self, child: Child, code: int) -> None:
        """Act on a child's exit: done, stop everything, or start it again."""
        slot = self.slots[child.slot]
        what = f"{self._name(slot)} (pid {child.pid})"
        if self.stopping or (self.burst and code == 0):
            slot.final = code
            self._failed |= code != 0
            log = logger.info if code == 0 else logger.warning
            log("%s exited (%s).", what, describe_status(code))
        elif code == EXIT_CONFIG:
            slot.final = code
            self._failed = True
            logger.error(
                "%s could not start as configured (its error is above): stopping the others.",
                what,
            )
            self.stop("configuration error")
        elif self.burst:
            slot.final = code
            self._failed = True
            logger.warning("%s failed (%s); burst mode restarts none.", what, describe_status(code))
        else:
            quick = time.monotonic() - child.started < STABLE_AFTER
            self._schedule_restart(slot, f"{what} exited ({describe_status(code)})", quick)

    def _name(self, slot: Slot) -> str:
        return f"Consumer process {slot.number} of {len(self.slots)}"

    def _schedule_restart(self, slot: Slot, what: str, quick: bool) -> None:
        slot.quick_deaths = slot.quick_deaths + 1 if quick else 0
        delay = 0.0
        if slot.quick_deaths > 1:
            delay = equal_jitter_backoff(
                slot.quick_deaths - 1, base=RESTART_BACKOFF, cap=RESTART_BACKOFF_CAP
            ).total_seconds()
        logger.warning("%s; starting it again %s.", what, f"in {delay:.1f} s" if delay else "now")
        slot.waited = delay
        slot.restart_at = time.monotonic() + delay

    # In the child ---------------------------------------------------------------------

    def _child_main(self, slot: int, mask: set[int | signal.Signals]) -> NoReturn:
        """Runs in the forked child: never returns into the supervisor's code."""
        code = 1
        try:
            self._become_child(mask)
            code = self.run_child(slot)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)

    def _become_child(self, mask: set[int | signal.Signals]) -> None:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # SIGTERM stays blocked until run_child has put its own handler in place and
        # unblocks it (CHILD_STOP_SIGNALS): one sent meanwhile then stops it gracefully.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set(mask) | {signal.SIGTERM})
        for fd in (self._wake_r, self._wake_w, self._lifeline_w):
            os.close(fd)
        self.children.clear()
        threading.Thread(
            target=_watch_supervisor,
            args=(self._lifeline_r, os.getppid()),
            name="delayjobs-supervisor-watch",
            daemon=True,
        ).start()


def _watch_supervisor(lifeline: int, supervisor: int) -> None:
    """In a child: block until the supervisor is gone (the pipe's end-of-file), then stop
    as on SIGTERM, so that no consumer outlives its supervisor unwatched."""
    with contextlib.suppress(OSError):
        while os.read(lifeline, 1):
            pass  # nobody writes; read() returns b"" (end of file) once the writer is gone
    logger.warning("The supervisor (pid %d) is gone: stopping as on SIGTERM.", supervisor)
    os.kill(os.getpid(), signal.SIGTERM)
