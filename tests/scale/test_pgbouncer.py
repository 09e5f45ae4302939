"""PgBouncer in transaction mode between the consumers and PostgreSQL, faults included.

Real ``run_delay_consumer`` processes (and the driver that schedules, as an app would) reach
the database through a real ``pgbouncer`` (Debian's) in transaction pooling, with Django's
``DISABLE_SERVER_SIDE_CURSORS``, on their own PostgreSQL and Redis. Each scenario reuses
the fault suite's harness (``tests.faults``): thousands of ledger jobs, two consumers, a
fault injected under load, a wait (by polling the rows) until every job is final, then
``FaultRun.verify``: nothing lost, nothing cancelled run, no attempt run twice, a job run
twice only if it was in flight when the fault struck. The checks read PostgreSQL directly,
never through the PgBouncer being faulted. Figures go to build/scale/pgbouncer.json.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psycopg
import pytest
from django.db.utils import ConnectionHandler

from tests.conftest import ConsumerProcess
from tests.faults.harness import (
    FaultRun,
    RunFactory,
    Running,
    fault_runs,
    first_after,
    lateness,
    seconds,
)
from tests.faults.results import REPO_ROOT, Results, environment
from tests.faults.services import FaultServices
from tests.support.pgbouncer import PgBouncerServer

RESULTS = REPO_ROOT / "build" / "scale" / "pgbouncer.json"

#: Server connections per (database, user): fewer than the consumers' client connections,
#: so PgBouncer really multiplexes them, as it does in production.
POOL_SIZE = 8
PGBOUNCER_SETTINGS: dict[str, str | int] = {
    "default_pool_size": POOL_SIZE,
    "max_client_conn": 100,
    # After a failed login to PostgreSQL (it is restarting), PgBouncer refuses clients at
    # once for this long before it tries again: 15 s by default, which would add up to
    # 15 s to every recovery from a PostgreSQL restart.
    "server_login_retry": 1,
    # How long a query may wait for a server connection before PgBouncer fails it and
    # closes the client (120 s by default): short here so an exhausted pool turns into
    # errors the consumers must survive, not only into waiting.
    "query_wait_timeout": 4,
}

#: The load: 2,000 jobs due over 5 s from 1 s after scheduling, 100 cancelled first. Under
#: a fault, over 20 s: some come due before the fault, some during it, some after recovery,
#: even on a loaded machine whose hundred cancels take seconds before the fault can strike.
JOBS = 2000
START_IN = 1.0
SPREAD = 5.0
FAULT_SPREAD = 20.0
CANCEL = 100
ONE_BY_ONE = 200  # test_a: jobs scheduled by schedule(), one call each
CONCURRENCY = 10
#: Faults strike once this many executions are in the ledger: in the thick of the load.
FAULT_AFTER = 400
#: The fault windows: PgBouncer down, PostgreSQL down, the pool held by another client.
#: PostgreSQL's and the pool's outlast the lease (3 s), so leases of jobs in flight expire.
PGBOUNCER_OUTAGE = 2.0
POSTGRES_OUTAGE = 5.0
POOL_HELD = 6.0


class PgBouncerFaultServices(FaultServices):
    """The fault suite's servers with a PgBouncer in front of PostgreSQL for the children."""

    def __init__(self) -> None:
        super().__init__()
        self.pgbouncer = PgBouncerServer(self.postgres, settings=PGBOUNCER_SETTINGS)

    def start(self) -> PgBouncerFaultServices:
        try:
            self.postgres.start()
            self.pgbouncer.start()
        except BaseException:
            self.stop()
            raise
        super().start()  # PostgreSQL already runs; then Redis, and migrate through PgBouncer
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.pgbouncer.stop()
        super().stop()

    def database_overrides(self) -> dict[str, Any]:
        # Django's own advice for transaction pooling: no server-side cursors, whose
        # DECLARE and FETCHes could land on different server connections. Prepared
        # statements are already off: Django sets psycopg's prepare_threshold to None.
        return {
            "PORT": str(self.pgbouncer.port),
            "DISABLE_SERVER_SIDE_CURSORS": True,
        }

    def stats(self) -> dict[str, Any]:
        """PgBouncer's counters for the suite's database (transactions, queries, waits)."""
        return self._row("SHOW STATS")

    def pool(self) -> dict[str, Any]:
        """The suite's pool: clients active and waiting, server connections by state."""
        return self._row("SHOW POOLS")

    def _row(self, command: str) -> dict[str, Any]:
        for row in self.pgbouncer.admin(command):
            if row["database"] == self.postgres.name:
                return row
        raise AssertionError(f"no {command} row for {self.postgres.name}")


