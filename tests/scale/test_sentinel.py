"""Redis Sentinel: the master SIGKILLed under load, and index entries it never replicated.

delayjobs reaches Redis through a django-redis cache configured as django-redis documents
it (``SentinelClient`` and ``SentinelConnectionFactory``, see tests.support.sentinel), named
by ``REDIS_CACHE_ALIAS``. The deployment is real: one master, one replica, three
sentinels, started here on loopback ports. The scenarios reuse the fault suite's harness
(``FaultRun``: ``run_delay_consumer`` processes, ledger jobs scheduled by a driver process
through the public API, ``verify()``: nothing lost, no attempt run twice, a duplicate only
where a lease expired in a consumer the fault hit; here none may expire, so none is
allowed). Waits are for events: ledger lines, Sentinel's ``+switch-master``, subscribers.
Figures go to build/scale/results.json; docs/howto/redis-sentinel.md quotes them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.commands.core import Script

from delayjobs.index.keys import due_key
from delayjobs.index.store import ADD_LUA, POP_DUE_LUA, RELEASE_LOCK_LUA
from tests.faults.harness import (
    DB_MODE_LINE,
    REDIS_BACK_LINE,
    Execution,
    FaultRun,
    RunFactory,
    fault_runs,
    first_after,
    first_starts,
    lateness,
    percentiles,
    seconds,
)
from tests.faults.jobs import QUEUE
from tests.faults.results import Results, environment
from tests.faults.services import REPO_ROOT, FaultServices
from tests.support.sentinel import (
    DOWN_AFTER_MS,
    FAILOVER_TIMEOUT_MS,
    SERVICE,
    SentinelDeployment,
)
from tests.utils import wait_for

RESULTS_ENV = "DELAYJOBS_SCALE_RESULTS"
RESULTS_PATH = REPO_ROOT / "build" / "scale" / "results.json"
CONCURRENCY = 10
#: The load of the first scenario: jobs due over SPREAD seconds from START_IN seconds
#: after scheduling; the master dies once KILL_AFTER of them have run.
JOBS = 1800
START_IN = 1.0
SPREAD = 6.0
KILL_AFTER = 600
#: Scheduled once the failover is over: they can only come through the new master.
JOBS_AFTER = 200
#: The second scenario's jobs, all due within the pre-loader's window (tests.settings: 5
#: s), so schedule() hands every one to the master's index at once; due from the middle
#: of the failover to a few seconds after it.
UNREPLICATED = 600
UNREPLICATED_START_IN = 2.0
UNREPLICATED_SPREAD = 3.0
SCRIPTS = {"add": ADD_LUA, "pop_due": POP_DUE_LUA, "release_lock": RELEASE_LOCK_LUA}


class SentinelServices(FaultServices):
    """The fault suite's services with a Sentinel deployment in place of its one Redis.

    PostgreSQL lives as long as the module; ``deploy()`` replaces the deployment (each
    scenario ends with its master killed). Consumers and the driver reach Redis only
    through the cache of ``tests.support.sentinel.sentinel_cache()``, as a project would.
    """

    def __init__(self) -> None:
        super().__init__()
        self.deployment: SentinelDeployment | None = None
        self.fresh = False  # no scenario has used the deployment yet

    def start(self) -> SentinelServices:
        try:
            self.postgres.start()
            self.deploy()
            self.migrate()
        except BaseException:
            self.stop()
            raise
        return self

    def deploy(self) -> SentinelDeployment:
        if self.deployment is not None:
            self.deployment.stop()
            self.deployment = None
        self.deployment = SentinelDeployment().start()
        self.fresh = True
        # FaultServices.env() passes its URL on, which keeps tests.settings from starting
        # a Redis of its own; delayjobs does not use it (REDIS_CACHE_ALIAS wins).
        self.redis = self.deployment.master
        return self.deployment

    def stop(self) -> None:
        if self.deployment is not None:
            self.deployment.stop()
        self.postgres.stop()

    def env(self, **extra: str) -> dict[str, str]:
        assert self.deployment is not None
        return super().env(**self.deployment.env(), **extra)

    def redis_client(self) -> redis.Redis:
        """The current master's client, through the sentinels: it follows a failover."""
        assert self.deployment is not None
        return self.deployment.master_client()


