"""The room of fleet-wide limits this consumer reserved, as it spends it: which limit keys
its next claim may take with the plain claim (no key lock, no count), and how much is
left in each (``delayjobs.transitions.reservations`` says why that keeps the limit).

The main loop spends it (its claims); the recorder frees slots as outcomes are written.
Times are this process's monotonic clock, from before the claim that reserved: skewed
or jumping wall clocks cannot stretch a reservation.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from delayjobs.models import DelayedJob
from delayjobs.transitions import Reservation


@dataclass
class _Spending:
    """One key's reservation: what is left of it, and until when."""

    slots: int | None  # None: the key has no global_concurrency
    starts: int | None  # None: the key has no rate
    slots_until: float
    starts_until: float
    in_use: int = 0  # jobs claimed under it whose outcomes are not written yet

    def covers(self, count: int, now: float) -> bool:
        """Whether ``count`` more jobs may be claimed under it ``now``."""
        if self.slots is not None and (now >= self.slots_until or self.in_use + count > self.slots):
            return False
        return self.starts is None or (now < self.starts_until and self.starts >= count)

    def over(self, now: float) -> bool:
        """Never to be spent again: out of time, or of starts (slots come back)."""
        if self.slots is not None and now >= self.slots_until:
            return True
        return self.starts is not None and (now >= self.starts_until or self.starts <= 0)


class ReservedRoom:
    """This consumer's reservations, by limit key."""

    def __init__(self, *, want: int, clock: Callable[[], float] = time.monotonic) -> None:
        #: How many jobs' room a limited claim reserves in a key with plenty to spare.
        self.want = want
        self._clock = clock  # monotonic seconds (tests move their own)
        #: This process's own id for its reservations (worker ids may repeat).
        self.holder = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._keys: dict[str, _Spending] = {}
        self._jobs: dict[int, _Spending] = {}  # jobs claimed under a reservation, by id

    def keys_for(self, count: int) -> list[str]:
        """The keys whose reservations cover ``count`` more jobs now."""
        if not self._keys:
            return []
        now = self._clock()
        with self._lock:
            return [key for key, spending in self._keys.items() if spending.covers(count, now)]

    def spend(self, jobs: Iterable[DelayedJob]) -> None:
        """``jobs`` were claimed under their keys' reservations."""
        with self._lock:
            for job in jobs:
                spending = self._keys[job.limit_key or ""]
                spending.in_use += 1
                if spending.starts is not None:
                    spending.starts -= 1
                self._jobs[job.pk] = spending

    def now(self) -> float:
        """The clock a reservation is timed by: read it before the claim that reserves."""
        return self._clock()

    def add(self, reserved: Mapping[str, Reservation], *, since: float) -> None:
        """A limited claim reserved this (``since``: ``now()`` before it began).
        Replaces what was left of the keys' earlier reservations, as the database did."""
        if not reserved:
            return
        now = self._clock()
        with self._lock:
            # Those over go (their jobs still free their slots: see ``finished``).
            for key in [k for k, spending in self._keys.items() if spending.over(now)]:
                del self._keys[key]
            for key, reservation in reserved.items():
                self._keys[key] = _Spending(
                    slots=reservation.slots,
                    starts=reservation.starts,
                    slots_until=since + reservation.slots_for,
                    starts_until=since + reservation.starts_for,
                )

    def finished(self, jobs: Iterable[DelayedJob]) -> None:
        """The outcomes of ``jobs`` are written: slots reserved for them are free again."""
        with self._lock:
            for job in jobs:
                spending = self._jobs.pop(job.pk, None)
                if spending is not None:
                    spending.in_use -= 1