@pytest.fixture(scope="module")
def services() -> Iterator[PgBouncerFaultServices]:
    """PostgreSQL, PgBouncer and Redis for this module alone; stopped by pid at the end."""
    started = PgBouncerFaultServices().start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def results(services: PgBouncerFaultServices) -> Results:
    versions = services.versions()
    (version,) = services.pgbouncer.admin("SHOW VERSION")
    versions["pgbouncer"] = str(version["version"])
    return Results(RESULTS, environment(versions))


@pytest.fixture
def pgbouncer_run(
    services: PgBouncerFaultServices, results: Results, tmp_path: Path
) -> Iterator[RunFactory]:
    with fault_runs(services, results, tmp_path) as start:
        yield start


def transactions(services: PgBouncerFaultServices) -> int:
    return int(services.stats()["total_xact_count"] or 0)


def start_consumers(run: FaultRun, prefix: str) -> list[ConsumerProcess]:
    consumers = [
        run.start_consumer(f"{prefix}-{n}", concurrency=CONCURRENCY) for n in ("one", "two")
    ]
    run.wait_listening(consumers)
    return consumers


@dataclass
class Fault:
    """When a fault struck a scenario's load and ended, and what was running then."""

    running: list[Running]
    snapshot_at: float
    struck_at: float
    ending_at: float = 0.0  # the fault's end began: the restart, the release
    ended_at: float = 0.0  # the server answers again


def fault_under_load(
    run: FaultRun,
    consumers: list[ConsumerProcess],
    window: float,
    strike: Callable[[], Callable[[], None]],
) -> Fault:
    """Schedule the load, ``strike()`` once it is well under way, end the fault (with the
    function ``strike`` returned) ``window`` seconds later, and wait until every row is final.
    """
    batch = run.schedule(JOBS, start_in=START_IN, spread=FAULT_SPREAD, cancel=CANCEL)
    scheduled_at = time.time()  # and cancelled
    run.wait_executions(FAULT_AFTER, consumers)
    snapshot_at = time.time()
    fault = Fault(running=run.running(), snapshot_at=snapshot_at, struck_at=time.time())
    run.figures.update(
        struck_after_first_due_s=seconds(min(batch.run_at.values()), fault.struck_at),
        driver_returned_after_first_due_s=seconds(min(batch.run_at.values()), scheduled_at),
        driver_schedule_many_s=seconds(batch.began, batch.ended),
        driver_cancels_s=seconds(batch.ended, scheduled_at),
    )
    run.check(
        scheduled_at < max(batch.run_at.values()) - window,
        f"the driver returned {scheduled_at - batch.began:.1f} s after it began (its cancels "
        f"{scheduled_at - batch.ended:.1f} s): too late for a fault under load",
    )
    end = strike()
    try:
        time.sleep(max(0.0, fault.struck_at + window - time.time()))  # the fault window
    finally:
        fault.ending_at = time.time()
        end()
        fault.ended_at = time.time()
    return fault


class Restartable(Protocol):
    def take_down(self) -> None: ...
    def bring_up(self) -> None: ...


def restart(server: Restartable) -> Callable[[], Callable[[], None]]:
    """A fault that takes ``server`` down and, when it ends, brings it up again."""

    def strike() -> Callable[[], None]:
        server.take_down()
        return server.bring_up

    return strike


def verify_recovery(
    run: FaultRun, consumers: list[ConsumerProcess], happened: Fault, **figures: Any
) -> None:
    """Check the ledger and the recovery, record the figures common to every happened."""
    final_at = run.wait_final(consumers)
    # In flight at the fault: running at the snapshot, or started before it ended (a
    # start needs a claim, and a claim needs the database: claimed before the fault).
    in_flight = {row.job_id for row in happened.running} | {
        e.job_id for e in run.executions() if happened.snapshot_at <= e.started < happened.ending_at
    }
    executions = run.verify(in_flight=in_flight)
    for name, consumer in zip(run.consumers, consumers, strict=True):
        # Recovered by itself: nothing would have restarted it.
        run.check(
            consumer.returncode is None,
            f"{name} exited with {consumer.returncode}:\n{consumer.output()[-3000:]}",
        )
        run.check(
            first_after(executions, happened.ended_at, name) is not None,
            f"{name} ran nothing after the fault",
        )
    resumed = seconds(happened.ending_at, first_after(executions, happened.ending_at))
    run.finish(
        running_at_snapshot=len(happened.running),
        executions_in_fault=sum(
            1 for e in executions if happened.struck_at <= e.started < happened.ending_at
        ),
        lateness_before_fault_s=lateness(run, executions, 0.0, happened.struck_at),
        lateness_due_in_fault_s=lateness(run, executions, happened.struck_at, happened.ended_at),
        lateness_after_fault_s=lateness(run, executions, happened.ended_at, float("inf")),
        server_back_after_s=seconds(happened.ending_at, happened.ended_at),
        executions_resumed_after_s=resumed,
        all_final_after_s=seconds(happened.ending_at, final_at),
        recovery_s=resumed,
        **figures,
    )


