"""The consumer's event loop: one daemon thread running asyncio, for async job types.

A job type whose ``execute`` is ``async def`` runs as a task on this loop rather than in a
worker thread of its own: hundreds of jobs that wait on the network cost one thread. The
local executor starts the loop with the first async job (a consumer of sync types never
has one), hands it claimed jobs in batches (one cross-thread wake-up per claim, not per
job); the time-out machinery (``TimeOuts``) cancels the task of a job it records as timed
out, through ``Running.cancel``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import traceback
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from delayjobs.core import clock
from delayjobs.engine.execution import SPIN, Running

logger = logging.getLogger("delayjobs.consumer")

#: How often the thread that runs Django's async ORM calls (``sync_to_async``'s shared
#: thread) closes its connections if they are broken or past CONN_MAX_AGE, as a worker
#: thread does around each job.
CONNECTION_CHECK = 1.0

#: What the loop runs for one job (the executor's coroutine).
JobCoroutine = Callable[[Running], Coroutine[Any, Any, None]]


async def wait_until_async(moment_ns: int) -> None:
    """``wait_until`` on the loop: sleep, then spin the last SPIN, never return early.

    The loop's timer wakes up to about a millisecond late (epoll counts milliseconds), so
    a job claimed ahead of its run_at may start that much after it; a job already due (a
    backlog) does not wait at all.
    """
    remaining = (moment_ns - clock.time_ns()) / 1e9 - SPIN
    if remaining > 0:
        await asyncio.sleep(remaining)
    while clock.time_ns() < moment_ns:
        pass


def awaiting_stack(task: asyncio.Task[Any]) -> str:
    """Where ``task`` waits, outermost first: its coroutine and each one it awaits (a
    task's own ``get_stack`` stops at the outermost). Read from another thread, as a stuck
    thread's stack is: a moment's picture."""
    summaries = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            break
        summaries.append(
            traceback.FrameSummary(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        )
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return "".join(traceback.format_list(summaries))


class EventLoopThread:
    """An asyncio loop in a daemon thread, started by the first ``run``; its tasks by job."""

    def __init__(self, coroutine: JobCoroutine, *, name: str) -> None:
        self._coroutine = coroutine
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        # Only the loop's thread touches this (tasks start and end there).
        self._tasks: dict[asyncio.Task[None], Running] = {}
        self._cancelled: set[int] = set()  # ids of tasks asked to stop (main loop's side)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def run(self, runnings: list[Running]) -> None:
        """Start a task for each of ``runnings`` on the loop (from any thread)."""
        loop = self._loop or self._start()
        loop.call_soon_threadsafe(self._spawn, runnings)

    def cancel(self, task: asyncio.Task[None]) -> None:
        """Ask ``task`` to stop, once (from any thread)."""
        loop = self._loop
        if loop is not None and id(task) not in self._cancelled:
            self._cancelled.add(id(task))
            loop.call_soon_threadsafe(task.cancel)

    def stop(self) -> None:
        """Cancel what is left (jobs timed out, or never started: the consumer drained
        the rest) and stop the loop; its thread ends once the tasks have unwound."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._stop_soon)

    # On the loop's thread ---------------------------------------------------------------

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()
                threading.Thread(
                    target=self._serve, args=(loop, started), name=self._name, daemon=True
                ).start()
                started.wait()
                self._loop = loop
            return self._loop

    def _serve(self, loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(started.set)
        loop.call_soon(self._check_connections)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _spawn(self, runnings: list[Running]) -> None:
        loop = self._loop
        assert loop is not None
        for running in runnings:
            task = loop.create_task(self._coroutine(running))
            self._tasks[task] = running  # also the strong reference a task needs
            task.add_done_callback(self._forget)
            running.cancel = partial(self.cancel, task)
            running.stack = partial(awaiting_stack, task)

    def _forget(self, task: asyncio.Task[None]) -> None:
        del self._tasks[task]
        self._cancelled.discard(id(task))
        if not task.cancelled() and task.exception() is not None:
            logger.error("Async job task failed", exc_info=task.exception())

    def _stop_soon(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        loop = self._loop
        assert loop is not None
        if self._tasks:
            # Let the cancelled tasks unwind (release their slots) before the loop stops.
            tasks = list(self._tasks)
            gathered = asyncio.gather(*tasks, return_exceptions=True)
            gathered.add_done_callback(lambda _: loop.stop())
        else:
            loop.stop()

    def _check_connections(self) -> None:
        """Close broken or aged connections of Django's async ORM thread, now and then."""
        loop = self._loop or asyncio.get_running_loop()
        loop.create_task(sync_to_async(close_old_connections)())
        loop.call_later(CONNECTION_CHECK, self._check_connections)