@pytest.fixture(scope="module")
def sentinel_services() -> Iterator[SentinelServices]:
    services = SentinelServices().start()
    try:
        yield services
    finally:
        services.stop()


@pytest.fixture(scope="module")
def sentinel_results(sentinel_services: SentinelServices) -> Results:
    versions = sentinel_services.versions()
    path = Path(os.environ.get(RESULTS_ENV) or RESULTS_PATH)
    return Results(
        path, environment({**versions, "topology": "Sentinel: 1 master, 1 replica, 3 sentinels"})
    )


@pytest.fixture
def sentinel_run(
    sentinel_services: SentinelServices, sentinel_results: Results, tmp_path: Path
) -> Iterator[Callable[[str, str], FaultRun]]:
    """Factory ``sentinel_run(scenario, title)`` on a deployment whose master is alive."""
    # A new deployment per scenario: the last one ended with its master dead or demoted.
    if not sentinel_services.fresh:
        sentinel_services.deploy()
    sentinel_services.fresh = False
    with fault_runs(sentinel_services, sentinel_results, tmp_path) as start:
        yield start


def deployment_of(run: FaultRun) -> SentinelDeployment:
    services = run.services
    assert isinstance(services, SentinelServices) and services.deployment is not None
    return services.deployment


def scripts_present(client: redis.Redis) -> dict[str, bool]:
    """Which of delayjobs' Lua scripts the server's script cache holds."""
    found = client.script_exists(*(Script(client, body).sha for body in SCRIPTS.values()))
    return dict(zip(SCRIPTS, (bool(f) for f in found), strict=True))


def mode_changes(run: FaultRun) -> dict[str, dict[str, int]]:
    """Per consumer: how often it went to the database fallback and came back to Redis."""
    return {
        name: {
            "to_database": consumer.output().count(DB_MODE_LINE),
            "back_to_redis": consumer.output().count(REDIS_BACK_LINE),
        }
        for name, consumer in run.consumers.items()
    }


def check_back_on_redis(run: FaultRun, changes: dict[str, dict[str, int]]) -> None:
    """A consumer that fell back to the database went back to Redis (the new master)."""
    for name, change in changes.items():
        run.check(
            change["back_to_redis"] == change["to_database"],
            f"{name} went to the database {change['to_database']} time(s) and back to Redis "
            f"{change['back_to_redis']} time(s):\n{run.consumers[name].output()[-3000:]}",
        )


def latest(run: FaultRun, executions: list[Execution], moment: float) -> list[dict[str, Any]]:
    """The five latest jobs: when each was due (seconds after ``moment``, the fault), how
    late it started, and where: enough to tell which part of the failover they waited in."""
    first: dict[int, Execution] = {}
    for execution in executions:
        if execution.job_id not in first or execution.started < first[execution.job_id].started:
            first[execution.job_id] = execution
    ranked = sorted(first.values(), key=lambda e: e.started - run.run_at[e.job_id])[-5:]
    return [
        {
            "due_after_fault_s": seconds(moment, run.run_at[e.job_id]),
            "late_s": seconds(run.run_at[e.job_id], e.started),
            "worker": e.worker,
        }
        for e in reversed(ranked)
    ]


def failover_figures(watch_seen: dict[str, float], fault_at: float) -> dict[str, Any]:
    return {
        "sentinel_down_after_ms": DOWN_AFTER_MS,
        "sentinel_failover_timeout_ms": FAILOVER_TIMEOUT_MS,
        "failover_events_after_fault_s": {
            event: seconds(fault_at, at) for event, at in sorted(watch_seen.items())
        },
    }


def sigkill_master(deployment: SentinelDeployment) -> None:
    deployment.master.kill()


def ask_for_failover(deployment: SentinelDeployment) -> None:
    """What an operator does before maintenance: the old master lives on, demoted."""
    client = deployment.sentinels[0].client()
    try:
        client.sentinel_failover(SERVICE)
    finally:
        client.close()


def dead(deployment: SentinelDeployment, fault_at: float) -> float:
    """A killed master took no write after its kill: every client has to reconnect."""
    return fault_at


