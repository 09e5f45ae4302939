"""The Redis timing index: keys, the atomic pop, wake notifications, the pre-loader lock."""

from __future__ import annotations

import threading

import pytest
import redis
from django.conf import settings as django_settings

import delayjobs
from delayjobs.conf import mask_url
from delayjobs.index.client import describe_target
from delayjobs.index.keys import due_key, preload_lock_key, wake_channel
from delayjobs.index.store import RedisStore, get_store
from delayjobs.lanes import lane, lanes
from tests.utils import wait_for


@pytest.fixture
def store(redis_client: redis.Redis) -> RedisStore:
    return RedisStore(redis_client)


# Keys --------------------------------------------------------------------------------


def test_keys_carry_the_prefix_and_the_queue_as_a_cluster_hash_tag(store, redis_client):
    assert due_key("default") == "dj-test:{default}:due"
    assert wake_channel("default") == "dj-test:{default}:wake"
    assert preload_lock_key() == "dj-test:preload-lock"
    store.add([(1, "default", 10.0), (2, "emails.high", 11.0)])
    assert sorted(redis_client.keys("*")) == [
        b"dj-test:{default}:due",
        b"dj-test:{emails.high}:due",
    ]


def test_two_key_prefixes_do_not_see_each_other(store, settings, redis_client):
    store.add([(1, "default", 10.0)])
    settings.DELAYJOBS = {**settings.DELAYJOBS, "KEY_PREFIX": "other-project"}
    assert due_key("default") == "other-project:{default}:due"
    assert store.members("default") == {}
    assert store.pop_due("default", 100.0, 10) == ([], False)
    store.add([(2, "default", 20.0)])
    assert store.members("default") == {2: 20.0}
    settings.DELAYJOBS = {**settings.DELAYJOBS, "KEY_PREFIX": "dj-test"}
    assert store.members("default") == {1: 10.0}
    assert redis_client.zcard("other-project:{default}:due") == 1


def test_get_store_uses_the_configured_redis(redis_client):
    get_store().add([(5, "default", 50.0)])
    assert redis_client.zscore(due_key("default"), "5") == 50.0


# add(), remove(), members() ----------------------------------------------------------


def test_add_stores_ids_and_scores_only_and_moves_a_member_earlier_never_later(store, redis_client):
    assert store.add([(1, "default", 100.5), (2, "default", 200.25)]) == 2
    # Later: ignored, so that a stale writer can never make a job late.
    store.add([(1, "default", 300.0)])
    assert store.members("default") == {1: 100.5, 2: 200.25}
    # Earlier: taken.
    store.add([(1, "default", 50.0)])
    assert store.members("default") == {1: 50.0, 2: 200.25}
    assert store.size("default") == 2
    assert redis_client.type(due_key("default")) == b"zset"


def test_add_keeps_microsecond_precision_of_scores(store):
    score = 1_767_225_600.123456
    store.add([(1, "default", score)])
    assert store.members("default") == {1: score}


def test_add_of_nothing_is_nothing(store, redis_client):
    assert store.add([]) == 0
    assert redis_client.dbsize() == 0


def test_add_spreads_entries_over_their_queues(store):
    store.add([(1, "a", 1.0), (2, "b", 2.0), (3, "a", 3.0)])
    assert store.members("a") == {1: 1.0, 3: 3.0}
    assert store.members("b") == {2: 2.0}


def test_add_takes_a_batch_larger_than_lua_can_unpack_at_once(store):
    """schedule_many() of 10,000 jobs due now hands them to Redis in one add()."""
    entries = [(pk, "default", 1000.0 + pk) for pk in range(1, 10_001)]
    assert store.add(entries) == 10_000
    assert store.size("default") == 10_000
    assert store.next_due(["default"]) == 1001.0


@pytest.mark.parametrize(
    "entries",
    [[(1, "a", 1.0)], [(1, "a", 1.0), (2, "b", 2.0)]],
    ids=["one call, sent alone", "several lanes, pipelined"],
)
def test_add_loads_its_script_again_on_a_server_that_forgot_it(store, redis_client, entries):
    """A restarted or promoted Redis has an empty script cache: NOSCRIPT, then load."""
    redis_client.script_flush()
    assert store.add(entries) == len(entries)
    assert {pk for pk, _lane, _score in entries} == set(store.members("a")) | set(
        store.members("b")
    )


def test_remove_drops_only_the_given_members(store):
    store.add([(1, "a", 1.0), (2, "a", 2.0), (3, "b", 3.0)])
    store.remove([(1, "a", 1.0), (3, "b", 0.0), (99, "c", 0.0)])
    assert store.members("a") == {2: 2.0}
    assert store.members("b") == {}
    store.remove([])


# pop_due() ---------------------------------------------------------------------------


