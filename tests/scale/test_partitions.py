"""Partitions under load: a frozen Redis, and a consumer cut off from Redis, then PostgreSQL.

Real ``run_delay_consumer`` processes run ``faults.ledger`` jobs (the fault suite's
harness: ``FaultRun``, its ledger and ``verify``: nothing lost, no attempt run twice, a
job run twice only if its lease expired in the consumer the fault hit). Faults:

- Redis frozen by SIGSTOP for 20 s: it accepts connections and answers nothing, which
  only a timeout can tell. Both consumers must fall back to the database within their
  socket timeout, not after two of them.
- A consumer in a network namespace of its own (see ``tests.scale.netns``) cut off from
  Redis for 20 s, then from PostgreSQL for 20 s, by dropping every packet of the link
  either way; the other consumer, in a namespace of its own too, keeps both.

The 20 s windows are fixed; everything else waits for events. Figures (lateness during
each fault, detection, catch-up after it) go to build/scale/partitions.json.
Needs root (namespaces); fails, never skips, without it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from delayjobs.conf import DEFAULTS
from tests.conftest import ConsumerProcess
from tests.consumers import check_alive
from tests.faults.harness import (
    DB_MODE_LINE,
    REDIS_BACK_LINE,
    FaultRun,
    RunFactory,
    fault_runs,
    first_after,
    first_starts,
    lateness,
    seconds,
)
from tests.faults.jobs import LedgerJob
from tests.faults.results import Results, environment
from tests.faults.services import REPO_ROOT, FaultServices
from tests.scale.netns import Namespace, Network, require_root

RESULTS = REPO_ROOT / "build" / "scale" / "partitions.json"
#: Every fault lasts this long.
WINDOW = 20.0
CONCURRENCY = 10
#: Faults strike once this many executions are in the ledger: under load.
FAULT_AFTER = 100
SOCKET_TIMEOUT = float(DEFAULTS["REDIS_SOCKET_TIMEOUT"])
POLL_INTERVAL = DEFAULTS["DATABASE_POLL_INTERVAL"].total_seconds()
#: Room for a loaded two-core machine on top of what the settings allow.
SLACK = 2.0
#: A consumer that stops hearing from Redis is on the database within this, and no job
#: due meanwhile waits longer: the socket timeout, then one database poll.
FALLBACK_BOUND = SOCKET_TIMEOUT + POLL_INTERVAL + SLACK
#: How often the fault windows look at the consumers' logs (for the detection times).
WATCH = 0.05
#: While a consumer is cut off from PostgreSQL, the others run everything, but a job it
#: claimed as the cut came (the claim committed, its answer lost) waits for its lease
#: (the ledger jobs' time_to_run) and the next pre-loader pass of another consumer.
POSTGRES_LATENESS_BOUND = (
    LedgerJob.time_to_run.total_seconds() + float(settings.DELAYJOBS["PRELOAD_INTERVAL"]) + SLACK
)
#: After a PostgreSQL cut heals, the cut consumer's connections resume at TCP's next
#: retransmission, which backs off exponentially from 0.2 s: a query sent as the cut began
#: is resent 25.4 s later (5.4 s after a 20 s cut heals); one sent later in the cut may
#: wait up to about 12.8 s past the heal. Then one claim.
POSTGRES_CATCH_UP_BOUND = 15.0


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    require_root()
    with Network(2) as network:
        yield network


@pytest.fixture(scope="module")
def services(network: Network) -> Iterator[FaultServices]:
    """PostgreSQL and Redis on 127.0.0.1 and on the host end of every link; stopped by pid."""
    started = FaultServices(listen=network.host_addresses, trusted=(str(network.network),)).start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def results(services: FaultServices) -> Results:
    return Results(RESULTS, environment(services.versions()))


@pytest.fixture
def fault_run(services: FaultServices, results: Results, tmp_path: Path) -> Iterator[RunFactory]:
    with fault_runs(services, results, tmp_path) as start:
        yield start


def start_in(run: FaultRun, namespace: Namespace, worker_id: str) -> ConsumerProcess:
    """A consumer inside ``namespace``, reaching each server over that server's link."""
    assert run.services.redis.port is not None
    return run.start_consumer(
        worker_id,
        concurrency=CONCURRENCY,
        prefix=namespace.prefix,
        env={
            "DELAYJOBS_TEST_REDIS_URL": f"redis://{namespace.redis.host_ip}:"
            f"{run.services.redis.port}/0",
            "DELAYJOBS_TEST_PG_HOST": namespace.postgres.host_ip,
        },
    )


