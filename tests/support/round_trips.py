"""Counting the round trips a piece of code makes to the database and to Redis, from any thread.

Counting, not mocking: the patched methods call the originals, so every query and command
still reaches the real server; they only note what went out, from which thread.

- Database: every statement Django sends through a cursor (``CursorWrapper``, whatever the
  thread and its connection: ``connection.execute_wrapper`` would only see the connections
  that exist when it is installed), savepoints included, as Django sends those as SQL. An
  ``executemany`` is one. Transactions: a COMMIT (or ROLLBACK) of a transaction that is open
  in the driver is one more, and so is its BEGIN where the driver sends it by itself
  (psycopg sends BEGIN before the first statement of a transaction, as a round trip of its
  own); SQLite's BEGIN is a statement Django sends, counted as such. A COPY on psycopg's
  own cursor (delayjobs bulk-writes rows so on PostgreSQL) is one. Not counted: what the
  driver does to open a connection (connect, ``SET TIME ZONE``, Django's ``is_usable``
  checks), which does not pass through Django's cursor: a cost per connection, not per job.
- Redis: a round trip is one write of a request to the server (redis-py's
  ``send_packed_command``): a pipeline of N commands is one round trip of N commands. The
  commands are counted apart (by name, EVALSHA named by its script). Connection set-up
  (HELLO, CLIENT SETINFO, SELECT) and health-check PINGs are real round trips and counted.
  ``commandstats`` reads the server's own count, a cross-check of the commands.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from redis.connection import AbstractConnection

__all__ = ["Figures", "RoundTrip", "RoundTrips", "commandstats", "count_round_trips", "figures"]

DB, REDIS = "db", "redis"


@dataclass(frozen=True)
class RoundTrip:
    kind: str  # DB or REDIS
    thread: str
    shape: str  # the statement's shape, or the request's commands ("EVALSHA pop_due")
    commands: int = 1  # Redis commands in the request (a pipeline's); 1 for a statement


@dataclass
class RoundTrips:
    """What went out while counting, in order."""

    seen: list[RoundTrip] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note(self, trip: RoundTrip) -> None:
        with self._lock:
            self.seen.append(trip)

    def of(self, kind: str, exclude_threads: Iterable[str] = ()) -> list[RoundTrip]:
        excluded = tuple(exclude_threads)
        with self._lock:
            return [t for t in self.seen if t.kind == kind and not t.thread.startswith(excluded)]

    def total(self, exclude_threads: Iterable[str] = ()) -> Counts:
        db = self.of(DB, exclude_threads)
        trips = self.of(REDIS, exclude_threads)
        return Counts(len(db), len(trips), sum(t.commands for t in trips))

    def shapes(self, kind: str, exclude_threads: Iterable[str] = ()) -> Counter[str]:
        return Counter(t.shape for t in self.of(kind, exclude_threads))


@dataclass(frozen=True)
class Counts:
    db: int
    redis: int  # round trips
    cmds: int  # Redis commands

    def __sub__(self, other: Counts) -> Counts:
        return Counts(self.db - other.db, self.redis - other.redis, self.cmds - other.cmds)


@dataclass(frozen=True)
class Figures:
    """Per job and fixed, from runs of n and 2n jobs: per_job = (c(2n) - c(n)) / n."""

    per_job: dict[str, float]
    fixed: dict[str, float]


def figures(single: Counts, double: Counts, n: int) -> Figures:
    per_job, fixed = {}, {}
    for name in ("db", "redis", "cmds"):
        one, two = getattr(single, name), getattr(double, name)
        per_job[name] = round((two - one) / n, 2)
        fixed[name] = round(2 * one - two, 2)  # c(n) - n * per_job
    return Figures(per_job, fixed)


# Shapes ---------------------------------------------------------------------------------

_SPACES = re.compile(r"\s+")
_PLACEHOLDER_LIST = re.compile(r"\((?:\s*(?:%s|\?|%\(\w+\)s|-?\d+(?:\.\d+)?)\s*,?)+\)")
_REPEATED_GROUPS = re.compile(r"(\(\?\))(?:\s*,\s*\(\?\))+")
_NUMBER = re.compile(r"\b\d+\b")
_SAVEPOINT = re.compile(r'"s\d+_x\d+"')  # Django names savepoints s<thread>_x<n>
_CASE = re.compile(r"CASE (\S+) (?:WHEN %s THEN %s ?)+END")


def sql_shape(sql: str) -> str:
    """The statement with its values and value lists folded, so that counts group by kind."""
    shape = _SPACES.sub(" ", sql).strip()
    shape = _CASE.sub(r"CASE \1 WHEN ... END", shape)
    shape = _SAVEPOINT.sub('"s…"', shape)
    shape = _PLACEHOLDER_LIST.sub("(?)", shape)
    shape = _REPEATED_GROUPS.sub(r"\1, ...", shape)
    shape = _NUMBER.sub("N", shape)
    return shape if len(shape) <= 200 else shape[:197] + "..."


def _script_names() -> dict[str, str]:
    """SHA1 -> name of the Lua scripts of delayjobs' Redis store, to name EVALSHA calls."""
    from delayjobs.index import store

    return {
        hashlib.sha1(value.encode()).hexdigest(): name.removesuffix("_LUA").lower()
        for name, value in vars(store).items()
        if name.endswith("_LUA") and isinstance(value, str)
    }