def test_a_core_path_through_pgbouncer(
    pgbouncer_run: RunFactory, services: PgBouncerFaultServices
) -> None:
    run = pgbouncer_run("pgbouncer-a", "The core path through PgBouncer (transaction pooling)")
    before = transactions(services)
    consumers = start_consumers(run, "a")
    batch = run.schedule(JOBS, start_in=START_IN, spread=SPREAD, cancel=CANCEL)
    # schedule() one job at a time too: its INSERT has its values bound on the server, which
    # transaction pooling must carry as it does any statement (no prepared statement).
    run.schedule(ONE_BY_ONE, start_in=START_IN, spread=SPREAD, bulk=False)
    final_at = run.wait_final(consumers)
    pool = services.pool()

    executions = run.verify()  # no duplicate allowed: no fault
    clients = int(pool["cl_active"] or 0) + int(pool["cl_waiting"] or 0)
    # The consumers, still running (the driver has exited), are PgBouncer's clients: none
    # of them reached PostgreSQL some other way.
    run.check(clients >= len(consumers), f"{clients} client(s) of PgBouncer, not the consumers")
    run.check(pool["pool_mode"] == "transaction", f"pool mode {pool['pool_mode']}")
    run.finish(
        fault="none: two consumers (concurrency 10 each) and the scheduling driver through "
        f"PgBouncer, transaction pooling, {POOL_SIZE} server connections",
        duplicate_cause="none allowed",
        transactions_through_pgbouncer=transactions(services) - before,
        client_connections=clients,
        server_connections=sum(
            int(pool[key] or 0) for key in ("sv_active", "sv_idle", "sv_used", "sv_tested")
        ),
        lateness_s=lateness(run, executions, 0.0, float("inf")),
        all_final_after_s=seconds(min(batch.run_at.values()), final_at),
        recovery_s=None,
        recovery_means="no fault",
    )


def test_b_pgbouncer_restarted_under_load(
    pgbouncer_run: RunFactory, services: PgBouncerFaultServices
) -> None:
    run = pgbouncer_run(
        "pgbouncer-b", f"PgBouncer restarted under load ({PGBOUNCER_OUTAGE:.0f} s down)"
    )
    consumers = start_consumers(run, "b")

    fault = fault_under_load(run, consumers, PGBOUNCER_OUTAGE, restart(services.pgbouncer))
    verify_recovery(
        run,
        consumers,
        fault,
        fault=f"PgBouncer immediate shutdown (SIGTERM, by pid) after {FAULT_AFTER} "
        f"executions, started again {PGBOUNCER_OUTAGE:.0f} s later on the same port; "
        "every client and server connection cut",
        duplicate_cause="attempts in flight when the connections were cut, if their lease "
        "expired before the outcome could be recorded",
        recovery_means="from starting PgBouncer again until the next job started",
    )


def test_c_postgresql_restarted_behind_pgbouncer(
    pgbouncer_run: RunFactory, services: PgBouncerFaultServices
) -> None:
    run = pgbouncer_run(
        "pgbouncer-c",
        f"PostgreSQL restarted behind PgBouncer under load ({POSTGRES_OUTAGE:.0f} s down)",
    )
    consumers = start_consumers(run, "c")

    fault = fault_under_load(run, consumers, POSTGRES_OUTAGE, restart(services.postgres))
    verify_recovery(
        run,
        consumers,
        fault,
        fault=f"PostgreSQL fast shutdown (SIGINT to the postmaster, by pid) after "
        f"{FAULT_AFTER} executions, started again {POSTGRES_OUTAGE:.0f} s later on the same "
        "data and port; PgBouncer kept running, its server connections cut",
        duplicate_cause="attempts running when the database went away: their leases (3 s) "
        "could not be renewed during the outage",
        server_login_retry_s=PGBOUNCER_SETTINGS["server_login_retry"],
        recovery_means="from starting PostgreSQL again (its own start-up included) until "
        "the next job started through PgBouncer",
    )


def hold_pool(services: PgBouncerFaultServices) -> list[psycopg.Connection[Any]]:
    """Take every server connection of the pool: one open transaction per client.

    Each query waits in PgBouncer's queue until a consumer's transaction ends and frees a
    server connection; once all have returned, the pool is ours until we roll back.
    """
    holders: list[psycopg.Connection[Any]] = []
    try:
        for _ in range(POOL_SIZE):
            holder = services.connect(services.pgbouncer.port)
            holders.append(holder)
            holder.execute("BEGIN")
            holder.execute("SELECT 1")  # the transaction now keeps its server connection
    except BaseException:
        for holder in holders:
            holder.close()
        raise
    return holders


