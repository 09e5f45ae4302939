"""The work a benchmark job does after recording its start, chosen by name, the same in
every system.

Every system's benchmark job calls :func:`job`: :func:`benchmarks.records.record` first
(so that the start, and lateness, mean what they meant before bodies existed), then the
body, then :func:`benchmarks.records.record_end` (a start without an end is a body that
failed: the workloads count them; ``noop`` writes no end, so that it stays exactly the job
of the reports from before bodies existed). The body is the one named by ``DELAYJOBS_BENCH_BODY``
(read once per process; the driver sets it and every consumer process inherits it):

- ``noop``: nothing more;
- ``redis``: one ``RPUSH`` of the job id, on this module's own redis-py client (one per
  process, so a connection of its pool per busy thread), never the system's own;
- ``orm``: one ``UPDATE ... SET n = n + 1`` of a row of :class:`benchmarks.models.Counter`
  through the Django ORM in its own transaction, on the ``body`` database alias (the same
  database, persistent connections: no system pays a connect per job);
- ``http``: one ``GET /`` to the local server of :mod:`benchmarks.http_server`, on a
  keep-alive connection per thread;
- ``sleep10``: ``time.sleep(0.010)``.

Standard library only at import: the peers' worker processes import this module, and the
clients above are created lazily in whatever process (and thread) runs the first job, again
after a fork (Celery prefork children, RQ work horses).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from benchmarks.environment import BODY_ENV, HTTP_ADDRESS_ENV, REDIS_URL_ENV
from benchmarks.records import record, record_end

BODIES = ("noop", "redis", "orm", "http", "sleep10")
DEFAULT = "noop"
REDIS_KEY = "delayjobs-bench:body"
#: Rows of the counter table: jobs spread over them (pk = job_id % COUNTER_ROWS + 1), so
#: that concurrent jobs rarely wait for each other's row lock.
COUNTER_ROWS = 1000
#: The database alias of the ``orm`` body (benchmarks.settings): the same database as
#: ``default``, with persistent connections.
DATABASE_ALIAS = "body"
SETTINGS_MODULE = "benchmarks.settings"

Body = Callable[[int], None]

_body: Body | None = None
_lock = threading.Lock()


def job(job_id: int, run_at: float) -> None:
    """What every system's benchmark job does: record its start, the body, its end."""
    record(job_id, run_at)
    body = _body or _load()
    if body is not _nothing:
        body(job_id)
        record_end(job_id)


def records_ends() -> bool:
    """Whether the selected body's jobs write end records (all but ``noop``)."""
    return selected() != "noop"


def run(job_id: int) -> None:
    """The selected body for the job ``job_id`` (any int: ping jobs are negative)."""
    body = _body or _load()
    body(job_id)


def selected() -> str:
    """The body named in the environment; ValueError for a name that is none."""
    name = os.environ.get(BODY_ENV) or DEFAULT
    if name not in BODIES:
        raise ValueError(f"{BODY_ENV}={name!r}: not a benchmark body ({', '.join(BODIES)})")
    return name


def _load() -> Body:
    global _body
    with _lock:
        if _body is None:
            _body = _MAKERS[selected()]()
    return _body


# The bodies -----------------------------------------------------------------------------


def _nothing(job_id: int) -> None:
    return None


def _noop() -> Body:
    return _nothing


def _sleep10() -> Body:
    def sleep10(job_id: int) -> None:
        time.sleep(0.010)

    return sleep10


def _redis() -> Body:
    import redis

    clients: dict[int, redis.Redis] = {}  # by pid: a forked child makes its own

    def client() -> redis.Redis:
        pid = os.getpid()
        found = clients.get(pid)
        if found is None:
            found = clients.setdefault(pid, redis.Redis.from_url(os.environ[REDIS_URL_ENV]))
        return found

    def rpush(job_id: int) -> None:
        client().rpush(REDIS_KEY, job_id)

    return rpush


def _orm() -> Body:
    setup_django()
    from django.db import transaction
    from django.db.models import F

    from benchmarks.models import Counter

    counters = Counter.objects.using(DATABASE_ALIAS)

    def update(job_id: int) -> None:
        with transaction.atomic(using=DATABASE_ALIAS):
            counters.filter(pk=job_id % COUNTER_ROWS + 1).update(n=F("n") + 1)

    return update


def _http() -> Body:
    host, _, port = os.environ[HTTP_ADDRESS_ENV].rpartition(":")
    local = threading.local()

    def connection() -> http.client.HTTPConnection:
        found: http.client.HTTPConnection | None = getattr(local, "connection", None)
        if found is None or local.pid != os.getpid():
            found = http.client.HTTPConnection(host, int(port), timeout=30)
            local.connection, local.pid = found, os.getpid()
        return found

    def get(job_id: int) -> None:
        try:
            _get(connection())
        except (http.client.HTTPException, ConnectionError):
            # A keep-alive connection the server closed: once more, on a new one.
            local.connection.close()
            _get(local.connection)

    return get


def _get(connection: http.client.HTTPConnection) -> None:
    connection.request("GET", "/")
    response = connection.getresponse()
    response.read()
    if response.status != 200:
        raise RuntimeError(f"benchmark HTTP server answered {response.status}")


_MAKERS: dict[str, Callable[[], Body]] = {
    "noop": _noop,
    "redis": _redis,
    "orm": _orm,
    "http": _http,
    "sleep10": _sleep10,
}


# Set-up ---------------------------------------------------------------------------------


def setup_django() -> None:
    """Django from benchmarks.settings, in a peer's worker process that has not set it up
    (a delayjobs consumer or a Celery worker with its Django fix-up already has)."""
    from django.apps import apps

    if not apps.ready:
        import django

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS_MODULE)
        django.setup()


def seed_counters() -> None:
    """The driver, after migrating: the counter rows the ``orm`` body updates, at zero."""
    from benchmarks.models import Counter

    Counter.objects.all().delete()
    Counter.objects.bulk_create(Counter(id=pk, n=0) for pk in range(1, COUNTER_ROWS + 1))


# The driver's side ----------------------------------------------------------------------

DESCRIBE = {
    "noop": "nothing after recording the start (one `os.write`)",
    "redis": "one Redis `RPUSH` on a connection of its own",
    "orm": "one `UPDATE` through the Django ORM in its own transaction",
    "http": "one `GET` to a local HTTP server, keep-alive connection per thread",
    "sleep10": "`time.sleep(0.010)`",
}
#: The ``--body`` option's help, the same in the suite, core and the soak.
HELP = "; ".join(f"{name}: {text}" for name, text in DESCRIBE.items()) + f" (default {DEFAULT})"


@contextlib.contextmanager
def prepared(names: Sequence[str]) -> Iterator[None]:
    """What the bodies ``names`` need before any consumer starts (Django set up and
    migrated): the counter rows, and the HTTP server while the block runs."""
    from benchmarks import http_server

    seed_counters()
    with http_server.running() if "http" in names else contextlib.nullcontext():
        yield


def select(name: str) -> None:
    """Make ``name`` the body of every consumer started from now on (they inherit it)."""
    if name not in BODIES:
        raise ValueError(f"not a benchmark body: {name!r}")
    os.environ[BODY_ENV] = name