def test_pop_due_returns_due_ids_earliest_first_up_to_the_limit(store):
    store.add([(5, "default", 105.0), (3, "default", 103.0), (1, "default", 101.0)])
    store.add([(4, "default", 104.0), (2, "default", 102.0), (9, "default", 500.0)])
    assert store.pop_due("default", 104.5, 2) == ([(1, 101.0), (2, 102.0)], True)
    assert store.pop_due("default", 104.5, 10) == ([(3, 103.0), (4, 104.0)], False)
    assert store.pop_due("default", 104.5, 10) == ([], False)
    assert store.members("default") == {5: 105.0, 9: 500.0}


def test_pop_due_includes_a_job_due_exactly_now(store):
    store.add([(1, "default", 100.0)])
    assert store.pop_due("default", 100.0, 1) == ([(1, 100.0)], False)


def test_pop_due_with_no_free_slot_takes_nothing(store):
    store.add([(1, "default", 1.0)])
    assert store.pop_due("default", 100.0, 0) == ([], False)
    assert store.pop_due("default", 100.0, -3) == ([], False)
    assert store.size("default") == 1


def test_pop_due_of_another_queue_leaves_this_one(store):
    store.add([(1, "a", 1.0)])
    assert store.pop_due("b", 100.0, 10) == ([], False)
    assert store.size("a") == 1