def demoted(deployment: SentinelDeployment, fault_at: float) -> float:
    """Until the sentinels made the old master a replica, killing its clients' connections.

    Until then it still takes writes from clients whose pooled connections were opened
    before the switch: redis-py asks the sentinels where the master is only when it
    opens a connection.
    """
    old = deployment.master.client()
    try:
        wait_for(
            lambda: old.info("replication").get("role") == "slave",
            timeout=60,
            interval=0.05,
            message="the sentinels never turned the old master into a replica",
        )
    finally:
        old.close()
    return time.time()


#: Scenario, title, the fault, what it is in words, and until when the old master takes
#: writes.
FAULTS = {
    "sigkill": (
        "sentinel-a",
        "Sentinel: the master SIGKILLed under load",
        sigkill_master,
        "SIGKILL of the Redis master",
        dead,
    ),
    "manual": (
        "sentinel-c",
        "Sentinel: SENTINEL FAILOVER under load (the old master demoted, alive)",
        ask_for_failover,
        "SENTINEL FAILOVER (the old master becomes a replica of the new one)",
        demoted,
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_failover_under_load(sentinel_run: RunFactory, fault: str) -> None:
    scenario, title, inject, described, settled = FAULTS[fault]
    run = sentinel_run(scenario, title)
    deployment = deployment_of(run)
    names = [f"{scenario}-one", f"{scenario}-two"]
    consumers = [run.start_consumer(name, concurrency=CONCURRENCY) for name in names]
    run.wait_listening(consumers)
    assert deployment.replica is not None
    replica = deployment.replica.client()
    # Redis 7 does not replicate scripts: the replica, soon the master, has none of them.
    scripts_on_replica = scripts_present(replica)
    replica.close()
    batch = run.schedule(JOBS, start_in=START_IN, spread=SPREAD)
    watch = deployment.watch_failover()
    run.wait_executions(KILL_AFTER, consumers)

    fault_at = time.time()
    inject(deployment)
    switched_at = watch.wait_switch()
    seen = dict(watch.seen)
    watch.close()
    # Scheduled at once: handed to the new master, while consumers may still be on the old.
    at_switch = run.schedule(JOBS_AFTER, start_in=1.0, spread=1.0)
    settled_at = settled(deployment, fault_at)
    # The wake channel: both consumers subscribed again, on the new master (a consumer
    # still subscribed on the old one would hear of no new job there).
    run.wait_listening(consumers)
    listening_at = time.time()
    # Through the new master only: schedule()'s hand-off (the add script and its wake-up)
    # and the consumers' pops (the pop script), after NOSCRIPT on its empty script cache.
    after = run.schedule(JOBS_AFTER, start_in=1.0, spread=1.0)
    final_at = run.wait_final(consumers)

    executions = run.verify()  # no duplicate allowed: no consumer died, no lease expired
    master = run.services.redis_client()
    scripts_after = scripts_present(master)
    evalsha_calls = int(master.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    master.close()
    run.check(
        all(scripts_after.values()),
        f"delayjobs' scripts did not all run on the new master: {scripts_after}",
    )
    changes = mode_changes(run)
    check_back_on_redis(run, changes)
    for name in run.consumers:
        run.check(
            first_after(executions, switched_at, name) is not None,
            f"{name} ran nothing after the failover",
        )
    first = first_starts(executions)

    def late(ids: list[int]) -> dict[str, float] | None:
        return percentiles([first[pk] - run.run_at[pk] for pk in ids if pk in first])

    run.finish(
        fault=f"{described} after {KILL_AFTER} of {JOBS} executions (two consumers, "
        f"concurrency {CONCURRENCY}); {JOBS_AFTER} more jobs scheduled at +switch-master, "
        f"{JOBS_AFTER} more once the old master was gone or demoted and both consumers "
        "listened on the new master",
        duplicate_cause="none allowed: no consumer died, no lease expired",
        failover_s=seconds(fault_at, switched_at),
        **failover_figures(seen, fault_at),
        old_master_took_writes_until_s=seconds(fault_at, settled_at),
        consumers_listening_again_after_fault_s=seconds(fault_at, listening_at),
        jobs_scheduled_at_switch=len(at_switch.ids),
        lateness_scheduled_at_switch_s=late(at_switch.ids),
        jobs_scheduled_after_settled=len(after.ids),
        lateness_scheduled_after_settled_s=late(after.ids),
        jobs_due_during_failover=sum(fault_at <= run.run_at[pk] < switched_at for pk in batch.ids),
        lateness_before_fault_s=lateness(run, executions, 0.0, fault_at),
        lateness_during_failover_s=lateness(run, executions, fault_at, switched_at),
        lateness_after_failover_s=lateness(run, executions, switched_at, float("inf")),
        scripts_on_replica_before_failover=scripts_on_replica,
        scripts_on_new_master_after=scripts_after,
        evalsha_calls_on_new_master=evalsha_calls,
        database_fallback=changes,
        latest_jobs=latest(run, executions, fault_at),
        all_final_after_fault_s=seconds(fault_at, final_at),
        recovery_s=seconds(fault_at, first_after(executions, switched_at)),
        recovery_means="from the fault until the first job started after +switch-master",
    )


def test_entries_not_replicated_before_failover(sentinel_run: RunFactory) -> None:
    run = sentinel_run(
        "sentinel-b",
        "Sentinel: index entries written to the master, never replicated, then a failover",
    )
    deployment = deployment_of(run)
    assert deployment.replica is not None
    consumers = [run.start_consumer(n, concurrency=CONCURRENCY) for n in ("sb-one", "sb-two")]
    run.wait_listening(consumers)
    watch = deployment.watch_failover()

    deployment.cut_replication()
    paused_at = time.time()
    # The consumers are stopped while the batch is written and counted: however slow the
    # driver is, none of them can take an entry off the master's index before it is counted.
    with run.stopped(consumers):
        batch = run.schedule(
            UNREPLICATED, start_in=UNREPLICATED_START_IN, spread=UNREPLICATED_SPREAD
        )
        old_master = deployment.master.client()
        on_old_master = len(set(old_master.zrange(due_key(QUEUE), 0, -1)) & ids_of(batch.ids))
        old_master.close()
    killed_at = time.time()
    deployment.master.kill()
    deployment.replica.resume()
    # Read at once: its master is dead, so nothing can reach it any more, and the
    # sentinels need DOWN_AFTER_MS before they even start a failover.
    replica = deployment.replica.client()
    on_replica = len(set(replica.zrange(due_key(QUEUE), 0, -1)) & ids_of(batch.ids))
    replica.close()
    switched_at = watch.wait_switch()
    seen = dict(watch.seen)
    watch.close()
    final_at = run.wait_final(consumers)

    executions = run.verify()  # no duplicate allowed: no consumer died
    run.check(
        on_old_master == len(batch.ids),
        f"only {on_old_master} of {len(batch.ids)} jobs were in the master's index",
    )
    run.check(
        on_replica < on_old_master,
        f"the replica had {on_replica} of the {on_old_master} entries: proves nothing",
    )
    changes = mode_changes(run)
    check_back_on_redis(run, changes)
    due_from = min(batch.run_at.values())
    run.finish(
        fault=f"replica stopped (SIGSTOP) and its link dropped by the master (CLIENT KILL "
        f"TYPE replica), {UNREPLICATED} jobs scheduled (their index "
        "entries written to the master only, counted there while the consumers were "
        "SIGSTOPped), master SIGKILLed, replica resumed and "
        "promoted",
        duplicate_cause="none allowed: no consumer died, no lease expired",
        replica_paused_before_kill_s=seconds(paused_at, killed_at),
        entries_on_old_master=on_old_master,
        entries_on_replica_at_kill=on_replica,
        failover_s=seconds(killed_at, switched_at),
        **failover_figures(seen, killed_at),
        first_due_after_kill_s=seconds(killed_at, due_from),
        lateness_due_during_failover_s=lateness(run, executions, killed_at, switched_at),
        lateness_due_after_failover_s=lateness(run, executions, switched_at, float("inf")),
        lateness_all_s=lateness(run, executions, 0.0, float("inf")),
        database_fallback=changes,
        latest_jobs=latest(run, executions, killed_at),
        all_final_after_kill_s=seconds(killed_at, final_at),
        recovery_s=seconds(killed_at, first_after(executions, switched_at)),
        recovery_means="from the kill until the first job started after +switch-master",
    )


def ids_of(ids: list[int]) -> set[bytes]:
    """Job ids as the sorted set's members."""
    return {str(pk).encode() for pk in ids}