def _command_name(args: tuple[Any, ...], scripts: dict[str, str]) -> str:
    def text(value: Any) -> str:
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

    name = text(args[0]).upper() if args else "?"
    if name in ("SCRIPT", "CLIENT", "CONFIG") and len(args) > 1:
        return f"{name} {text(args[1]).upper()}"
    if name == "EVALSHA" and len(args) > 1:
        return f"EVALSHA {scripts.get(text(args[1]), text(args[1])[:8])}"
    return name


def _request_shape(names: list[str]) -> str:
    if len(names) == 1:
        return names[0]
    counted = Counter(names)
    return "pipeline[" + ", ".join(f"{n} x{c}" if c > 1 else n for n, c in counted.items()) + "]"


# The patches ----------------------------------------------------------------------------


def _driver_in_transaction(raw: Any) -> bool:
    """Whether the driver connection has a transaction open (a COMMIT is a round trip)."""
    in_transaction = getattr(raw, "in_transaction", None)  # sqlite3
    if isinstance(in_transaction, bool):
        return in_transaction
    info = getattr(raw, "info", None)  # psycopg 3: 0 is IDLE
    return info is not None and int(info.transaction_status) != 0


@contextmanager
def count_round_trips() -> Iterator[RoundTrips]:
    """Count every database statement and Redis request of this process while in the block."""
    trips = RoundTrips()
    scripts = _script_names()
    pending = threading.local()  # Redis command names packed, not yet sent, by thread
    originals: list[tuple[type, str, Callable[..., Any]]] = []

    def patch(cls: type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]):
        original = cls.__dict__[name]
        originals.append((cls, name, original))
        setattr(cls, name, make(original))

    def thread() -> str:
        return threading.current_thread().name

    def execute(original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(self: CursorWrapper, sql: str, params: Any, many: bool, executor: Any):
            trips.note(RoundTrip(DB, thread(), sql_shape(str(sql))))
            return original(self, sql, params, many, executor)

        return counted

    def ending(word: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def counted(self: BaseDatabaseWrapper) -> Any:
                if self.connection is not None and _driver_in_transaction(self.connection):
                    if not hasattr(self, "_start_transaction_under_autocommit"):
                        # The driver sent BEGIN by itself (psycopg): not seen as a statement.
                        trips.note(RoundTrip(DB, thread(), "BEGIN (sent by the driver)"))
                    trips.note(RoundTrip(DB, thread(), word))
                return original(self)

            return counted

        return make

    def send_command(original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(self: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
            pending.names = [_command_name(args, scripts)]
            return original(self, *args, **kwargs)

        return counted

    def pack_commands(original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(self: AbstractConnection, commands: Iterable[Any]) -> Any:
            commands = list(commands)
            pending.names = [_command_name(tuple(c), scripts) for c in commands]
            return original(self, commands)

        return counted

    def send_packed(original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(self: AbstractConnection, command: Any, check_health: bool = True) -> Any:
            # Taken before sending: a health check or a connect sends its own, nested.
            names = getattr(pending, "names", None) or ["(packed elsewhere)"]
            pending.names = None
            trips.note(RoundTrip(REDIS, thread(), _request_shape(names), len(names)))
            return original(self, command, check_health)

        return counted

    def copy(original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(self: Any, statement: Any, *args: Any, **kwargs: Any) -> Any:
            trips.note(RoundTrip(DB, thread(), sql_shape(str(statement))))
            return original(self, statement, *args, **kwargs)

        return counted

    patch(CursorWrapper, "_execute_with_wrappers", execute)
    try:
        import psycopg
    except ImportError:  # no PostgreSQL driver: no COPY to count
        pass
    else:
        # delayjobs writes rows with COPY on the driver's own cursor, past Django's.
        patch(psycopg.Cursor, "copy", copy)
    patch(BaseDatabaseWrapper, "_commit", ending("COMMIT"))
    patch(BaseDatabaseWrapper, "_rollback", ending("ROLLBACK"))
    patch(AbstractConnection, "send_command", send_command)
    patch(AbstractConnection, "pack_commands", pack_commands)
    patch(AbstractConnection, "send_packed_command", send_packed)
    try:
        yield trips
    finally:
        for cls, name, original in reversed(originals):
            setattr(cls, name, original)


def commandstats(client: redis.Redis) -> Counter[str]:
    """The server's count of calls per command since its last CONFIG RESETSTAT."""
    stats = client.info("commandstats")
    return Counter(
        {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}
    )