def test_pop_due_is_atomic_under_concurrent_consumers(redis_client):
    """Eight clients popping at once: every id comes out exactly once (invariant 3's first line)."""
    count = 2000
    RedisStore(redis_client).add([(pk, "default", float(pk)) for pk in range(count)])
    popped: list[list[tuple[int, float]]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def consume(slot: int) -> None:
        client = redis.Redis.from_url(django_settings.DELAYJOBS["REDIS_URL"])
        try:
            store = RedisStore(client)
            start.wait()
            while batch := store.pop_due("default", float(count), 7)[0]:
                assert len(batch) <= 7
                popped[slot].extend(batch)
        finally:
            client.close()

    threads = [threading.Thread(target=consume, args=(slot,)) for slot in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    ids = [pk for batch in popped for pk, _score in batch]
    assert len(ids) == count
    assert set(ids) == set(range(count))
    for batch in popped:
        assert [pk for pk, _ in batch] == sorted(pk for pk, _ in batch)  # each in due order


# next_due() --------------------------------------------------------------------------


def test_next_due_is_the_earliest_score_over_the_given_queues(store):
    store.add([(1, "a", 300.0), (2, "a", 200.0), (3, "b", 150.0), (4, "c", 10.0)])
    assert store.next_due(["a", "b"]) == 150.0
    assert store.next_due(["a"]) == 200.0
    assert store.next_due(["empty"]) is None
    assert store.next_due([]) is None


def test_drop_due_removes_entries_due_by_then_of_the_given_lanes_only(store):
    store.add([(1, "a", 100.0), (2, "a", 200.0), (3, "a", 300.0), (4, "b", 50.0)])
    assert store.drop_due(["a", "empty"], 200.0) == 2
    assert store.members("a") == {3: 300.0}
    assert store.members("b") == {4: 50.0}
    assert store.drop_due([], 1000.0) == 0


# Wake notifications ------------------------------------------------------------------


class WakeListener:
    """A real subscription to a queue's wake channel, read up to a marker we publish."""

    def __init__(self, client: redis.Redis, queue: str) -> None:
        self.client = client
        self.channel = wake_channel(queue)
        self.pubsub = client.pubsub()
        self.pubsub.subscribe(self.channel)
        # Subscribed for sure once the confirmation arrived: nothing published later is missed.
        wait_for(lambda: self._next_of_type("subscribe"), timeout=10, interval=0)

    def _next_of_type(self, kind: str) -> bool:
        message = self.pubsub.get_message(timeout=1)
        return message is not None and message["type"] == kind

    def published(self) -> list[float]:
        """Everything published on the channel since the last call."""
        self.client.publish(self.channel, "marker")
        seen: list[float] = []
        while True:
            message = self.pubsub.get_message(timeout=10)
            assert message is not None, f"no marker on {self.channel}"
            if message["type"] != "message":
                continue
            if message["data"] == b"marker":
                return seen
            seen.append(float(message["data"]))

    def close(self) -> None:
        self.pubsub.close()


@pytest.fixture
def wake(redis_client):
    listener = WakeListener(redis_client, "default")
    yield listener
    listener.close()


def test_add_publishes_only_when_the_earliest_due_time_moves_earlier(store, wake):
    store.add([(1, "default", 100.0)])
    assert wake.published() == [100.0]  # the queue was empty
    store.add([(2, "default", 200.0)])
    assert wake.published() == []  # later than the earliest: consumers need not re-plan
    store.add([(3, "default", 50.0)])
    assert wake.published() == [50.0]
    store.add([(2, "default", 20.0)])  # an existing member moved earliest
    assert wake.published() == [20.0]
    store.add([(2, "default", 20.0), (4, "default", 20.0)])  # a tie is not earlier
    assert wake.published() == []
    store.add([(2, "default", 400.0)])  # the earliest moved later
    assert wake.published() == []


def test_add_to_another_queue_does_not_wake_this_one(store, wake):
    store.add([(1, "other", 1.0)])
    assert wake.published() == []


def test_subscribe_wake_receives_notifications_of_its_queues(store, redis_client):
    pubsub = store.subscribe_wake(["default", "other"])
    try:
        # ignore_subscribe_messages: wait until both subscriptions are active.
        wait_for(
            lambda: (
                redis_client.pubsub_numsub(wake_channel("default"), wake_channel("other"))
                == [(wake_channel("default").encode(), 1), (wake_channel("other").encode(), 1)]
            ),
            timeout=10,
        )
        store.add([(7, "other", 70.0)])
        # get_message() answers None for the (ignored) subscribe confirmations first.
        message = wait_for(lambda: pubsub.get_message(timeout=1), timeout=10, interval=0)
        assert message["channel"] == wake_channel("other").encode()
        assert float(message["data"]) == 70.0
    finally:
        pubsub.close()


# The pre-loader lock -----------------------------------------------------------------


def test_preload_lock_is_exclusive_and_released_on_exit(store, redis_client):
    with store.preload_lock(30) as first:
        assert first is True
        ttl = redis_client.pttl(preload_lock_key())
        assert 0 < ttl <= 30_000  # it expires by itself if its holder dies
        with store.preload_lock(30) as second:
            assert second is False
        assert redis_client.exists(preload_lock_key())  # the loser did not release it
    assert not redis_client.exists(preload_lock_key())
    with store.preload_lock(30) as again:
        assert again is True


def test_preload_lock_expires_and_its_late_holder_does_not_release_the_next_one(
    store, redis_client
):
    first_lock = store.preload_lock(0.05)
    assert first_lock.__enter__() is True
    wait_for(lambda: not redis_client.exists(preload_lock_key()), timeout=10)
    with store.preload_lock(30) as second:
        assert second is True
        first_lock.__exit__(None, None, None)  # the stale holder finishes its pass
        assert redis_client.exists(preload_lock_key()), "released someone else's lock"


# URLs in logs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://user:s3cret@redis.example:6379/0", "redis://user:***@redis.example:6379/0"),
        ("rediss://:s3cret@redis.example:6380", "rediss://:***@redis.example:6380"),
        ("redis://user:pa@ss:w@host:6379/1", "redis://user:***@host:6379/1"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
    ],
)
def test_mask_url_hides_passwords(url, masked):
    assert mask_url(url) == masked


def test_mask_url_hides_a_password_given_in_the_query_string():
    masked = mask_url("redis://redis.example:6379/0?password=s3cret&db=1")
    assert "s3cret" not in masked
    assert masked.startswith("redis://redis.example:6379/0?")


def test_describe_target_never_shows_the_password(settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": "redis://u:s3cret@h:1/0"}
    assert "s3cret" not in describe_target()
    assert "h:1" in describe_target()


def test_store_can_reuse_a_django_redis_cache_connection(settings, redis_client):
    settings.CACHES = {
        **settings.CACHES,
        "jobs": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": django_settings.DELAYJOBS["REDIS_URL"],
        },
    }
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": None, "REDIS_CACHE_ALIAS": "jobs"}
    assert describe_target() == "django-redis cache 'jobs'"
    get_store().add([(3, "default", 30.0)])
    assert redis_client.zscore(due_key("default"), "3") == 30.0
    assert get_store().pop_due("default", 31.0, 5) == ([(3, 30.0)], False)


# Lanes --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # the hand-off to Redis happens on commit
def test_a_job_type_with_its_own_limit_waits_in_its_own_lane(redis_client):
    """tests.limited (concurrency 2) has a sorted set of its own within its queue."""
    assert lane("default", "tests.scripted") == "default"
    assert lane("default", "tests.limited") == "default|tests.limited"
    assert "default|tests.limited" in lanes("default")
    limited = delayjobs.schedule("tests.limited")
    plain = delayjobs.schedule("tests.scripted")
    assert redis_client.zrange(due_key("default|tests.limited"), 0, -1) == [
        str(limited.pk).encode()
    ]
    assert redis_client.zrange(due_key("default"), 0, -1) == [str(plain.pk).encode()]
    # Both lanes are in the queue's hash slot and share its wake channel.
    assert due_key("default|tests.limited").startswith(due_key("default"))
