"""Writes finished executions to the database in batches, off the consumer's hot path.

Worker threads hand each ``Outcome`` over and return their slot at once; this thread
writes whatever has accumulated in one transaction. If the database is unreachable it
keeps the outcomes and tries again: an outcome never recorded only means the job's lease
expires and it runs again, which at-least-once delivery allows, but we try hard first.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from django.db import InterfaceError, OperationalError, connections

from delayjobs.core.db import drop_broken_connections
from delayjobs.engine.outcome_log import log_outcome_of
from delayjobs.lanes import IndexEntry
from delayjobs.models import DelayedJob
from delayjobs.transitions import Outcome, record_outcomes

logger = logging.getLogger("delayjobs.recorder")  # the old path: users' LOGGING names it

#: The database is away (restart, network): wait and write the same batch again.
TRANSIENT_ERRORS = (OperationalError, InterfaceError)


class Recorder:
    def __init__(
        self,
        *,
        on_retries: Callable[[list[IndexEntry]], None],
        on_idle: Callable[[], None],
        on_freed: Callable[[list[DelayedJob]], None] | None = None,
        route: Callable[[Outcome], bool] | None = None,
        on_routed: Callable[[], None] | None = None,
        max_batch: int = 500,
    ) -> None:
        # (outcome, whether to log its line); None asks the thread to stop.
        self._queue: queue.SimpleQueue[tuple[Outcome, bool] | None] = queue.SimpleQueue()
        self._on_retries = on_retries
        self._on_idle = on_idle
        # Jobs of types with fleet-wide limits whose outcomes are written: their slots are
        # free, and the jobs their limits held are to be woken (delayjobs.engine.limited).
        self._on_freed = on_freed
        # Outcomes that free a slot jobs wait for (``route``) are set aside for the main
        # loop, which writes them with the claim of those jobs (``take_routed``), and
        # woken for them (``on_routed``). Counted as pending and waiting like the others.
        self._route = route
        self._on_routed = on_routed
        self._routed: list[tuple[Outcome, bool]] = []
        self._max_batch = max_batch
        self._pending = 0
        # The jobs whose outcomes wait to be written, by the outcome: their consumer keeps
        # renewing their leases until then (see waiting_jobs).
        self._waiting: dict[int, Outcome] = {}
        self._stop_deadline = float("inf")
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="delayjobs-recorder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def pending(self) -> int:
        """Outcomes handed over but not yet written."""
        with self._lock:
            return self._pending

    def waiting_jobs(self) -> list[DelayedJob]:
        """Jobs whose outcome is handed over but not durable yet. Their leases must hold
        until it is: with a slow database, an expired lease would let another consumer run
        the job again, and its history would contradict itself."""
        with self._lock:
            return [outcome.job for outcome in self._waiting.values()]

    def put(self, outcome: Outcome, *, log: bool = False) -> None:
        """Write ``outcome`` with the next batch; ``log``: log the line that says how the
        execution ended, too (for the threads that run jobs, so that they spend nothing on
        it: the recorder logs a batch's lines one after the other, before writing it)."""
        routed = self._route is not None and self._route(outcome)
        with self._lock:
            self._pending += 1
            self._waiting[id(outcome)] = outcome
            if routed:
                self._routed.append((outcome, log))
        if not routed:
            self._queue.put((outcome, log))
        elif self._on_routed is not None:
            self._on_routed()

    @property
    def routed(self) -> bool:
        """Whether routed outcomes wait to be taken (read without the lock: a list's
        length is read atomically, and a late answer is caught up by the next turn)."""
        return bool(self._routed)

    def take_routed(self) -> list[tuple[Outcome, bool]]:
        """The routed outcomes not taken yet, (outcome, whether to log its line): the caller
        writes them and says so (``routed_written``), or gives them back (``reroute``)."""
        with self._lock:
            routed, self._routed = self._routed, []
        return routed

    def routed_written(self, routed: list[tuple[Outcome, bool]]) -> None:
        """Routed outcomes taken and written by the caller: no longer pending."""
        self._done([outcome for outcome, _log in routed])
        self._on_idle()

    def reroute(self, routed: list[tuple[Outcome, bool]] | None = None) -> None:
        """Write these routed outcomes as any other (all not taken yet, if None): the
        caller could not, or is stopping."""
        if routed is None:
            routed = self.take_routed()
        for item in routed:
            self._queue.put(item)

    def stop(self, timeout: float = 30.0) -> None:
        """Write what is left (trying for up to ``timeout`` seconds), then end the thread."""
        self._stop_deadline = time.monotonic() + timeout
        self._route = None
        self.reroute()
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        stopping = False
        try:
            while not stopping:
                batch: list[Outcome] = []
                item = self._queue.get()
                while True:
                    if item is None:
                        stopping = True
                    else:
                        outcome, log = item
                        if log:
                            log_outcome_of(outcome)
                        batch.append(outcome)
                    if len(batch) >= self._max_batch:
                        break
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                if batch:
                    self._write(batch, stopping)
        finally:
            connections.close_all()

    def _write(self, batch: list[Outcome], stopping: bool) -> None:
        try:
            retries = self._record(batch, stopping)
            if self._on_freed is not None:
                freed = [outcome.job for outcome in batch if outcome.job.limit_key is not None]
                if freed:
                    self._on_freed(freed)
            if retries:
                self._on_retries(retries)
        except Exception:  # this thread must outlive anything one batch can throw
            logger.exception("Unexpected error while recording %d outcome(s)", len(batch))
        finally:
            self._done(batch)
            self._on_idle()

    def _done(self, outcomes: list[Outcome]) -> None:
        with self._lock:
            self._pending -= len(outcomes)
            for outcome in outcomes:
                self._waiting.pop(id(outcome), None)

    def _record(self, batch: list[Outcome], stopping: bool) -> list[IndexEntry]:
        """Write ``batch``; wait out an unreachable database, isolate an unwritable outcome."""
        delay = 0.1
        while True:
            drop_broken_connections()
            try:
                return record_outcomes(batch)
            except TRANSIENT_ERRORS as exc:
                if stopping and time.monotonic() > self._stop_deadline:
                    logger.error(
                        "Giving up recording %d outcome(s) at shutdown (%s); those jobs run "
                        "again once their lease expires.",
                        len(batch),
                        exc,
                    )
                    return []
                logger.warning(
                    "Could not record %d outcome(s) (%s); retrying in %.1f s.",
                    len(batch),
                    exc,
                    delay,
                )
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
            except Exception as exc:
                # Not the database being away: something in this batch cannot be written
                # (its job row was deleted meanwhile, say). Retrying would block every
                # later outcome behind it, so write the rest one by one and drop that one.
                if len(batch) > 1:
                    logger.warning(
                        "A batch of %d outcomes failed (%s); recording them one by one.",
                        len(batch),
                        exc,
                    )
                    return [entry for one in batch for entry in self._record([one], stopping)]
                outcome = batch[0]
                logger.exception(
                    "Dropping the outcome of job %s attempt %s, which cannot be recorded; "
                    "if the job still exists it runs again after its lease.",
                    outcome.job.pk,
                    outcome.job.attempts,
                )
                return []
