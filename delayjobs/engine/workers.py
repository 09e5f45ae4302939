"""The consumer's worker threads: up to a fixed number of daemon threads taking jobs in turn.

Not a ``ThreadPoolExecutor``: its threads are joined when the interpreter exits, so a job
stuck forever would keep a stopped consumer from ever exiting. These threads are daemons;
the consumer itself waits for running jobs, each up to its time-out.

Threads start as work needs them, not all at once: a consumer at ``--concurrency 500``
whose jobs are mostly async (run on the event loop, see ``event_loop``) needs few threads,
and each idle one costs its stack. One starts when a task is submitted while none is free;
they never stop before ``stop``, so a burst pays for its threads once.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("delayjobs.workers")  # the old path: users' LOGGING names it

_STOP = object()


class WorkerThreads:
    def __init__(self, size: int, *, name: str) -> None:
        self._size = size
        self._name = name
        self._tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        # Threads not running a task, less tasks queued for none yet: below zero, a task
        # waits for a thread, and one more starts (up to size). Under its own lock, held
        # only for the arithmetic: two short holds per task.
        self._spare = 0
        self._lock = threading.Lock()

    @property
    def started(self) -> int:
        """How many threads have started so far."""
        return len(self._threads)

    @property
    def spare(self) -> int:
        """Threads idle, less tasks waiting for one (below zero: tasks wait)."""
        with self._lock:
            return self._spare

    def submit(self, function: Callable[[Any], None], argument: Any) -> None:
        with self._lock:
            self._spare -= 1
            if self._spare < 0 and len(self._threads) < self._size:
                self._spare += 1  # the new thread, idle until it takes this task
                self._start_thread()
        self._tasks.put((function, argument))

    def stop(self) -> None:
        """Let each thread exit once it is idle; threads stuck in a job are left behind."""
        with self._lock:
            count = len(self._threads)
            self._size = 0  # none starts after this
        for _ in range(count):
            self._tasks.put(_STOP)

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is _STOP:
                return
            function, argument = task
            try:
                function(argument)
            except BaseException:  # a bug in the caller's function must not cost a thread
                logger.exception("Worker thread: unexpected error; the thread goes on")
            with self._lock:
                self._spare += 1
