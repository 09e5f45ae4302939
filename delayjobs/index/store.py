"""The timing index's operations and their Lua scripts: the only code that writes or
reads the index's keys (named by ``delayjobs.index.keys``).

Redis only ever holds ids and times: everything else stays in the database row. Pipelines
here are never transactions, so redis-py splits them per node on a Redis Cluster. Plain
PUBLISH (from a script too) reaches the subscribers of every node.
"""

from __future__ import annotations

import functools
import secrets
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar, cast

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from delayjobs.index.client import Client, ClusterUnreachable, get_client
from delayjobs.index.keys import control_channel, due_key, preload_lock_key, wake_channel
from delayjobs.lanes import IndexEntry

P = ParamSpec("P")
R = TypeVar("R")

# Add members, or move them EARLIER (never later); publish on the wake channel if the
# earliest score moved earlier, so sleeping consumers re-plan their sleep.
# Never later: two writers racing (a pre-loader pass that read the row before a
# reschedule committed, say) must not push a job past its real time. A score too early
# is harmless: the job is popped, its claim refused, and it is put back at its real time.
# ARGV: score1, id1, score2, id2, ...
ADD_LUA = """
local before = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
for i = 1, #ARGV, 2 do
  local current = redis.call('ZSCORE', KEYS[1], ARGV[i + 1])
  if not current or tonumber(ARGV[i]) < tonumber(current) then
    redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
local after = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if after[2] ~= nil and (before[2] == nil or tonumber(after[2]) < tonumber(before[2])) then
  redis.call('PUBLISH', KEYS[2], after[2])
end
return #ARGV / 2
"""

# Atomically remove and return at most ARGV[2] (id, score) pairs due at or before ARGV[1],
# earliest first, as a flat list after one flag: 1 if more are due than were taken.
POP_DUE_LUA = """
local found = redis.call(
  'ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local ids = {}
for i = 1, #found, 2 do ids[#ids + 1] = found[i] end
if #ids > 0 then redis.call('ZREM', KEYS[1], unpack(ids)) end
local more = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 1)
table.insert(found, 1, #more)
return found
"""

# Delete a lock only if we still hold it (its value is our token).
RELEASE_LOCK_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

#: Entries per script call: Lua's unpack() fails past a few thousand values.
SCRIPT_CHUNK = 1000

_store: RedisStore | None = None


def get_store() -> RedisStore:
    """The shared ``RedisStore`` over ``get_client()``."""
    global _store
    client = get_client()
    store = _store
    if store is None or store.client is not client:
        store = _store = RedisStore(client)
    return store


