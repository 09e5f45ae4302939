"""The limited claim: ``scheduled -> running`` for jobs of types with fleet-wide limits,
admitting only what their ``global_concurrency`` and ``rate_limit`` leave room for.

The database decides, in the claim's transaction, so that Redis being down, flushed or
failed over, and consumers on skewed clocks, change nothing (invariant 10 of
docs/explanation/design.md):

- The claims of one limit key are serialized: on PostgreSQL by a transaction-scoped
  advisory lock per key, taken in one order (no deadlock between consumers); on SQLite by
  its single writer (the transaction writes first).
- Slots in use are the key's rows in ``running``: a row leaves it when its outcome is
  recorded, or when its lease expires and the reaper gives it back, so a consumer that
  died frees its slots with no operator action. The slots consumers reserved
  (``delayjobs.transitions.reservations``) count on top of them until they end.
- Starts in the window are ``LimitStart`` rows stamped with the database server's clock
  (read after the locks, so their order is the order of the claims), one per key and
  moment with the number of jobs started then, pruned as the window slides past them
  (reserved starts among them, stamped ahead).
- Candidates of a key are admitted by priority, then ``run_at``, then id, as many as fit;
  the others are left ``scheduled`` and unchanged (held), with what frees them.

Types without limits never come here: their claim is ``claims.claim`` as it always was.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import F, Window
from django.db.models.functions import RowNumber

from delayjobs.core import clock
from delayjobs.core.db import column, int_array, server_bound_cursor, text_array
from delayjobs.jobtypes import limits_of, registry
from delayjobs.limits import Limits
from delayjobs.models import DelayedJob, JobStatus, LimitReservation, LimitStart, jobs_database
from delayjobs.transitions import reservations
from delayjobs.transitions.claims import (
    CLAIM_TOLERANCE,
    NOT_PAUSED_PARAMS,
    Candidate,
    claim,
    not_paused_sql,
    paused_rows,
)
from delayjobs.transitions.reservations import Reservation, Room

#: A start occupies its window this much longer than the window (at most a fifth of it).
#: The start counted is the claim's moment on the database clock; the body begins a
#: hand-off later (the rest of the claim's transaction, its commit, a thread taking the
#: job, the GIL: 10 to 150 ms on a loaded machine). Claims of a key are serialized, so the
#: counted starts are in order; a body that begins at most this much after its counted
#: start can then never share a window of starts with more than the rate's count. A start
#: is not delayed to line bodies up: where the rate has room, a job starts as promptly as
#: any; the guard costs only a rate that binds (20 per 1.15 s for Rate(20, per=1 s)).
RATE_GUARD = timedelta(milliseconds=150)


@dataclass(frozen=True)
class LimitedRow(Candidate):
    """A due job of a type with limits, as the limited claim sees it."""

    limit_key: str
    priority: int
    run_at: datetime


@dataclass(frozen=True)
class Held(LimitedRow):
    """A due job its limit did not admit: left ``scheduled``, unchanged."""

    #: Epoch seconds (database clock) when the rate window frees a start for its key, if
    #: the rate is what holds it; None if it waits for a slot (a running job to end).
    free_at: float | None


@dataclass
class LimitedClaim:
    """What a limited claim won, and what it held."""

    jobs: list[DelayedJob] = field(default_factory=list)
    held: list[Held] = field(default_factory=list)
    #: The database clock the claim decided by (epoch seconds).
    at: float = 0.0
    #: Room reserved for the consumer's next claims, by limit key.
    reserved: dict[str, Reservation] = field(default_factory=dict)


@dataclass(frozen=True)
class _Candidate(LimitedRow):
    expired: bool
    #: Scheduled before its type had limits: the claim writes the key it is counted under.
    keyless: bool


def claim_limited(
    ids: Sequence[int],
    *,
    worker_id: str,
    now: datetime,
    job_types: Sequence[str],
    leases: Mapping[str, timedelta],
    default_lease: timedelta,
    ahead: timedelta = timedelta(0),
    at: float | None = None,
    reserve: int = 0,
    holder: str = "",
) -> LimitedClaim:
    """Claim, among ``ids``, the due rows of limited ``job_types`` their limits admit.

    ``now`` is the claim's token and ``ahead`` how early a job may be claimed, as for
    ``claim``. A job claimed ahead holds its slot from the claim, and its start counts at
    its ``run_at`` (when its thread starts it). ``at`` replaces the database clock (epoch
    seconds) for tests that move time themselves; None reads the server's. ``reserve``:
    reserve that many jobs' room, for ``holder``, in each key claimed whose limits have
    plenty to spare (``delayjobs.transitions.reservations``).
    """
    limits = {name: lim for name in job_types if (lim := limits_by_type(name)) is not None}
    if not ids or not limits:
        return LimitedClaim()
    database = jobs_database()
    with transaction.atomic(using=database):
        connection = connections[database]
        postgresql = connection.vendor == "postgresql"
        cutoff = now + ahead + CLAIM_TOLERANCE
        if postgresql:
            # The rows, their keys' locks, then the clock: one statement.
            candidates, moment = _locked_candidates(ids, cutoff, limits, database)
        else:
            # SQLite: write first, so that this transaction holds the database's write lock
            # from here on (claims of every key serialized), never upgrading a read lock.
            _touch_starts(database)
            candidates = _candidates(ids, cutoff, limits, database)
            moment = _database_epoch(database)
        if not candidates:
            return LimitedClaim()
        if at is not None:
            moment = at
        result = LimitedClaim(at=moment)
        admitted, room = _admit(candidates, limits, moment, database, result)
        if not admitted:
            return result
        _store_missing_keys(admitted, database)
        jobs = claim(
            [c.pk for c, _start in admitted],
            worker_id=worker_id,
            now=now,
            job_types=list(limits),
            leases=leases,
            default_lease=default_lease,
            ahead=ahead,
        )
        starts = {c.pk: start for c, start in admitted}
        for job in jobs:
            start = starts[job.pk]
            job.limit_wait = timedelta(seconds=max(0.0, start - job.run_at.timestamp()))
        won = {job.pk for job in jobs}
        _record_starts(
            [(c, start) for c, start in admitted if c.pk in won and not c.expired], limits, database
        )
        result.jobs = jobs
        if reserve > 0 and room:
            result.reserved = reservations.reserve(
                room,
                want=reserve,
                moment=moment,
                ahead=ahead,
                holder=holder,
                worker_id=worker_id,
                database=database,
            )
        return result


def limits_by_type(job_type: str) -> Limits | None:
    """The limits of a registered type (None if unknown or unlimited)."""
    if job_type not in registry:
        return None
    return limits_of(registry.get(job_type))


def _candidates(
    ids: Sequence[int], cutoff: datetime, limits: Mapping[str, Limits], database: str
) -> list[_Candidate]:
    """The due, claimable rows among ``ids``, by priority, then ``run_at``, then id (the
    portable query: SQLite, whose claims the database's single writer serializes)."""
    rows = (
        DelayedJob.objects.using(database)
        .filter(
            pk__in=list(ids),
            status=JobStatus.SCHEDULED,
            run_at__lte=cutoff,
            job_type__in=list(limits),
        )
        .exclude(paused_rows())
        .order_by("-priority", "run_at", "pk")
    )
    return _as_candidates(rows.values_list(*_CANDIDATE_FIELDS), limits)


def _locked_candidates(
    ids: Sequence[int], cutoff: datetime, limits: Mapping[str, Limits], database: str
) -> tuple[list[_Candidate], float]:
    """PostgreSQL: lock the rows among ``ids`` no other transaction holds, keep the
    claimable ones, take their keys' advisory locks, then read the clock; in one
    statement compiled once. The candidates as ``_candidates``, and the clock (epoch s).

    The keys' locks are taken in the order of their hashes (two keys with one hash share a
    lock, which only serializes them more), so two consumers never wait for each other in
    a cycle; rows are never waited for (SKIP LOCKED). The clock is projected after the
    aggregate took every lock: a later claim of a key reads a later time. What the claim
    counts is read by the next statement, whose snapshot follows the locks (this one's
    precedes them).
    """
    types = sorted(limits)
    params: list[Any] = [
        # A row scheduled before its type had limits counts against the whole type.
        text_array(limits[name].stored_key(None) for name in types),
        text_array(types),
        int_array(ids),
        JobStatus.SCHEDULED,
        cutoff,
        text_array(types),
        *NOT_PAUSED_PARAMS,
    ]
    with server_bound_cursor(connections[database]) as cursor:
        cursor.execute(_locked_candidates_statement(database), params)
        rows = cursor.fetchall()
    if not rows:
        return [], 0.0
    return _as_candidates((row[:-1] for row in rows), limits), float(rows[0][-1])


@functools.cache
def _locked_candidates_statement(database: str) -> str:
    """As the plain claim's (``claims._skip_locked_statement``): every condition but the
    primary key is checked on the locked copy of the row, so the table is reached by
    primary key only, never through an index of due rows that a backlog fills."""
    quote = connections[database].ops.quote_name
    table = quote(DelayedJob._meta.db_table)
    c = {name: quote(column(DelayedJob, name)) for name in _CANDIDATE_FIELDS if name != "pk"}
    c["pk"] = quote(DelayedJob._meta.pk.column)
    c["status"] = quote(column(DelayedJob, "status"))
    selected = ", ".join(c[name] for name in _CANDIDATE_FIELDS)
    return f"""
        WITH locked AS MATERIALIZED (
            SELECT {selected}, {c["status"]}, COALESCE(
                {c["limit_key"]}, (%s::text[])[array_position(%s::text[], {c["job_type"]})]
            ) AS counted_key
            FROM {table} WHERE {c["pk"]} = ANY(%s::bigint[]) FOR UPDATE SKIP LOCKED
        ), due AS MATERIALIZED (
            SELECT * FROM locked
            WHERE {c["status"]} = %s
                AND {c["run_at"]} <= %s
                AND {c["job_type"]} = ANY(%s::text[])
                AND {not_paused_sql(database, c["queue"], c["job_type"])}
        ), key_locks AS MATERIALIZED (
            SELECT count(pg_advisory_xact_lock(h)) AS taken FROM (
                SELECT DISTINCT hashtext(counted_key) AS h FROM due ORDER BY h
            ) AS hashes
        )
        SELECT {selected}, extract(epoch FROM clock_timestamp())::float8
        FROM due, key_locks
        ORDER BY {c["priority"]} DESC, {c["run_at"]}, {c["pk"]}
    """


_CANDIDATE_FIELDS = ("pk", "queue", "job_type", "limit_key", "priority", "run_at", "max_lateness")


def _as_candidates(rows: Iterable[Sequence[Any]], limits: Mapping[str, Limits]) -> list[_Candidate]:
    """``_CANDIDATE_FIELDS`` rows as candidates: their counted key, and whether they are
    past their ``max_lateness`` already."""
    now = clock.now()
    candidates = []
    for pk, queue, job_type, limit_key, priority, run_at, max_lateness in rows:
        jobtype = registry.get(job_type)
        lateness = max_lateness if max_lateness is not None else jobtype.max_lateness
        candidates.append(
            _Candidate(
                pk,
                queue,
                job_type,
                # A row scheduled before its type had limits counts against the whole type.
                limit_key or limits[job_type].stored_key(None),
                priority,
                run_at,
                lateness is not None and now - run_at > lateness,
                limit_key is None,
            )
        )
    return candidates


def _database_epoch(database: str) -> float:
    """The database server's clock, as epoch seconds (SQLite: its own, to the ms)."""
    sql = (
        "SELECT extract(epoch FROM clock_timestamp())::float8"
        if connections[database].vendor == "postgresql"
        else "SELECT (julianday('now') - 2440587.5) * 86400.0"
    )
    with connections[database].cursor() as cursor:
        cursor.execute(sql)
        return float(cursor.fetchone()[0])


def _touch_starts(database: str) -> None:
    table = connections[database].ops.quote_name(LimitStart._meta.db_table)
    with connections[database].cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE 1 = 0")


def _admit(
    candidates: list[_Candidate],
    limits: Mapping[str, Limits],
    moment: float,
    database: str,
    result: LimitedClaim,
) -> tuple[list[tuple[_Candidate, float]], dict[str, Room]]:
    """Which candidates fit, with the start each counts at; the others go to ``held``.
    And the room each key's limits leave after them, for keys none of whose jobs was
    held (the others have none to reserve)."""
    by_key: dict[str, list[_Candidate]] = defaultdict(list)
    for candidate in candidates:
        by_key[candidate.limit_key].append(candidate)
    limits_of_key = {key: limits[group[0].job_type] for key, group in by_key.items()}
    # The new starts count from ``moment``: any start after that less one window (and its
    # guard) shares a window with them.
    since = {
        key: moment - _window(lim) for key, lim in limits_of_key.items() if lim.rate is not None
    }
    running, windows = usage(list(by_key), since, moment, database)
    admitted: list[tuple[_Candidate, float]] = []
    room: dict[str, Room] = {}
    for key, group in by_key.items():
        lim = limits_of_key[key]
        slots = (
            lim.global_concurrency - running.get(key, 0)
            if lim.global_concurrency is not None
            else len(group)
        )
        starts = windows.get(key, [])
        tokens = lim.rate.count - sum(n for _s, n in starts) if lim.rate is not None else len(group)
        held_before = len(result.held)
        for candidate in group:  # by priority, then run_at (the query's order)
            start = max(moment, candidate.run_at.timestamp())
            if candidate.expired and slots > 0:
                # Past its max_lateness: claimed only to be recorded expired; it takes a
                # slot until then, but no start, as it never runs.
                admitted.append((candidate, start))
                slots -= 1
            elif slots > 0 and tokens > 0:
                admitted.append((candidate, start))
                slots -= 1
                tokens -= 1
            else:
                free_at = None
                if slots > 0 and lim.rate is not None:
                    # The rate holds it: a start frees when enough leave the window.
                    free_at = _frees_at(starts, 1 - tokens, moment) + _window(lim)
                result.held.append(
                    Held(
                        candidate.pk,
                        candidate.queue,
                        candidate.job_type,
                        key,
                        candidate.priority,
                        candidate.run_at,
                        free_at,
                    )
                )
        if len(result.held) == held_before:
            room[key] = Room(
                lim,
                slots if lim.global_concurrency is not None else None,
                tokens if lim.rate is not None else None,
            )
    return admitted, room


def _frees_at(starts: list[tuple[float, int]], leaving: int, moment: float) -> float:
    """When ``leaving`` of a key's starts (oldest first, with their counts) have started:
    the window has room once they leave it. Starts admitted by this claim count from
    ``moment`` (or later), after every one of ``starts``."""
    left = 0
    for started, count in starts:
        left += count
        if left >= leaving:
            return started
    return moment


def _window(limits: Limits) -> float:
    """How long a start counts against its key's rate: its window, and the guard."""
    per = limits.rate.per if limits.rate is not None else timedelta(0)
    return (per + min(RATE_GUARD, per / 5)).total_seconds()


def usage(
    keys: Sequence[str], since: Mapping[str, float], moment: float, database: str
) -> tuple[dict[str, int], dict[str, list[tuple[float, int]]]]:
    """What the ``keys`` use, in one statement: their running rows and the slots reserved
    for after ``moment`` (slots in use), and the starts after ``since[key]`` of those with
    a rate, oldest first (moment, how many). Read after the keys' locks: a statement of
    its own, so that it sees what the claims before ours committed."""
    connection = connections[database]
    quote = connection.ops.quote_name
    jobs = quote(DelayedJob._meta.db_table)
    starts_table = quote(LimitStart._meta.db_table)
    key = quote(column(DelayedJob, "limit_key"))
    status = quote(column(DelayedJob, "status"))
    start_key = quote(column(LimitStart, "limit_key"))
    started = quote(column(LimitStart, "started"))
    count = quote(column(LimitStart, "count"))
    reservations_table = quote(LimitReservation._meta.db_table)
    reserved_key = quote(column(LimitReservation, "limit_key"))
    slots = quote(column(LimitReservation, "slots"))
    until = quote(column(LimitReservation, "until"))
    postgresql = connection.vendor == "postgresql"
    in_keys, key_params = _in_list(keys, postgresql)
    # Each row: the key, whether it is a start (0: slots in use, running or reserved), its
    # moment (a start's), how many.
    sql = (
        f"SELECT {key}, 0, 0.0, count(*) FROM {jobs}"
        f" WHERE {status} = %s AND {key} {in_keys} GROUP BY {key}"
        f" UNION ALL SELECT {reserved_key}, 0, 0.0, sum({slots}) FROM {reservations_table}"
        f" WHERE {reserved_key} {in_keys} AND {until} > %s GROUP BY {reserved_key}"
    )
    params: list[Any] = [JobStatus.RUNNING, *key_params, *key_params, moment]
    if since:
        in_rated, rated_params = _in_list(sorted(since), postgresql)
        sql += (
            f" UNION ALL SELECT {start_key}, 1, {started}, {count} FROM {starts_table}"
            f" WHERE {start_key} {in_rated} AND {started} > %s"
        )
        params += [*rated_params, min(since.values())]
    running: dict[str, int] = {}
    windows: dict[str, list[tuple[float, int]]] = defaultdict(list)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for row_key, is_start, moment, n in cursor.fetchall():
            if not is_start:
                running[row_key] = running.get(row_key, 0) + int(n)
            elif moment > since[row_key]:  # one query for every key: the earliest window's
                windows[row_key].append((moment, n))
    for starts in windows.values():
        starts.sort()
    return running, dict(windows)


def _in_list(values: Sequence[str], postgresql: bool) -> tuple[str, list[Any]]:
    """``= ANY(array)`` on PostgreSQL (one parameter, whatever the count), ``IN (...)``
    elsewhere."""
    if postgresql:
        return "= ANY(%s::text[])", [text_array(values)]
    return f"IN ({', '.join(['%s'] * len(values))})", list(values)


def _store_missing_keys(admitted: list[tuple[_Candidate, float]], database: str) -> None:
    """Rows scheduled before their type had limits get the key they are counted under, so
    that they count while they run."""
    by_key: dict[str, list[int]] = defaultdict(list)
    for candidate, _start in admitted:
        if candidate.keyless:
            by_key[candidate.limit_key].append(candidate.pk)
    for key, pks in by_key.items():
        DelayedJob.objects.using(database).filter(pk__in=pks, limit_key__isnull=True).update(
            limit_key=key
        )


def _record_starts(
    admitted: list[tuple[_Candidate, float]], limits: Mapping[str, Limits], database: str
) -> None:
    """Write the starts of rate-limited keys: one row per key and moment. (Those the
    window has left are pruned by the pre-loader's passes, ``prune_limit_rows``: the window's
    query reads past them.)"""
    rated = [(c, start) for c, start in admitted if limits[c.job_type].rate is not None]
    if not rated:
        return
    # Jobs due by the claim all start at its moment; a job claimed ahead at its run_at.
    counts = Counter((c.limit_key, start) for c, start in rated)
    LimitStart.objects.using(database).bulk_create(
        [LimitStart(limit_key=key, started=start, count=n) for (key, start), n in counts.items()]
    )


def due_limited_ids(
    *, queues: Sequence[str], job_types: Sequence[str], limit: int, now: datetime
) -> list[int]:
    """Due rows of limited types, for a claim straight from the database (Redis down):
    the first of each key before the second of any, so that a key at its limit, however
    many jobs it has waiting, never hides the other keys' jobs."""
    if limit <= 0 or not queues or not job_types:
        return []
    rank = Window(
        RowNumber(),
        partition_by=[F("limit_key")],
        order_by=[F("priority").desc(), F("run_at").asc(), F("id").asc()],
    )
    due = (
        DelayedJob.objects.filter(
            status=JobStatus.SCHEDULED, run_at__lte=now, queue__in=queues, job_type__in=job_types
        )
        .annotate(rank=rank)
        .filter(rank__lte=limit)
        .order_by("rank", "run_at", "id")
    )
    return list(due.values_list("pk", flat=True)[:limit])


def prune_limit_rows() -> int:
    """Drop the starts every rate window has left and the reservations that ended, by the
    database's clock; run by each pre-loader pass (the limited claim reads past both).
    How many rows were dropped."""
    limits = [lim for jt in registry if (lim := limits_of(jt)) is not None]
    if not limits:
        # No statement for a project without limits (rows a removed limit left are a
        # few, and pruned once a limit is declared again).
        return 0
    database = jobs_database()
    horizon = _database_epoch(database)
    deleted = reservations.prune_reservations(horizon, database)
    windows = [_window(lim) for lim in limits if lim.rate is not None]
    if windows:
        old = LimitStart.objects.using(database).filter(started__lte=horizon - max(windows))
        deleted += old.delete()[0]
    return deleted