def log_sizes(consumers: dict[str, ConsumerProcess]) -> dict[str, int]:
    """How much each consumer has logged so far: ``watch`` looks only past that."""
    return {name: len(consumer.output()) for name, consumer in consumers.items()}


def watch(
    consumers: dict[str, ConsumerProcess],
    text: str | None,
    since: dict[str, int],
    *,
    until: float | None = None,
    timeout: float = 30.0,
) -> dict[str, float]:
    """When each consumer first logged ``text`` after ``since`` (epoch seconds, as seen).

    With ``until``: wait out a fault window (the fixed wait) noting what is logged
    meanwhile. Without: wait until every consumer has logged it (an event), or fail.
    """
    seen: dict[str, float] = {}
    deadline = time.time() + timeout
    while True:
        check_alive(consumers.values())
        for name, consumer in consumers.items():
            if text and name not in seen and text in consumer.output()[since[name] :]:
                seen[name] = time.time()
        if until is not None and time.time() >= until:
            return seen
        if until is None and len(seen) == len(consumers):
            return seen
        if until is None and time.time() >= deadline:
            logs = "\n".join(f"--- {n}:\n{c.output()[-3000:]}" for n, c in consumers.items())
            raise AssertionError(f"{text!r} not logged by every consumer in {timeout} s:\n{logs}")
        time.sleep(WATCH)


def test_a_frozen_redis_is_replaced_within_its_socket_timeout(fault_run: RunFactory) -> None:
    run = fault_run("frozen", f"Redis frozen (SIGSTOP) for {WINDOW:.0f} s under load")
    consumers = {
        name: run.start_consumer(name, concurrency=CONCURRENCY)
        for name in ("frozen-one", "frozen-two")
    }
    run.wait_listening(list(consumers.values()))
    run.schedule(1500, start_in=1.0, spread=WINDOW + 8.0)
    run.wait_executions(FAULT_AFTER, list(consumers.values()))

    pid = run.services.redis.pid
    assert pid is not None
    marks = log_sizes(consumers)
    frozen_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        detected = watch(consumers, DB_MODE_LINE, marks, until=frozen_at + WINDOW)
    finally:
        os.kill(pid, signal.SIGCONT)
    thawed_at = time.time()
    back = {
        name: seconds(thawed_at, moment)
        for name, moment in watch(consumers, REDIS_BACK_LINE, marks).items()
    }
    final_at = run.wait_final(list(consumers.values()))

    executions = run.verify()  # no duplicate allowed: no consumer lost the database
    detection = {name: seconds(frozen_at, detected.get(name)) for name in consumers}
    during = lateness(run, executions, frozen_at, thawed_at)
    for name, took in detection.items():
        run.check(
            took is not None and took <= FALLBACK_BOUND,
            f"{name} fell back to the database after {took} s (bound {FALLBACK_BOUND} s)",
        )
    run.check(during is not None, "no job was due during the freeze: proves nothing")
    run.check(
        during is not None and during["max"] <= FALLBACK_BOUND,
        f"jobs due during the freeze ran up to {during and during['max']} s late "
        f"(bound {FALLBACK_BOUND} s)",
    )
    run.finish(
        fault=f"Redis SIGSTOPped for {WINDOW:.0f} s after {FAULT_AFTER} executions, two "
        "consumers on loopback, 1,500 jobs due over the whole run",
        socket_timeout_s=SOCKET_TIMEOUT,
        bound_s=FALLBACK_BOUND,
        database_mode_after_s=detection,
        lateness_during_fault_s=during,
        lateness_after_fault_s=lateness(run, executions, thawed_at, float("inf")),
        back_on_redis_after_heal_s=back,
        all_final_after_heal_s=seconds(thawed_at, final_at),
        duplicate_cause="none allowed",
    )


