"""Jobs held by a fleet-wide limit: parked in Redis until a slot of their key frees, then
moved back into their lane, and the lane's consumers woken (invariant 6: woken, not polled).

The database decides what is admitted (``delayjobs.transitions.limiter``); Redis only
says when to ask again. A job refused for want of a slot waits in its key's held set; when
a job of that key ends, the consumer that recorded it moves as many held jobs back into
their lane as slots freed, earliest first, and publishes on the queue's wake channel. A
job refused by a rate waits in its lane, due when the window frees a start.

A slot may free between the claim that refused a job and its parking: the release then
finds nothing to move. So a release also stamps when it happened, and parking a job whose
claim decided before that stamp (within ``RELEASE_MARGIN``) moves it back at once. Should
both miss (Redis lost the stamp), the pre-loader's next pass puts every due job back in
its lane: a held job is never stranded, only later.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from delayjobs.index.keys import due_key, held_key, released_key, wake_channel
from delayjobs.index.store import RedisStore, get_store

#: Clocks read by two consumers (each its estimate of the database's) differ by this much
#: at most in practice: a release stamped up to this long before the refusing claim's
#: time may still have been missed by it.
RELEASE_MARGIN = 0.010
#: How long a release stamp is kept: far longer than a claim takes.
RELEASE_STAMP_TTL_MS = 60_000

# KEYS: held set, lane, release stamp, wake channel.
# ARGV: the claim's time, now, the margin, then order1, id1, order2, id2 ...
# Park the ids; if a slot freed since the claim decided, move them all back at once.
HOLD_LUA = """
for i = 4, #ARGV, 2 do
  redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
end
local released = tonumber(redis.call('GET', KEYS[3]) or '0')
if released >= tonumber(ARGV[1]) - tonumber(ARGV[3]) then
  local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
  for _, id in ipairs(ids) do redis.call('ZADD', KEYS[2], ARGV[2], id) end
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[4], ARGV[2])
  return #ids
end
return 0
"""

# KEYS: held set, lane, release stamp, wake channel. ARGV: slots freed, now, stamp's TTL.
# Move the earliest held ids back into the lane, due now; stamp the release; wake.
RELEASE_LUA = """
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #ids == 0 then return 0 end
for _, id in ipairs(ids) do redis.call('ZADD', KEYS[2], ARGV[2], id) end
redis.call('ZREM', KEYS[1], unpack(ids))
redis.call('PUBLISH', KEYS[4], ARGV[2])
return #ids
"""

# KEYS: held set. ARGV: slots freed.
# For the consumer that frees the slots and claims their successors itself, before the
# outcome that frees them is committed: the earliest held ids are taken off and returned,
# nobody else is woken for them, and no release is stamped (the slot is not free yet; a
# slot left free is released once it is, see delayjobs.engine.successors).
TAKE_LUA = """
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #ids > 0 then redis.call('ZREM', KEYS[1], unpack(ids)) end
return ids
"""

#: (lane, limit key)
HeldGroup = tuple[str, str]


def hold(parked: dict[HeldGroup, list[tuple[int, float]]], *, decided_at: float, now: float) -> int:
    """Park (id, order) pairs per (lane, limit key); how many were moved back at once.

    ``order`` ranks a key's held jobs (priority, then due time); ``decided_at`` is the
    database time the refusing claim decided at.
    """
    if not parked:
        return 0
    calls = []
    for (lane_name, limit_key), entries in parked.items():
        argv: list[str] = [repr(decided_at), repr(now), repr(RELEASE_MARGIN)]
        for pk, order in entries:
            argv += [repr(order), str(pk)]
        calls.append((_keys(lane_name, limit_key), argv))
    return get_store().call_scripts(HOLD_LUA, calls)


def release(freed: Iterable[HeldGroup], *, now: float, store: RedisStore | None = None) -> int:
    """Slots of these (lane, limit key)s freed (one per item): move held jobs back."""
    counts = Counter(freed)
    if not counts:
        return 0
    calls = [
        (_keys(lane_name, limit_key), [str(n), repr(now), str(RELEASE_STAMP_TTL_MS)])
        for (lane_name, limit_key), n in counts.items()
    ]
    return (store or get_store()).call_scripts(RELEASE_LUA, calls)


def take(freed: Iterable[HeldGroup]) -> dict[HeldGroup, list[int]]:
    """Slots of these (lane, limit key)s freed (one per item), for the caller to fill: take
    as many held ids off, earliest first (each group's, however few it had)."""
    counts = Counter(freed)
    if not counts:
        return {}
    calls = [([held_key(lane_name, key)], [str(n)]) for (lane_name, key), n in counts.items()]
    found = get_store().each_script_call(TAKE_LUA, calls)
    return {group: [int(pk) for pk in ids] for group, ids in zip(counts, found, strict=True)}


def _keys(lane_name: str, limit_key: str) -> list[str]:
    return [
        held_key(lane_name, limit_key),
        due_key(lane_name),
        released_key(lane_name, limit_key),
        wake_channel(lane_name),
    ]


def group_by_lane(
    items: Iterable[tuple[str, str, int, float]],
) -> dict[HeldGroup, list[tuple[int, float]]]:
    """(lane, limit key, id, order) items as ``hold`` takes them."""
    grouped: dict[HeldGroup, list[tuple[int, float]]] = defaultdict(list)
    for lane_name, limit_key, pk, order in items:
        grouped[(lane_name, limit_key)].append((pk, order))
    return dict(grouped)
