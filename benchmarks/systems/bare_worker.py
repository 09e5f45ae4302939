"""The bare runner's worker: ``python -m benchmarks.systems.bare_worker`` (see bare_system).

One loop: sleep until the earliest due score of a Redis sorted set, or until a scheduler
announces a job (it may be sooner); pop the due ids atomically; run each job's body inline.
Nothing is written anywhere but the job's own record (``benchmarks.bodies.job``). Imports
redis-py and the bodies only: nothing of the driver (its package imports nothing at start).
"""

from __future__ import annotations

import os
import time

import redis

from benchmarks import bodies
from benchmarks.environment import REDIS_URL_ENV

#: Job ids scored by their run_at (epoch seconds): the whole schedule.
KEY = "bench:bare:due"
#: Published to after each ZADD: a job may now be due sooner than a sleeping worker thinks.
CHANNEL = "bench:bare:added"
#: Ids popped at once: one round trip for many jobs in a burst, few left to one worker
#: when the other runs out.
BATCH = 100
#: The last stretch of a wait, slept with the clock's own resolution rather than polled.
FINE = 0.001

# Removes and returns (id, score, id, score...) of at most ARGV[2] ids due at ARGV[1];
# when none is due, the earliest (id, score), left in place: a score above ARGV[1] tells
# the caller which of the two it got.
POP_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[2])
if #due > 0 then
  local ids = {}
  for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
  redis.call('ZREM', KEYS[1], unpack(ids))
  return due
end
return redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
"""


def main() -> None:
    client = redis.Redis.from_url(os.environ[REDIS_URL_ENV])
    added = client.pubsub(ignore_subscribe_messages=True)
    added.subscribe(CHANNEL)  # before the first look: no announcement can be missed
    pop_due = client.register_script(POP_DUE)
    while True:
        now = time.time()
        found = pop_due(keys=[KEY], args=[repr(now), BATCH])
        if found and float(found[1]) <= now:
            for index in range(0, len(found), 2):
                bodies.job(int(found[index]), float(found[index + 1]))
            continue
        # Nothing due: wait for the earliest (for ever if there is none), unless a job is
        # added meanwhile; each announcement ends one wait, and the loop looks again. A
        # socket's timeout is rounded up to the millisecond: the last one is slept instead.
        timeout = float(found[1]) - time.time() if found else None
        if timeout is None or timeout > FINE:
            added.get_message(timeout=None if timeout is None else timeout - FINE)
        elif timeout > 0:
            time.sleep(timeout)


if __name__ == "__main__":
    main()
