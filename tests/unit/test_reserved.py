"""The consumer's ledger of reserved room (``delayjobs.engine.reserved``): what it lets the
plain claim take, and when it stops, on a clock the test moves."""

from __future__ import annotations

from delayjobs.engine.reserved import ReservedRoom
from delayjobs.models import DelayedJob
from delayjobs.transitions import Reservation


def job(pk: int, key: str = "k") -> DelayedJob:
    return DelayedJob(pk=pk, job_type="t", limit_key=key)


def ledger(**reserved: Reservation) -> tuple[ReservedRoom, list[float]]:
    now = [100.0]
    room = ReservedRoom(want=3, clock=lambda: now[0])
    room.add(reserved, since=room.now())
    return room, now


def test_slots_cover_what_is_not_recorded_yet_until_their_time_is_up() -> None:
    room, now = ledger(k=Reservation(slots=3, starts=None, slots_for=5.0, starts_for=0.0))
    assert room.keys_for(3) == ["k"] and room.keys_for(4) == []
    room.spend([job(1), job(2)])
    assert room.keys_for(1) == ["k"] and room.keys_for(2) == []
    room.finished([job(1), job(99)])  # 99: not claimed under it, changes nothing
    assert room.keys_for(2) == ["k"]
    now[0] += 5.0
    assert room.keys_for(1) == []


def test_starts_are_spent_for_good_and_within_their_own_time() -> None:
    room, now = ledger(k=Reservation(slots=None, starts=2, slots_for=0.0, starts_for=0.1))
    room.spend([job(1)])
    room.finished([job(1)])
    assert room.keys_for(1) == ["k"] and room.keys_for(2) == []
    now[0] += 0.1
    assert room.keys_for(1) == []


def test_a_new_reservation_replaces_the_old_and_the_old_jobs_still_free_nothing_new() -> None:
    both = Reservation(slots=2, starts=2, slots_for=5.0, starts_for=1.0)
    room, now = ledger(k=both, other=both)
    room.spend([job(1), job(2)])
    assert room.keys_for(1) == ["other"]
    room.add({"k": both}, since=room.now())
    assert sorted(room.keys_for(2)) == ["k", "other"]
    room.finished([job(1)])  # freed in the replaced reservation, not the new one
    room.spend([job(3), job(4)])
    assert room.keys_for(1) == ["other"]
    now[0] += 1.0
    assert room.keys_for(1) == []