def test_d_pool_exhausted_under_load(
    pgbouncer_run: RunFactory, services: PgBouncerFaultServices
) -> None:
    run = pgbouncer_run(
        "pgbouncer-d", f"PgBouncer's pool exhausted by another client for {POOL_HELD:.0f} s"
    )
    consumers = start_consumers(run, "d")
    pool: dict[str, Any] = {}

    def strike() -> Callable[[], None]:
        holders = hold_pool(services)

        def release() -> None:
            pool.update(services.pool())  # as the fault ends: who waited for a server
            for holder in holders:
                holder.close()  # the transactions roll back, the servers return to the pool

        return release

    fault = fault_under_load(run, consumers, POOL_HELD, strike)
    waiting = int(pool.get("cl_waiting") or 0)
    run.check(waiting > 0, "no client waited for a server connection: the pool was not full")
    verify_recovery(
        run,
        consumers,
        fault,
        fault=f"after {FAULT_AFTER} executions, another client took all {POOL_SIZE} server "
        f"connections (open transactions) for {POOL_HELD:.0f} s; query_wait_timeout "
        f"{PGBOUNCER_SETTINGS['query_wait_timeout']} s",
        duplicate_cause="attempts in flight while the pool was held: their leases (3 s) "
        "could not be renewed",
        clients_waiting_in_fault=waiting,
        query_wait_timeout_errors_logged=sum(
            c.output().count("(query_wait_timeout)") for c in consumers
        ),
        recovery_means="from the release of the pool until the next job started",
    )


def test_prepared_statements_through_transaction_pooling(
    services: PgBouncerFaultServices, django_db_blocker: Any
) -> None:
    """Django's defaults prepare nothing; psycopg's own threshold breaks on PgBouncer 1.18.

    Two Django connections take turns, as two consumer threads do, so that one's
    statements land on a server connection the other prepared on. Django sets psycopg's
    ``prepare_threshold`` to None unless OPTIONS gives one; giving one with server-side
    binding makes psycopg PREPARE after 5 executions, which PgBouncer before 1.21 does not
    track per client. If the last case starts to pass, PgBouncer tracks prepared statements
    (1.21+, ``max_prepared_statements``): update docs/howto/pgbouncer.md.
    """
    entry = {
        **services.pgbouncer.settings_dict(),
        "DISABLE_SERVER_SIDE_CURSORS": True,
    }

    def alternate(options: dict[str, Any]) -> str | None:
        handler = ConnectionHandler(
            {alias: {**entry, "OPTIONS": dict(options)} for alias in ("default", "other")}
        )
        try:
            for n in range(12):
                for alias in ("default", "other"):
                    with handler[alias].cursor() as cursor:
                        cursor.execute("SELECT %s::int + 1", [n])
                        assert cursor.fetchone() == (n + 1,)
        except Exception as exc:
            return repr(exc)
        finally:
            for connection in handler.all(initialized_only=True):
                connection.close()
        return None

    with django_db_blocker.unblock():  # connections of our own, not the test database's
        assert alternate({}) is None
        assert alternate({"server_side_binding": True}) is None
        failure = alternate({"server_side_binding": True, "prepare_threshold": 5})
    assert failure is not None and "prepared statement" in failure, failure


def test_session_state_through_transaction_pooling(services: PgBouncerFaultServices) -> None:
    """What a session SET becomes through transaction pooling, on the real PgBouncer.

    ``TimeZone`` is one of the parameters PgBouncer tracks per client and restores on
    whichever server connection the client gets: Django's ``SET TIME ZONE`` (issued when
    the database's time zone is not Django's) keeps working, and so does delayjobs' fast
    reader of UTC timestamps. Any other SET stays on the server connection it ran on: the
    client may lose it, and another client inherit it. delayjobs issues none.
    """

    def connect() -> psycopg.Connection[Any]:
        return services.connect(services.pgbouncer.port)

    query = "SELECT current_setting('TimeZone'), current_setting('lock_timeout')"
    with connect() as setter, connect() as holder, connect() as bystander:
        setter.execute("SET TIME ZONE 'Asia/Tokyo'")
        setter.execute("SET lock_timeout = '7s'")
        # While another client holds a server connection in a transaction, the setter's
        # next statement runs on another one than its SETs did, and the bystander's runs
        # on the one its SETs did (PgBouncer hands out the last used first).
        with holder.transaction():
            holder.execute("SELECT 1")
            moved = setter.execute(query).fetchone()
        inherited = bystander.execute(query).fetchone()
    assert moved is not None and inherited is not None
    assert moved[0] == "Asia/Tokyo", "PgBouncer did not restore the client's TimeZone"
    assert (moved[1], inherited[1]) == ("0", "7s"), (
        f"SET lock_timeout: the setter sees {moved[1]!r}, another client {inherited[1]!r}"
    )
