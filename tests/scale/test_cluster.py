"""delayjobs on a real Redis Cluster of three masters.

The cluster, a PostgreSQL and every consumer are real processes this module starts on
loopback ports. Every key of a queue carries the queue as a hash tag, so the 16 queues
used here land on slots owned by all three masters (asserted), and each queue's scripts
touch one slot. The store's core unit tests run again on a cluster client; then two
``run_delay_consumer`` processes with the pre-loader run jobs over the 16 queues, and the
fault suite's ledger checks that every job ran exactly once and none early, through a
pause and resume and an outage of the whole cluster. Lateness is measured and reported
(``build/scale/cluster.json``), not asserted, except where a wake or a resume
announcement that never came would make jobs a whole IDLE_TIMEOUT late.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from redis.cluster import RedisCluster

from delayjobs.index.client import describe_target, get_client
from delayjobs.index.keys import due_key, preload_lock_key, wake_channel
from delayjobs.index.store import RedisStore, get_store
from tests.conftest import ConsumerProcess
from tests.consumers import check_alive, wait_output
from tests.faults.harness import JOBS, Batch, Execution, FaultRun, percentiles
from tests.faults.results import REPO_ROOT, Results, environment
from tests.faults.services import FaultServices

# The store's unit tests, collected here again to run on the cluster (the fixtures below
# give them a cluster client). Left out: those that open a second, single-server client
# of their own, or count subscribers with PUBSUB NUMSUB (per node on a cluster).
from tests.integration.test_redis_store import (  # noqa: F401
    test_add_keeps_microsecond_precision_of_scores,
    test_add_of_nothing_is_nothing,
    test_add_publishes_only_when_the_earliest_due_time_moves_earlier,
    test_add_spreads_entries_over_their_queues,
    test_add_stores_ids_and_scores_only_and_moves_a_member_earlier_never_later,
    test_add_takes_a_batch_larger_than_lua_can_unpack_at_once,
    test_add_to_another_queue_does_not_wake_this_one,
    test_next_due_is_the_earliest_score_over_the_given_queues,
    test_pop_due_includes_a_job_due_exactly_now,
    test_pop_due_of_another_queue_leaves_this_one,
    test_pop_due_returns_due_ids_earliest_first_up_to_the_limit,
    test_pop_due_with_no_free_slot_takes_nothing,
    test_preload_lock_expires_and_its_late_holder_does_not_release_the_next_one,
    test_preload_lock_is_exclusive_and_released_on_exit,
    test_remove_drops_only_the_given_members,
    wake,
)
from tests.support.cluster import RedisClusterServers
from tests.utils import wait_for

QUEUE_COUNT = 16
RESULTS_PATH = REPO_ROOT / "build" / "scale" / "cluster.json"
#: The consumers' safety-net sleep: long, so a job that starts on time after they went
#: to sleep was woken by the wake channel (or the control channel), not by this timeout.
IDLE_TIMEOUT = 10.0
#: Matches tests.settings, which the consumers use: the pre-loader loads 5 s ahead.
PRELOAD_WINDOW = 5.0
LOAD_JOBS = 1600
LOAD_SPREAD = 12.0
PAUSED_JOBS = 40
#: How far ahead the paused queue's jobs are due: time to pause it once they are in Redis.
PAUSE_LEAD = 2.0
#: Jobs due while no node of the cluster answers.
OUTAGE_JOBS = 160


class ClusterServices(FaultServices):
    """The fault suite's PostgreSQL with a Redis Cluster in place of its Redis.

    Its children (consumers, the scheduling driver) get ``REDIS_CLUSTER = True`` and a
    URL of one node, as a deployment on a cluster would configure delayjobs.
    """

    def __init__(self) -> None:
        super().__init__()
        self.cluster = RedisClusterServers()
        # Started, stopped and named in children's settings in place of the single Redis.
        self.redis = self.cluster  # type: ignore[assignment]

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(DELAYJOBS_TEST_OVERRIDES=json.dumps(cluster_overrides()), **extra)

    def redis_client(self) -> RedisCluster:  # type: ignore[override]
        return self.cluster.client()

    def versions(self) -> dict[str, str]:
        client = self.cluster.nodes[0].client()
        try:
            version = str(client.info("server").get("redis_version"))
        finally:
            client.close()
        return {**super().versions(), "redis": f"{version}, {len(self.cluster.nodes)} masters"}


def cluster_overrides(**values: Any) -> dict[str, Any]:
    """DELAYJOBS overrides of the suite's children: on the cluster, plus ``values``."""
    return {"REDIS_CLUSTER": True, **values}


