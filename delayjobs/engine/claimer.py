"""What both fetchers share: who claims, for how long, which job types are open, and
where claimed jobs go (in flight, then to the executor)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from delayjobs.conf import MAX_CLAIM_AHEAD, settings
from delayjobs.core import clock
from delayjobs.engine.contended import Contended
from delayjobs.engine.executors import Executor
from delayjobs.engine.inflight import InFlight
from delayjobs.engine.recorder import Recorder
from delayjobs.engine.reserved import ReservedRoom
from delayjobs.engine.slots import Budget
from delayjobs.models import DelayedJob
from delayjobs.pauses import Paused
from delayjobs.pauses import paused as read_pauses  # "paused" names a local below

logger = logging.getLogger("delayjobs.consumer")

#: The limited claim takes several times the plain claim's round trips (three statements
#: and a commit under its keys' locks, and the claims of one key from every consumer queue
#: behind each other): its jobs are claimed this many times further ahead, so that the
#: claim is out of the way when they are due, as ``CLAIM_AHEAD`` does for the plain claim.
#: A job claimed ahead holds its slot from the claim, and its rate's start counts at its
#: run_at; a backlog (jobs already due) is claimed as before.
LIMITED_AHEAD_FACTOR = 5


class PauseView:
    """The paused queues and job types as this consumer knows them: re-read when the
    listener hears of a change, and at least every IDLE_TIMEOUT in case it missed one."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.current = Paused()
        self._stale = True
        self._next_refresh = 0.0

    def mark_stale(self) -> None:
        self._stale = True

    def reload(self) -> None:
        """Read them now (a due job was found not claimed: perhaps paused or resumed)."""
        self.current = read_pauses()

    def refresh(self) -> None:
        """Re-read the paused queues and job types when told to, or every IDLE_TIMEOUT."""
        now = time.monotonic()
        if not self._stale and now < self._next_refresh:
            return
        self._stale = False
        self._next_refresh = now + settings.IDLE_TIMEOUT.total_seconds()
        paused = read_pauses()
        if paused != self.current:
            logger.info(
                "Consumer %s: paused queues %s, job types %s.",
                self.worker_id,
                ", ".join(sorted(paused.queues)) or "none",
                ", ".join(sorted(paused.job_types)) or "none",
            )
        self.current = paused


@dataclass
class Claims:
    """The claim's parameters and the parts a claim hands its jobs to."""

    worker_id: str
    #: Jobs are claimed up to this long before they are due, then started by their thread
    #: at their exact run_at: the claim's round trips (Redis, the database and its commit)
    #: are then out of the way when the job is due. A job claimed early is running as far
    #: as the database is concerned: cancel() and reschedule() no longer move it, as with
    #: any job claimed a moment after it was due; its lease covers a consumer dying
    #: meanwhile.
    ahead: timedelta
    job_types: list[str]
    leases: dict[str, timedelta]
    burst: bool
    inflight: InFlight
    executor: Executor
    recorder: Recorder
    pauses: PauseView
    #: Room of fleet-wide limits this consumer reserved (``delayjobs.engine.reserved``).
    reserved: ReservedRoom
    #: Where jobs are known to wait for a slot (``delayjobs.engine.contended``).
    contended: Contended
    #: The known job types with fleet-wide limits: their jobs take the limited claim
    #: (``delayjobs.engine.limited``), every other job the plain one, as before.
    limited: frozenset[str] = frozenset()
    #: How early jobs of limited types are claimed: LIMITED_AHEAD_FACTOR times ``ahead``
    #: (none if ``ahead`` is none), at most MAX_CLAIM_AHEAD.
    limited_ahead: timedelta = field(init=False)
    _last_claim: datetime | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.limited_ahead = min(self.ahead * LIMITED_AHEAD_FACTOR, MAX_CLAIM_AHEAD)
        self._ahead_s = self.ahead.total_seconds()
        self._limited_ahead_s = self.limited_ahead.total_seconds()

    def ahead_of(self, job_type: str | None) -> float:
        """How early, in seconds, a job of ``job_type`` is claimed (None: a queue's lane,
        of types without limits)."""
        return self._limited_ahead_s if job_type in self.limited else self._ahead_s

    def claim_time(self) -> datetime:
        """Now, but strictly after the previous claim: the claim's token (see ``claim``)."""
        now = clock.now()
        if self._last_claim is not None and now <= self._last_claim:
            now = self._last_claim + timedelta(microseconds=1)
        self._last_claim = now
        return now

    def open_types(self) -> list[str]:
        """Known job types that may start a job now: not paused, with a free slot."""
        paused = self.pauses.current.job_types
        return self.inflight.open_types([name for name in self.job_types if name not in paused])

    def plain_types(self) -> list[str]:
        """The open types the plain claim may take: a limited type's row popped from a
        plain lane (indexed by a process that did not know its limits) is left to its own
        lane instead (``reindex_unclaimed`` puts it there)."""
        open_types = self.open_types()
        if not self.limited:
            return open_types
        return [name for name in open_types if name not in self.limited]

    def lane_room(
        self, budget: Budget, queue: str, job_type: str | None, limited_taken: int = 0
    ) -> int:
        """How many of a lane's jobs a claim may take now: none while paused; within the
        claim's ``budget``; a limited type's also within its own prefetch
        (``InFlight.limited_room``), less the limited jobs the claim took already."""
        if self.pauses.current.covers(queue, job_type):
            return 0
        room = budget.room(queue, job_type)
        if job_type in self.limited:
            room = min(room, self.inflight.limited_room(job_type) - limited_taken)
        return max(room, 0)

    def limited_types(self) -> list[str]:
        """The open types with fleet-wide limits."""
        if not self.limited:
            return []
        return [name for name in self.open_types() if name in self.limited]

    def start(self, jobs: list[DelayedJob]) -> None:
        """Run claimed jobs: in flight first (their slots), then to the executor."""
        if not jobs:
            return
        self.executor.start(self.inflight.add(jobs))

    def idle(self) -> bool:
        """Nothing in flight, handed over or waiting to be recorded (a burst may end)."""
        return self.inflight.idle(lambda: self.recorder.pending)
