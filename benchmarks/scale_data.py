"""A large job table for the scale benchmarks (W5/W6 and the admin at scale).

``fill()`` writes, into the PostgreSQL database Django is configured for, with COPY:

- ``finished`` rows spread over the last ``FINISHED_DAYS`` days, ids in time order, a
  realistic mix: ~93% succeeded, 5% failed, 1.5% cancelled, 0.3% skipped, 0.2% expired;
  six job types on three queues; a business key on one row in ten;
- ``scheduled`` rows due from now on, evenly, ``WINDOW_ROWS`` per ``PRELOAD_WINDOW``
  (1 M rows: ~1,000 in any 60 s window, over ~17 hours), a key on one in ten;
- the attempt history (``JobAttempt``) of every job that finished in the last
  ``history_days`` days: one attempt each, three for a failed job (two "will retry"),
  none for a cancelled one. Those are the jobs the admin's first pages show.

The table's secondary indexes are dropped before the COPY and built again after it (far
faster than maintaining them row by row), then ``VACUUM ANALYZE``: the planner sees the
table as a production table that autovacuum keeps analysed. Use it on a benchmark
database only: an error half way leaves the table without its indexes.

Usage, from the repository root::

    python -m benchmarks.scale_data --finished 100000 --scheduled 100000
    python -m benchmarks.scale_data --serve /tmp/scale-db.json   # 10 M + 1 M, kept running

``--serve`` keeps PostgreSQL and Redis running after the fill and writes their addresses
(``DELAYJOBS_BENCH_DATABASE``/``..._REDIS_URL`` values) to the file, until SIGTERM or
SIGINT; other benchmarks then run against it with ``--existing`` (those variables set).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks import harness

FINISHED_DAYS = 90
#: Scheduled rows due in one pre-loader window (PRELOAD_WINDOW, 60 s by default).
WINDOW_ROWS = 1000
#: One row in KEY_EVERY has a business key.
KEY_EVERY = 10
#: Rows per COPY chunk handed to psycopg.
CHUNK_ROWS = 20_000
JOB_TYPES = (
    ("orders.send_confirmation", "emails"),
    ("orders.expire_unpaid", "default"),
    ("billing.charge_renewal", "billing"),
    ("billing.send_invoice", "emails"),
    ("accounts.purge_inactive", "default"),
    ("reports.nightly_export", "default"),
)
#: Per mille of finished rows in each status, in order (the rest: succeeded).
FINISHED_MIX = (("failed", 50), ("cancelled", 15), ("skipped", 3), ("expired", 2))
ERROR = "ConnectionError: payment provider timed out after 30 s"
TRACEBACK = 'Traceback (most recent call last):\\n  File "billing.py", line 42\\nConnectionError'
WORKER = "bench-host-1:4242"
JOB_COLUMNS = (
    "id, job_type, queue, payload, run_at, status, attempts, max_attempts, priority, key, "
    "worker_id, last_error, created_at, claimed_at, started_at, finished_at, trace_id"
)
ATTEMPT_COLUMNS = (
    "job_id, number, worker_id, started_at, finished_at, outcome, error, traceback, lateness"
)


@dataclass(frozen=True)
class FillReport:
    finished: int
    scheduled: int
    attempts: int
    first_id: int
    #: First id of the scheduled rows (finished rows are first_id .. scheduled_from - 1).
    scheduled_from: int
    now: str
    copy_seconds: float
    index_seconds: float
    vacuum_seconds: float
    total_seconds: float
    table_mb: float


def _status(index: int) -> str:
    # A cheap, well-spread hash of the row number (Knuth's multiplicative constant).
    bucket = (index * 2654435761) % 1000
    for status, per_mille in FINISHED_MIX:
        if bucket < per_mille:
            return status
        bucket -= per_mille
    return "succeeded"


class _Clock:
    """Microseconds since the epoch as PostgreSQL timestamptz text, the second cached: the
    rows' moments are nearly monotonic, and datetime formatting is the generator's cost."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def text(self, micros: int) -> str:
        second, micro = divmod(micros, 1_000_000)
        if second != self._second:
            self._second = second
            self._prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%d %H:%M:%S")
        return f"{self._prefix}.{micro:06d}+00"