@pytest.fixture(scope="module")
def cluster_services() -> Iterator[ClusterServices]:
    """A 3-master Redis Cluster and a PostgreSQL, migrated; stopped by pid at the end."""
    services = ClusterServices().start()
    try:
        yield services
    finally:
        services.stop()


@pytest.fixture(scope="module")
def cluster(cluster_services: ClusterServices) -> RedisClusterServers:
    return cluster_services.cluster


@pytest.fixture
def redis_client(cluster: RedisClusterServers) -> Iterator[RedisCluster]:
    """A cluster client (for the store tests above), every master flushed around the test."""
    client = cluster.client()
    try:
        client.flushall()
        yield client
        client.flushall()
    finally:
        client.close()


@pytest.fixture
def store(redis_client: RedisCluster) -> RedisStore:
    return RedisStore(redis_client)


def spread_queues(cluster: RedisClusterServers, count: int = QUEUE_COUNT) -> dict[str, int]:
    """``count`` queue names, as evenly spread over the masters as names allow: name -> port.

    Candidates are taken in order and kept while their master has fewer than its share,
    so the choice is deterministic and each master owns 5 or 6 of the 16.
    """
    base, extra = divmod(count, len(cluster.nodes))  # 16 over 3: 5, 5 and one 6
    chosen: dict[str, int] = {}
    per_master: Counter[int] = Counter()
    candidate = 0
    while len(chosen) < count:
        name = f"shard-{candidate}"
        candidate += 1
        master = cluster.master_of(due_key(name))
        larger = sum(1 for n in per_master.values() if n > base)
        if per_master[master] < base or (per_master[master] == base and larger < extra):
            chosen[name] = master
            per_master[master] += 1
    return chosen


# The store on a cluster ----------------------------------------------------------------


def test_every_key_of_a_queue_is_in_one_slot_and_queues_spread_over_all_masters(
    cluster: RedisClusterServers,
) -> None:
    queues = spread_queues(cluster)
    for name in queues:
        keys = [due_key(name), due_key(f"{name}|some.type"), wake_channel(name)]
        assert len({cluster.slot_of(key) for key in keys}) == 1, keys
    masters = Counter(queues.values())
    assert sorted(masters) == sorted(node.port for node in cluster.nodes)
    assert sorted(masters.values()) == [5, 5, 6]


