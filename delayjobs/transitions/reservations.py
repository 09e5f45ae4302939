"""Reservations: room of a fleet-wide limit that a limited claim sets aside for its own
consumer, whose next claims of the key then take the plain claim (no key lock, no count)
until the room is spent or stale.

The limited claim serializes the claims of a key and counts what it uses, three
statements and a commit under a lock: about twice the plain claim's cost, paid by every
claim of a limited type, even one whose limit never comes near binding. Where the key has
room to spare, the claim reserves a share of it, and the claims that spend the share need
neither. Invariant 10 of docs/explanation/design.md still holds, as the database counts a
reservation as used from the moment it is made:

- **Slots** (``global_concurrency``) are a ``LimitReservation`` row, whose slots the
  limited claim counts as in use on top of the key's running rows (those claimed under
  it among them, so the count is never below what runs). Its holder claims under it at
  most that many jobs not yet recorded.
- **Starts** (``rate_limit``) are a ``LimitStart`` row of that many starts, stamped with
  the end of the time its holder may start them (and the claim-ahead): every window a
  start made under it can share counts all of them.
- A reservation is made only where, after the claim, the key has ``ROOM_FACTOR`` times
  the reservation left and no job of the key was held: near its limit, every claim of a
  key is the serialized one, as exact as before.
- Its holder spends it by its own monotonic clock, counted from before the claim's
  transaction began (skewed clocks cannot stretch it): slots for ``SLOTS_USE``, while the
  row counts for ``SLOTS_TTL`` on the database's clock, so a claim under it commits long
  before the row stops counting; starts for half the rate's window (at most a
  second), all of which the stamp covers. A consumer that dies simply stops spending; its
  reservation ends with no operator action.

Reserved room nobody spends is room lost to the others until it ends: the reason to reserve
only where there is several times as much to spare.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from delayjobs.limits import Limits
from delayjobs.models import LimitReservation, LimitStart, jobs_database

#: A key's claim reserves only where the limit leaves this many times the reservation.
ROOM_FACTOR = 4
#: How long, in seconds on the database's clock, a reservation's slots count as in use.
SLOTS_TTL = 10.0
#: How long its holder may claim under them: half of SLOTS_TTL, by the holder's own
#: monotonic clock from before the claim. A claim under the reservation would have to
#: take five seconds from that check to its commit to outlive the count.
SLOTS_USE = 5.0
#: Reserved starts are spent within half the rate's window, at most this long: counted
#: from the end of that time, unspent ones hold the window that much longer.
STARTS_USE_MAX = timedelta(seconds=1)


@dataclass(frozen=True)
class Reservation:
    """What one key's claim reserved for its consumer's next claims of the key."""

    #: Jobs it may have claimed and not recorded under it (None: the key has no
    #: global_concurrency, nothing to count).
    slots: int | None
    #: Jobs it may start under it (None: the key has no rate).
    starts: int | None
    #: Seconds, from before the claim's transaction began, during which each may be spent.
    slots_for: float
    starts_for: float


@dataclass(frozen=True)
class Room:
    """What a key's limits leave after a claim admitted its jobs (None: no such limit)."""

    limits: Limits
    slots: int | None
    starts: int | None


def reserve(
    room: Mapping[str, Room],
    *,
    want: int,
    moment: float,
    ahead: timedelta,
    holder: str,
    worker_id: str,
    database: str,
) -> dict[str, Reservation]:
    """Reserve ``want`` jobs' room in each key of ``room`` that has ROOM_FACTOR times as
    much left (``moment``: the claim's database clock, epoch seconds), in the claim's
    transaction. Replaces the holder's earlier reservation of a key, which it no longer
    spends. Returns the reservations made, by key."""
    needed = want * ROOM_FACTOR
    made: dict[str, Reservation] = {}
    rows: list[LimitReservation] = []
    starts: list[LimitStart] = []
    for key, left in room.items():
        if want <= 0 or any(n is not None and n < needed for n in (left.slots, left.starts)):
            continue
        rate = left.limits.rate
        starts_for = min(rate.per / 2, STARTS_USE_MAX) if rate is not None else timedelta(0)
        if left.slots is not None:
            rows.append(
                LimitReservation(
                    limit_key=key,
                    holder=holder,
                    worker_id=worker_id,
                    slots=want,
                    until=moment + SLOTS_TTL,
                )
            )
        if rate is not None:
            # Counted from the last moment a start under it may happen: a job claimed by
            # then starts at its run_at, at most ``ahead`` later.
            stamp = moment + (starts_for + ahead).total_seconds()
            starts.append(LimitStart(limit_key=key, started=stamp, count=want))
        made[key] = Reservation(
            slots=want if left.slots is not None else None,
            starts=want if rate is not None else None,
            slots_for=SLOTS_USE,
            starts_for=starts_for.total_seconds(),
        )
    if rows:
        LimitReservation.objects.using(database).bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["limit_key", "holder"],
            update_fields=["worker_id", "slots", "until"],
        )
    if starts:
        LimitStart.objects.using(database).bulk_create(starts)
    return made


def drop_reservations(holder: str) -> int:
    """A consumer stopping gives its reservations back (it claims nothing more)."""
    reservations = LimitReservation.objects.using(jobs_database())
    deleted, _ = reservations.filter(holder=holder).delete()
    return deleted


def prune_reservations(horizon: float, database: str) -> int:
    """Drop the reservations that ended before ``horizon`` (database clock, epoch s)."""
    deleted, _ = LimitReservation.objects.using(database).filter(until__lte=horizon).delete()
    return deleted