def _finished_lines(first_id: int, count: int, now_us: int) -> Iterator[str]:
    clock = _Clock()
    end = now_us - 600 * 1_000_000  # the newest finished ten minutes ago
    step = FINISHED_DAYS * 86_400 * 1_000_000 // max(count, 1)
    start = end - step * count
    for index in range(count):
        pk = first_id + index
        job_type, queue = JOB_TYPES[pk % len(JOB_TYPES)]
        status = _status(index)
        created = start + index * step
        run_at = created + (pk % 60) * 1_000_000
        key = f"order-{pk}" if pk % KEY_EVERY == 0 else r"\N"
        if status == "cancelled":
            attempts, claimed, started, finished, error = 0, r"\N", r"\N", run_at - 1000, ""
        else:
            late = 1000 + pk % 4000  # 1-5 ms
            attempts = 3 if status == "failed" else 1
            claimed = clock.text(run_at - 20_000)
            started = clock.text(run_at + late)
            finished = run_at + late + 5000 + pk % 200_000
            error = ERROR if status == "failed" else ""
        yield (
            f'{pk}\t{job_type}\t{queue}\t{{"order_id": {pk}}}\t{clock.text(run_at)}\t'
            f"{status}\t{attempts}\t3\t0\t{key}\t{WORKER}\t{error}\t{clock.text(created)}\t"
            f"{claimed}\t{started}\t{clock.text(finished)}\t{pk:032x}\n"
        )


def _scheduled_lines(first_id: int, count: int, now_us: int, window: timedelta) -> Iterator[str]:
    clock = _Clock()
    step = int(window.total_seconds() * 1_000_000) // WINDOW_ROWS
    for index in range(count):
        pk = first_id + index
        job_type, queue = JOB_TYPES[pk % len(JOB_TYPES)]
        key = f"order-{pk}" if pk % KEY_EVERY == 0 else r"\N"
        run_at = now_us + index * step
        yield (
            f'{pk}\t{job_type}\t{queue}\t{{"order_id": {pk}}}\t{clock.text(run_at)}\t'
            f"scheduled\t0\t3\t0\t{key}\t\t\t{clock.text(now_us - 3_600_000_000)}\t"
            f"\\N\t\\N\t\\N\t{pk:032x}\n"
        )