def test_b_a_consumer_cut_off_from_redis_then_from_postgresql(
    fault_run: RunFactory, network: Network
) -> None:
    run = fault_run(
        "partitions",
        f"A consumer cut off from Redis for {WINDOW:.0f} s, then from PostgreSQL for "
        f"{WINDOW:.0f} s, packets dropped",
    )
    cut_ns, other_ns = network.namespaces
    cut = start_in(run, cut_ns, "cut")
    other = start_in(run, other_ns, "other")
    consumers = {"cut": cut}
    run.wait_listening([cut, other])
    # 50 ms of work each: a few jobs run at any moment, so a cut finds some in flight.
    run.schedule(1800, start_in=1.0, spread=2 * WINDOW + 16.0, work_ms=50, cancel=100)
    run.wait_executions(FAULT_AFTER, [cut, other])

    # Redis, cut off: the consumer falls back to the database within its socket timeout.
    marks = log_sizes(consumers)
    redis_cut_at = time.time()
    cut_ns.redis.cut()
    try:
        detected = watch(consumers, DB_MODE_LINE, marks, until=redis_cut_at + WINDOW)
    finally:
        cut_ns.redis.heal()
    redis_healed_at = time.time()
    (redis_back_at,) = watch(consumers, REDIS_BACK_LINE, marks).values()

    # PostgreSQL, cut off: the other consumer runs everything; what the cut one held
    # when the cut came may run twice once its lease expires.
    postgres_cut_at = time.time()
    cut_ns.postgres.cut()
    running_at_cut = {row.job_id for row in run.running(worker="cut")}
    held = set(running_at_cut)
    try:
        watch({"cut": cut, "other": other}, None, {}, until=postgres_cut_at + WINDOW)
    finally:
        cut_ns.postgres.heal()
    postgres_healed_at = time.time()
    final_at = run.wait_final([cut, other])

    ledger = run.executions()
    # Held by the cut consumer: running when the cut came, or claimed before it (a claim
    # needs the database) and started while it lasted or as its connections came back.
    held |= {
        e.job_id
        for e in ledger
        if e.worker == "cut"
        and postgres_cut_at <= e.started < postgres_healed_at + POSTGRES_CATCH_UP_BOUND
    }
    executions = run.verify(in_flight=held)
    first = first_starts(executions)
    redis_detection = seconds(redis_cut_at, detected.get("cut"))
    during_redis = lateness(run, executions, redis_cut_at, redis_healed_at)
    during_postgres = lateness(run, executions, postgres_cut_at, postgres_healed_at)
    cut_ran_in_redis_cut = [
        e for e in executions if e.worker == "cut" and redis_cut_at <= e.started < redis_healed_at
    ]
    back_after_postgres = seconds(
        postgres_healed_at, first_after(executions, postgres_healed_at, "cut")
    )
    due_before_heal = [pk for pk in first if run.run_at[pk] < postgres_healed_at]
    backlog_drained = seconds(
        postgres_healed_at, max((first[pk] for pk in due_before_heal), default=None)
    )

    run.check(
        redis_detection is not None and redis_detection <= FALLBACK_BOUND,
        f"the cut consumer fell back to the database after {redis_detection} s "
        f"(bound {FALLBACK_BOUND} s)",
    )
    for name, figures, bound in (
        ("Redis", during_redis, FALLBACK_BOUND),
        ("PostgreSQL", during_postgres, POSTGRES_LATENESS_BOUND),
    ):
        run.check(figures is not None, f"no job was due during the {name} cut: proves nothing")
        run.check(
            figures is not None and figures["max"] <= bound,
            f"jobs due during the {name} cut ran up to {figures and figures['max']} s late "
            f"(bound {bound} s)",
        )
    run.check(
        back_after_postgres is not None and back_after_postgres <= POSTGRES_CATCH_UP_BOUND,
        f"the cut consumer ran its first job {back_after_postgres} s after PostgreSQL came "
        f"back (bound {POSTGRES_CATCH_UP_BOUND} s)",
    )
    run.finish(
        fault=f"two consumers, each in a network namespace; one cut off from Redis for "
        f"{WINDOW:.0f} s, then from PostgreSQL for {WINDOW:.0f} s (tc qdisc blackhole on "
        "both ends of its link: every packet dropped); 1,800 jobs of 50 ms due over the "
        "whole run, 100 cancelled",
        socket_timeout_s=SOCKET_TIMEOUT,
        bound_s=FALLBACK_BOUND,
        postgres_bound_s=POSTGRES_LATENESS_BOUND,
        redis_cut_database_mode_after_s=redis_detection,
        redis_cut_jobs_run_by_cut_consumer=len(cut_ran_in_redis_cut),
        redis_cut_lateness_s=during_redis,
        redis_cut_back_on_redis_after_heal_s=seconds(redis_healed_at, redis_back_at),
        postgres_cut_running_in_cut_consumer=len(running_at_cut),
        postgres_cut_held_by_cut_consumer=len(held),
        postgres_cut_lateness_s=during_postgres,
        postgres_cut_first_job_of_cut_consumer_after_heal_s=back_after_postgres,
        postgres_cut_backlog_drained_after_heal_s=backlog_drained,
        all_final_after_heal_s=seconds(postgres_healed_at, final_at),
        duplicate_cause="jobs the cut consumer held when PostgreSQL was cut off: their "
        "leases (3 s) expired unrenewed, another consumer ran them again",
    )
