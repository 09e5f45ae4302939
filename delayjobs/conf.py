"""The ``DELAYJOBS`` settings dict, read lazily on every access.

Reading on access (not at import) keeps ``override_settings`` and pytest-django's
``settings`` fixture working. Values are normalised here (seconds or timedelta become
timedelta); validation with ids and hints lives in ``delayjobs.checks``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings

DEFAULTS: dict[str, Any] = {
    # Where the timing index lives: a Redis URL, or the alias of a django-redis cache
    # whose connection pool is reused. At most one of the two.
    "REDIS_URL": None,
    "REDIS_CACHE_ALIAS": None,
    # REDIS_URL names one node of a Redis Cluster: the client discovers the others and
    # which node owns which hash slot (django-redis has no cluster client, so a URL only).
    "REDIS_CLUSTER": False,
    # Prefix of every Redis key, so two projects can share one Redis.
    "KEY_PREFIX": "delayjobs",
    # How often the pre-loader runs, and how far ahead it loads. The window must be
    # longer than the interval, or a job could come due between two passes unloaded.
    "PRELOAD_INTERVAL": timedelta(seconds=10),
    "PRELOAD_WINDOW": timedelta(seconds=60),
    # Rows read per query while loading the window (keyset pagination).
    "PRELOAD_BATCH_SIZE": 1000,
    # Default number of jobs one consumer runs at once (its thread pool size).
    "CONCURRENCY": 10,
    # The longest a consumer sleeps without looking at Redis. Only a safety net: it is
    # woken by a notification when a sooner job is added.
    "IDLE_TIMEOUT": timedelta(seconds=5),
    # Redis socket timeouts, so that a dead Redis cannot hang schedule() for long, and a
    # Redis that stops answering (frozen, or behind a partition that drops packets) is
    # noticed by a consumer, which then claims from the database, within this long. 2 s
    # is far above anything delayjobs asks of Redis (each script touches at most 1,000
    # members: milliseconds, whatever the backlog); a Redis blocked longer by something
    # else is taken for dead, which costs a moment on the database, never a job.
    "REDIS_CONNECT_TIMEOUT": 1.0,
    "REDIS_SOCKET_TIMEOUT": 2.0,
    # While Redis cannot be reached, consumers claim due jobs straight from the database,
    # this often (and go back to Redis by themselves once it answers again).
    "DATABASE_POLL_INTERVAL": timedelta(seconds=1),
    # Due times and leases use the database server's clock, whatever a host's says; a
    # consumer whose host clock is further off than this is flagged (log, status,
    # dashboard), as a sign of broken time sync.
    "CLOCK_OFFSET_WARNING": timedelta(seconds=1),
    # Per consumer process: the most jobs of one queue running at once, e.g. {"sms": 2}.
    # A flood of one queue then leaves slots for the others. Job types have their own
    # limit, JobType.concurrency.
    "QUEUE_CONCURRENCY": {},
    # How long before its run_at a consumer claims a job, to start it from a timer at
    # that exact moment (the claim's round trips are then out of the way). A job claimed
    # early is running: cancel() no longer stops it. 0 claims jobs only once due.
    "CLAIM_AHEAD": timedelta(milliseconds=20),
    # The largest payload accepted, in bytes of its JSON text. None: no limit.
    "MAX_PAYLOAD_BYTES": 64 * 1024,
    # How deeply a payload (or a result) may nest lists and dicts. Deeper ones pass JSON
    # encoding yet break what reads them back (the admin, the HTTP API) with recursion.
    "MAX_PAYLOAD_DEPTH": 64,
    # Where consumers run the jobs they claim: "local" (their own thread pool) or
    # "celery" (a Celery task per job, run by Celery's workers; delayjobs.contrib.celery).
    "EXECUTOR": "local",
    # How far ahead a job may be scheduled (a run_at, or now plus a delay). Far-future
    # dates are mistakes (a year 9999 breaks the admin's date hierarchy) and near the end
    # of the calendar, arithmetic on them overflows.
    "MAX_SCHEDULE_AHEAD": timedelta(days=36525),
    # Past this many rows (the planner's estimate, PostgreSQL only), the admin's job list
    # shows the estimate instead of counting every row on each page load, and the
    # dashboard counts from a sample. 0: always count exactly.
    "ADMIN_ESTIMATE_ABOVE": 10_000,
    # A recurring schedule's tick whose job could not start within this of the tick is
    # missed (the fleet was down): its misfire policy decides whether it runs. A job type
    # (misfire_grace) or a schedule row may say otherwise.
    "MISFIRE_GRACE": timedelta(seconds=60),
}

EXECUTORS = ("local", "celery")
#: The most MAX_PAYLOAD_DEPTH may be: far below Python's recursion limit of 1000.
MAX_PAYLOAD_DEPTH_LIMIT = 200
#: The most MAX_SCHEDULE_AHEAD may be: far enough for anything, far from the year 9999.
MAX_SCHEDULE_AHEAD_LIMIT = timedelta(days=1000 * 366)
#: Past this, a claimed job would wait in the consumer rather than in Redis for long.
MAX_CLAIM_AHEAD = timedelta(seconds=5)

DURATION_SETTINGS = (
    "PRELOAD_INTERVAL",
    "PRELOAD_WINDOW",
    "IDLE_TIMEOUT",
    "DATABASE_POLL_INTERVAL",
    "CLOCK_OFFSET_WARNING",
    "MISFIRE_GRACE",
)


def raw_settings() -> dict[str, Any]:
    """The user's ``DELAYJOBS`` dict as written (empty if unset)."""
    value = getattr(django_settings, "DELAYJOBS", None)
    return value if isinstance(value, dict) else {}