def _attempt_lines(first_id: int, count: int, since_us: int, now_us: int) -> Iterator[str]:
    """The attempts of the finished rows whose run_at is after ``since_us`` (same formula
    as ``_finished_lines``, so no read back)."""
    clock = _Clock()
    end = now_us - 600 * 1_000_000
    step = FINISHED_DAYS * 86_400 * 1_000_000 // max(count, 1)
    start = end - step * count
    first_index = max(0, (since_us - start) // step)
    for index in range(first_index, count):
        status = _status(index)
        if status == "cancelled":
            continue
        pk = first_id + index
        run_at = start + index * step + (pk % 60) * 1_000_000
        late = 1000 + pk % 4000
        started = run_at + late
        finished = clock.text(started + 5000 + pk % 200_000)
        lateness = f"{late / 1_000_000:.6f} seconds"
        if status == "failed":
            for number in (1, 2):
                yield (
                    f"{pk}\t{number}\t{WORKER}\t{clock.text(started)}\t{finished}\tretrying\t"
                    f"{ERROR}\t{TRACEBACK}\t{lateness}\n"
                )
            yield (
                f"{pk}\t3\t{WORKER}\t{clock.text(started)}\t{finished}\tfailed\t{ERROR}\t"
                f"{TRACEBACK}\t{lateness}\n"
            )
        else:
            yield (
                f"{pk}\t1\t{WORKER}\t{clock.text(started)}\t{finished}\t{status}\t\t\t{lateness}\n"
            )


def _copy(cursor: Any, table: str, columns: str, lines: Iterator[str]) -> int:
    written = 0
    with cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        chunk: list[str] = []
        for line in lines:
            chunk.append(line)
            if len(chunk) >= CHUNK_ROWS:
                copy.write("".join(chunk))
                written += len(chunk)
                chunk = []
        if chunk:
            copy.write("".join(chunk))
            written += len(chunk)
    return written


def _secondary_indexes(cursor: Any, table: str) -> list[tuple[str, str]]:
    """(name, CREATE statement) of the table's indexes that back no constraint."""
    cursor.execute(
        """
        SELECT i.relname, pg_get_indexdef(i.oid)
        FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
        WHERE x.indrelid = %s::regclass
          AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.oid)
        """,
        [table],
    )
    return list(cursor.fetchall())


def fill(
    finished: int = 10_000_000,
    scheduled: int = 1_000_000,
    *,
    history_days: float = 3,
    now: datetime | None = None,
    log: Callable[[str], None] = print,
) -> FillReport:
    """Add the rows to the database Django is configured for (PostgreSQL), then VACUUM
    ANALYZE. Returns what was written and how long each phase took."""
    from django.db import connections

    from delayjobs.conf import settings
    from delayjobs.models import DelayedJob, JobAttempt
    from delayjobs.models.jobs import jobs_database

    connection = connections[jobs_database()]
    if connection.vendor != "postgresql":
        raise RuntimeError("scale_data fills PostgreSQL only (COPY)")
    jobs, attempts = DelayedJob._meta.db_table, JobAttempt._meta.db_table
    moment = now or datetime.now(UTC)
    now_us = int(moment.timestamp() * 1_000_000)
    began = time.perf_counter()
    connection.ensure_connection()
    with connection.cursor() as cursor:
        raw = cursor.cursor  # psycopg's own cursor: Django's wrapper has no copy()
        raw.execute("SET maintenance_work_mem = '512MB'")
        raw.execute(f"SELECT COALESCE(MAX(id), 0) + 1 FROM {jobs}")
        first_id = raw.fetchone()[0]
        dropped = _secondary_indexes(raw, jobs) + _secondary_indexes(raw, attempts)
        for name, _definition in dropped:
            raw.execute(f'DROP INDEX "{name}"')
        log(f"dropped {len(dropped)} indexes; COPY {finished:,} finished rows")
        _copy(raw, jobs, JOB_COLUMNS, _finished_lines(first_id, finished, now_us))
        log(f"COPY {scheduled:,} scheduled rows")
        scheduled_from = first_id + finished
        window = settings.PRELOAD_WINDOW
        _copy(raw, jobs, JOB_COLUMNS, _scheduled_lines(scheduled_from, scheduled, now_us, window))
        since_us = now_us - int(history_days * 86_400 * 1_000_000)
        log(f"COPY attempts of the last {history_days:g} days")
        written_attempts = _copy(
            raw, attempts, ATTEMPT_COLUMNS, _attempt_lines(first_id, finished, since_us, now_us)
        )
        raw.execute(
            f"SELECT setval(pg_get_serial_sequence('{jobs}', 'id'), (SELECT MAX(id) FROM {jobs}))"
        )
        copied = time.perf_counter()
        log(f"COPY done in {copied - began:.1f} s; building {len(dropped)} indexes")
        for _name, definition in dropped:
            raw.execute(definition)
        indexed = time.perf_counter()
        log(f"indexes built in {indexed - copied:.1f} s; VACUUM ANALYZE")
        raw.execute(f"VACUUM ANALYZE {jobs}")
        raw.execute(f"VACUUM ANALYZE {attempts}")
        vacuumed = time.perf_counter()
        raw.execute(f"SELECT pg_total_relation_size('{jobs}') / 1048576.0")
        table_mb = float(raw.fetchone()[0])
    return FillReport(
        finished=finished,
        scheduled=scheduled,
        attempts=written_attempts,
        first_id=first_id,
        scheduled_from=scheduled_from,
        now=moment.isoformat(),
        copy_seconds=round(copied - began, 1),
        index_seconds=round(indexed - copied, 1),
        vacuum_seconds=round(vacuumed - indexed, 1),
        total_seconds=round(vacuumed - began, 1),
        table_mb=round(table_mb, 1),
    )


def _serve_until_stopped(path: str, postgres: Any, redis_server: Any) -> None:
    info = {
        harness.DATABASE_ENV: os.environ[harness.DATABASE_ENV],
        harness.REDIS_URL_ENV: os.environ[harness.REDIS_URL_ENV],
        "postgres_pid": postgres.pid,
        "redis_pid": redis_server.pid,
        "data_dir": str(postgres.data_dir),
        "pid": os.getpid(),
    }
    with open(path, "w") as out:
        json.dump(info, out, indent=2)
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_args: stop.set())
    print(f"serving; stop with: kill {os.getpid()}", flush=True)
    stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=10_000_000)
    parser.add_argument("--scheduled", type=int, default=1_000_000)
    parser.add_argument("--history-days", type=float, default=3)
    parser.add_argument("--durable", action="store_true", help="fsync on commit (slower)")
    parser.add_argument(
        "--existing", action="store_true", help="fill the database of DELAYJOBS_BENCH_DATABASE"
    )
    parser.add_argument("--serve", metavar="FILE", help="keep the servers running afterwards")
    args = parser.parse_args()

    def run() -> None:
        harness.setup_django()
        report = fill(
            args.finished,
            args.scheduled,
            history_days=args.history_days,
            log=lambda text: print(text, flush=True),
        )
        print(json.dumps(asdict(report), indent=2), flush=True)
        print(f"generation took {report.total_seconds:.1f} s", flush=True)

    if args.existing:
        run()
        return
    with harness.services(durable=args.durable) as (postgres, redis_server):
        run()
        if args.serve:
            _serve_until_stopped(args.serve, postgres, redis_server)


if __name__ == "__main__":
    main()