def _redis_errors(method: Callable[P, R]) -> Callable[P, R]:
    """Raise a Redis Cluster's RedisClusterException as a RedisError.

    redis-py raises it, not a RedisError, when no node of the cluster answers (or no
    node serves a slot). Every caller handles RedisError as "Redis is down": the hand-off
    is left to the pre-loader (invariant 7), consumers claim from the database. Without
    this, a cluster outage would be an unexpected error to them instead.
    """

    @functools.wraps(method)
    def translated(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except RedisClusterException as exc:
            raise ClusterUnreachable(str(exc)) from exc

    return translated


def _decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisStore:
    """Operations on the timing index. Cheap to create; holds no state of its own."""

    def __init__(self, client: Client | None = None) -> None:
        self.client = client or get_client()
        # redis-py refuses EVALSHA in a cluster pipeline (it cannot load a missing script
        # on the right node there), so add() sends the script's text in that case.
        self._cluster = isinstance(self.client, RedisCluster)
        self._scripts: dict[str, Any] = {}  # text -> redis-py Script, made once each
        self._pop_due = self.client.register_script(POP_DUE_LUA)
        self._release = self.client.register_script(RELEASE_LOCK_LUA)

    @_redis_errors
    def add(self, entries: Iterable[IndexEntry]) -> int:
        """Add entries, or move them earlier (never later); one round trip for all lanes."""
        argv_by_lane: dict[str, list[str]] = defaultdict(list)
        for job_id, lane_name, score in entries:
            argv_by_lane[lane_name] += [repr(float(score)), str(job_id)]
        calls = [
            ([due_key(lane_name), wake_channel(lane_name)], argv[start : start + 2 * SCRIPT_CHUNK])
            for lane_name, argv in argv_by_lane.items()
            for start in range(0, len(argv), 2 * SCRIPT_CHUNK)
        ]
        return self.call_scripts(ADD_LUA, calls)

    def call_scripts(self, script: str, calls: list[tuple[list[str], list[str]]]) -> int:
        """``each_script_call``, for scripts that return a count: the sum of the counts."""
        return sum(int(n) for n in self.each_script_call(script, calls))

    @_redis_errors
    def each_script_call(self, script: str, calls: list[tuple[list[str], list[str]]]) -> list[Any]:
        """Run ``script`` once per (keys, args), in one round trip; what each call returned.
        One call (a schedule(), a retry, one key's jobs ended) is sent alone: in a
        pipeline, redis-py would first ask SCRIPT EXISTS, a round trip of its own."""
        if len(calls) == 1:
            keys, args = calls[0]
            return [self.call_script(self.client, script, keys, args)]
        pipe = self.client.pipeline(transaction=False)
        for keys, args in calls:
            self.call_script(pipe, script, keys, args)
        return list(pipe.execute())

    def call_script(self, client: Any, script: str, keys: list[str], args: list[str]) -> Any:
        """Run ``script`` on ``client`` (this store's client, or a pipeline of it).

        A Script sends EVALSHA and, should the server answer NOSCRIPT, loads it again. On
        a Redis Cluster, EVAL with the text: redis-py refuses EVALSHA in a cluster
        pipeline, and no node can then answer NOSCRIPT (a new or restarted master has an
        empty script cache). A script's keys are all in one slot (one lane's).
        """
        if self._cluster:
            return client.execute_command("EVAL", script, len(keys), *keys, *args)
        found = self._scripts.get(script)
        if found is None:
            found = self._scripts[script] = self.client.register_script(script)
        return found(keys=keys, args=args, client=client)

    @_redis_errors
    def remove(self, entries: Iterable[IndexEntry]) -> None:
        """Drop entries (a cancelled job need not wait to be popped and skipped)."""
        members_by_lane: dict[str, list[str]] = defaultdict(list)
        for job_id, lane_name, _score in entries:
            members_by_lane[lane_name].append(str(job_id))
        if not members_by_lane:
            return
        pipe = self.client.pipeline(transaction=False)
        for lane_name, members in members_by_lane.items():
            pipe.zrem(due_key(lane_name), *members)
        pipe.execute()

    @_redis_errors
    def pop_due(
        self, lane_name: str, now: float, limit: int
    ) -> tuple[list[tuple[int, float]], bool]:
        """Atomically take at most ``limit`` (id, score) pairs due by ``now`` off a lane.

        Also says whether more were due than taken: a backlog, which the consumer drains
        in larger batches.
        """
        if limit <= 0:
            return [], False
        limit = min(limit, SCRIPT_CHUNK)
        raw = self._pop_due(keys=[due_key(lane_name)], args=[repr(now), limit])
        more_due, found = bool(int(raw[0])), raw[1:]
        taken = [(int(_decode(found[i])), float(found[i + 1])) for i in range(0, len(found), 2)]
        return taken, more_due

    @_redis_errors
    def drop_due(self, lane_names: Iterable[str], now: float) -> int:
        """Remove every entry due by ``now`` from some lanes; how many were removed."""
        pipe = self.client.pipeline(transaction=False)
        for lane_name in lane_names:
            pipe.zremrangebyscore(due_key(lane_name), "-inf", repr(now))
        return sum(int(n) for n in pipe.execute())

    @_redis_errors
    def next_due(self, lane_names: Iterable[str]) -> float | None:
        """The earliest score over some lanes (or queues), or None if all are empty."""
        scores = self.first_scores(lane_names)
        return min(scores.values()) if scores else None

    @_redis_errors
    def first_scores(self, lane_names: Iterable[str]) -> dict[str, float]:
        """Each non-empty lane's (or queue's) earliest score; one round trip."""
        names = list(lane_names)
        pipe = self.client.pipeline(transaction=False)
        for lane_name in names:
            pipe.zrange(due_key(lane_name), 0, 0, withscores=True)
        return {
            name: entry[0][1] for name, entry in zip(names, pipe.execute(), strict=True) if entry
        }

    @_redis_errors
    def size(self, queue: str) -> int:
        return int(self.client.zcard(due_key(queue)))

    @_redis_errors
    def members(self, queue: str) -> dict[int, float]:
        """Every id and score of a queue (for tests and diagnostics; O(n))."""
        return {
            int(_decode(member)): score
            for member, score in cast(
                "list[tuple[bytes, float]]",
                self.client.zrange(due_key(queue), 0, -1, withscores=True),
            )
        }

    @contextmanager
    def preload_lock(self, ttl_seconds: float) -> Iterator[bool]:
        """Hold the pre-loader lock if free; yields whether we got it. Expires by itself."""
        token = secrets.token_hex(16)
        acquired = self._acquire_lock(token, ttl_seconds)
        try:
            yield acquired
        finally:
            if acquired:
                self._release_lock(token)

    @_redis_errors
    def _acquire_lock(self, token: str, ttl_seconds: float) -> bool:
        milliseconds = max(1, int(ttl_seconds * 1000))
        return bool(self.client.set(preload_lock_key(), token, nx=True, px=milliseconds))

    @_redis_errors
    def _release_lock(self, token: str) -> None:
        self._release(keys=[preload_lock_key()], args=[token])

    @_redis_errors
    def ping(self) -> None:
        """Raise RedisError unless Redis answers (used to notice that it is back)."""
        self.client.ping()

    @_redis_errors
    def subscribe_wake(self, queues: Iterable[str]) -> redis.client.PubSub:
        """Wake channels of ``queues``, and the control channel (pauses, resumes)."""
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(*[wake_channel(queue) for queue in queues], control_channel())
        return pubsub

    @_redis_errors
    def announce_control(self) -> None:
        """Tell every consumer that pauses changed (they re-read them from the database)."""
        self.client.publish(control_channel(), "pauses")