def as_timedelta(value: Any) -> timedelta | None:
    """Seconds (int or float) or a timedelta as a timedelta; None for anything else."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return timedelta(seconds=value)
        except (OverflowError, ValueError):
            return None
    return None


def _is_limits(value: Any) -> bool:
    """A mapping of names to positive ints (QUEUE_CONCURRENCY)."""
    return isinstance(value, dict) and all(
        isinstance(name, str) and isinstance(n, int) and not isinstance(n, bool) and n > 0
        for name, n in value.items()
    )


class Settings:
    """Attribute access to DELAYJOBS with defaults, e.g. ``conf.settings.PRELOAD_WINDOW``."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown delayjobs setting {name!r}")
        value = raw_settings().get(name, DEFAULTS[name])
        # checks.py reports a bad value; code run without the checks (call_command, a
        # Consumer built by hand) falls back to the default rather than seeing garbage.
        if name in DURATION_SETTINGS:
            duration = as_timedelta(value)
            return duration if duration and duration.total_seconds() > 0 else DEFAULTS[name]
        if name == "CLAIM_AHEAD":
            duration = as_timedelta(value)
            valid = duration is not None and timedelta(0) <= duration <= MAX_CLAIM_AHEAD
            return duration if valid else DEFAULTS[name]
        if name == "MAX_SCHEDULE_AHEAD":
            duration = as_timedelta(value)
            valid = duration is not None and timedelta(0) < duration <= MAX_SCHEDULE_AHEAD_LIMIT
            return duration if valid else DEFAULTS[name]
        if name == "MAX_PAYLOAD_DEPTH" and not (
            isinstance(value, int)
            and not isinstance(value, bool)
            and 1 <= value <= MAX_PAYLOAD_DEPTH_LIMIT
        ):
            return DEFAULTS[name]
        if name == "QUEUE_CONCURRENCY" and not _is_limits(value):
            return DEFAULTS[name]
        if name == "REDIS_CLUSTER" and not isinstance(value, bool):
            return DEFAULTS[name]
        if name == "EXECUTOR" and value not in EXECUTORS:
            return DEFAULTS[name]
        return value

    @property
    def redis_target(self) -> tuple[str, str]:
        """("cache", alias) or ("url", url): how to reach Redis."""
        alias = self.REDIS_CACHE_ALIAS
        if alias:
            return ("cache", alias)
        return ("url", self.REDIS_URL or "redis://127.0.0.1:6379/0")


settings = Settings()
