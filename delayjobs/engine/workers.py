"""The consumer's worker threads: a fixed number of daemon threads taking jobs in turn.

Not a ``ThreadPoolExecutor``: its threads are joined when the interpreter exits, so a job
stuck forever would keep a stopped consumer from ever exiting. These threads are daemons;
the consumer itself waits for running jobs, each up to its time-out.
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
        self._tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{number}", daemon=True)
            for number in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, function: Callable[[Any], None], argument: Any) -> None:
        self._tasks.put((function, argument))

    def stop(self) -> None:
        """Let each thread exit once it is idle; threads stuck in a job are left behind."""
        for _ in self._threads:
            self._tasks.put(_STOP)

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