def test_get_store_reaches_the_cluster_from_the_settings(
    settings: Any, cluster: RedisClusterServers, redis_client: RedisCluster
) -> None:
    """REDIS_CLUSTER = True makes the shared client a cluster client; one add() of entries
    of queues on three masters lands each on its own master."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": cluster.url, "REDIS_CLUSTER": True}
    assert isinstance(get_client(), RedisCluster)
    assert describe_target() == f"Redis Cluster at {cluster.url}"
    queues = spread_queues(cluster, 3)
    entries = [(n, name, 100.0 + n) for n, name in enumerate(queues)]
    assert get_store().add(entries) == 3
    for n, (name, port) in enumerate(queues.items()):
        node = next(node for node in cluster.nodes if node.port == port)
        client = node.client()
        try:
            assert client.zscore(due_key(name), str(n)) == 100.0 + n  # on its own master
        finally:
            client.close()
    assert get_store().next_due(list(queues)) == 100.0
    with get_store().preload_lock(30) as held:
        assert held and redis_client.exists(preload_lock_key())


def test_subscribe_wake_hears_queues_of_every_master(
    store: RedisStore, cluster: RedisClusterServers
) -> None:
    """One subscription (to one node) receives the wakes published by scripts on all three
    masters, and the control channel: PUBLISH is broadcast over the cluster bus."""
    queues = list(spread_queues(cluster, 3))
    pubsub = store.subscribe_wake(queues)
    try:
        wait_for(lambda: all(cluster.subscribers(wake_channel(q)) == 1 for q in queues))
        store.add([(n, name, 10.0 + n) for n, name in enumerate(queues)])
        store.announce_control()
        heard: list[bytes] = []

        def all_heard() -> bool:
            message = pubsub.get_message(timeout=1)
            if message is not None:
                heard.append(message["channel"])
            return len(heard) == len(queues) + 1

        wait_for(all_heard, timeout=10, interval=0, message=f"heard only {heard}")
        expected = [wake_channel(q).encode() for q in queues] + [b"dj-test:control"]
        assert sorted(heard) == sorted(expected)
    finally:
        pubsub.close()


# Consumers on a cluster ----------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster_results(cluster_services: ClusterServices) -> Results:
    return Results(RESULTS_PATH, environment(cluster_services.versions()))


@pytest.fixture
def cluster_run(
    cluster_services: ClusterServices, cluster_results: Results, tmp_path: Path
) -> Iterator[FaultRun]:
    run = FaultRun(
        "redis_cluster",
        "16 queues over a 3-master Redis Cluster: 2 consumers with the pre-loader",
        cluster_services,
        tmp_path,
        cluster_results,
    )
    try:
        yield run
    finally:
        run.stop_all()


def executed(run: FaultRun, ids: Sequence[int]) -> dict[int, float]:
    """Start time of each of ``ids`` the ledger shows executed."""
    wanted = set(ids)
    return {e.job_id: e.started for e in run.executions() if e.job_id in wanted}


def wait_executed(run: FaultRun, batch: Batch, consumers: Sequence[ConsumerProcess]) -> None:
    def done() -> bool:
        check_alive(consumers)
        return len(executed(run, batch.ids)) == len(batch.ids)

    wait_for(done, timeout=60, interval=0.01, message=run._diagnostics("executions"))


def lateness(run: FaultRun, batch: Batch) -> list[float]:
    return [started - batch.run_at[pk] for pk, started in executed(run, batch.ids).items()]


def test_sixteen_queues_two_consumers_exactly_once_on_time(
    cluster_run: FaultRun, cluster: RedisClusterServers
) -> None:
    run = cluster_run
    queues = spread_queues(cluster)
    names = list(queues)
    overrides = cluster_overrides(IDLE_TIMEOUT=IDLE_TIMEOUT)
    queue_args = [arg for name in names for arg in ("--queue", name)]
    consumers = [
        run.start_consumer(worker, *queue_args, concurrency=10, overrides=overrides)
        for worker in ("c1", "c2")
    ]
    # Started and idle: both subscribed to every queue's wake channel (on whichever node).
    wait_for(
        lambda: (
            check_alive(consumers)
            or all(cluster.subscribers(wake_channel(name)) == 2 for name in names)
        ),
        message=run._diagnostics("subscriptions"),
    )

    # 1. The wake channel: with nothing due, the consumers sleep up to IDLE_TIMEOUT; a job
    # scheduled 1 s ahead on a queue of each master starts on time only if the script's
    # PUBLISH on that master reached them.
    first_of_master = {port: name for name, port in reversed(queues.items())}
    woken: dict[str, float] = {}
    for port, name in sorted(first_of_master.items()):
        batch = run.schedule(1, start_in=1.0, bulk=False, queues=[name])
        wait_executed(run, batch, consumers)
        (late,) = lateness(run, batch)
        woken[f"{name}@{port}"] = round(late, 4)
        assert late < IDLE_TIMEOUT / 2, f"job on {name} started {late:.2f}s late: not woken"

    # 2. The load: jobs over all 16 queues, most due beyond the window when scheduled, so
    # the pre-loader (run by one consumer at a time, under its lock) loads them.
    load = run.schedule(LOAD_JOBS, start_in=2.0, spread=LOAD_SPREAD, queues=names)
    beyond_window = sum(
        1 for pk in load.ids if load.run_at[pk] > load.scheduled_at[pk] + PRELOAD_WINDOW
    )
    wait_executed(run, load, consumers)
    load_lateness = lateness(run, load)

    # 3. Pause and resume. The paused queue's jobs are in Redis already when the pause
    # comes, and come due before another queue's; once those all ran, none of the paused
    # queue's may have (the claim itself checks the pauses in the database). The resume
    # puts them back into Redis and is announced on the control channel: a consumer that
    # missed the announcement would go on skipping the queue until IDLE_TIMEOUT.
    paused_queue, other_queue = names[0], next(n for n in names if queues[n] != queues[names[0]])
    held = run.schedule(
        PAUSED_JOBS, start_in=PAUSE_LEAD, spread=0.5, queues=[paused_queue], then_pause=paused_queue
    )
    assert held.paused_at is not None
    paused = held.paused_at
    assert paused < min(held.run_at.values()), "paused after the jobs came due: too slow"
    # Due at least a second after the last held job, whenever the driver gets to it.
    after_held = max(held.run_at.values()) + 1.0 - time.time()
    others = run.schedule(PAUSED_JOBS, start_in=after_held, spread=0.5, queues=[other_queue])
    wait_executed(run, others, consumers)
    ran_while_paused = executed(run, held.ids)
    assert not ran_while_paused, f"{len(ran_while_paused)} job(s) of a paused queue ran"
    resumed = run.set_paused(paused_queue, False)
    wait_executed(run, held, consumers)
    resume_to_last = max(executed(run, held.ids).values()) - resumed
    assert resume_to_last < IDLE_TIMEOUT / 2, f"resume took {resume_to_last:.2f}s"

    for consumer in consumers:
        output = consumer.output()
        # So far every job must have gone through the cluster: no consumer fell back to
        # the database (Redis-down mode would run them all the same), no pass failed.
        run.check("Redis unreachable" not in output, f"a consumer lost the cluster:\n{output}")
        run.check("Pre-loader pass failed" not in output, f"a pre-loader pass failed:\n{output}")

    # 4. The whole cluster down: consumers claim from the database, and go back to the
    # cluster (refilled by a pre-loader pass) once it answers again.
    # A sleeping consumer notices at its next look at Redis, IDLE_TIMEOUT at the latest.
    down = time.time()
    cluster.take_down()
    for consumer in consumers:
        wait_output(consumer, "Redis unreachable")
    noticed = time.time() - down
    outage = run.schedule(OUTAGE_JOBS, start_in=1.0, spread=2.0, queues=names)
    wait_executed(run, outage, consumers)
    up = time.time()
    cluster.bring_up()
    for consumer in consumers:
        wait_output(consumer, "Redis is back", timeout=60)
    back = time.time() - up
    after = run.schedule(len(names), start_in=1.0, queues=names)
    wait_executed(run, after, consumers)

    run.wait_final(consumers)
    executions = run.verify()
    per_master = executions_per_master(executions, queues, run)
    run.finish(
        queues=len(names),
        masters=len(cluster.nodes),
        queues_per_master=dict(Counter(str(port) for port in queues.values())),
        executions_per_master=per_master,
        load_jobs=LOAD_JOBS,
        load_spread_seconds=LOAD_SPREAD,
        load_due_beyond_window_when_scheduled=beyond_window,
        load_lateness_seconds=percentiles(load_lateness),
        wake_lateness_seconds=woken,
        paused_jobs=PAUSED_JOBS,
        ran_while_paused=len(ran_while_paused),
        resume_to_last_paused_job_seconds=round(resume_to_last, 3),
        pause_committed_before_due_seconds=round(min(held.run_at.values()) - paused, 3),
        outage_jobs=OUTAGE_JOBS,
        outage_noticed_by_both_seconds=round(noticed, 3),
        cluster_restarted_to_both_back_seconds=round(back, 3),
        outage_lateness_seconds=percentiles(lateness(run, outage)),
        after_outage_lateness_seconds=percentiles(lateness(run, after)),
        executions_total=len(executions),
    )


def executions_per_master(
    executions: Sequence[Execution], queues: dict[str, int], run: FaultRun
) -> dict[str, int]:
    """Executions per master (by port), from the queues of the jobs' rows."""
    queue_of = dict(run.query(f'SELECT id, queue FROM "{JOBS}"'))
    counts: Counter[str] = Counter()
    for execution in executions:
        queue = queue_of.get(execution.job_id)
        if queue in queues:
            counts[str(queues[queue])] += 1
    return dict(counts)
