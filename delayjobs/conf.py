"""The ``DELAYJOBS`` settings: one table of them (``SETTINGS``), read lazily on every access.

Each row says a setting's default, what values it takes (its kind: type and range), the
id and hint of the system check that reports a bad value, and what it does (the settings
reference is generated from ``doc``). ``settings.X`` reads the project's value (or the
default) by that row, normalised (seconds or a timedelta become a timedelta), and raises
``ImproperlyConfigured`` naming the setting for a value the row refuses: a bad value is
an error, never a silent default. The system checks (``delayjobs.checks``) read every
setting by the same rows, so ``manage.py check`` reports the same refusals first, each
with its id and hint, plus what only settings together can get wrong.

Reading on access (not at import) keeps ``override_settings`` and pytest-django's
``settings`` fixture working.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from redis.connection import parse_url

from delayjobs.names import QUEUE_RULE, is_queue

EXECUTORS = ("local", "celery")
#: Upper bounds, far above any sensible value and far below what breaks: a duration is
#: added to now() and slept on (threading's TIMEOUT_MAX is about 292 years), a timeout is
#: given to socket.settimeout(), and each unit of concurrency is a thread.
MAX_DURATION = timedelta(days=365)
MAX_TIMEOUT_SECONDS = 24 * 3600
MAX_CONCURRENCY = 1000
#: The most consumer processes one ``run_delay_consumer`` supervises: each is a whole
#: Django process (memory, database connections), and a host with more CPUs than this
#: runs several commands (or containers) rather than one.
MAX_PROCESSES = 64
#: ``PROCESSES`` (and ``--processes``) that means one process per CPU this process may run on.
AUTO = "auto"
#: The most MAX_PAYLOAD_DEPTH may be: far below Python's recursion limit of 1000.
MAX_PAYLOAD_DEPTH_LIMIT = 200
#: The most MAX_SCHEDULE_AHEAD may be: far enough for anything, far from the year 9999.
MAX_SCHEDULE_AHEAD_LIMIT = timedelta(days=1000 * 366)
#: Past this, a claimed job would wait in the consumer rather than in Redis for long.
MAX_CLAIM_AHEAD = timedelta(seconds=5)


# Kinds of value -------------------------------------------------------------------------


class Kind:
    """What values a setting takes: ``expected`` says it in words (after "must be"),
    ``read`` returns a value as the code uses it, or raises ``ValueError``."""

    def expected(self) -> str:
        raise NotImplementedError

    def read(self, value: Any) -> Any:
        raise NotImplementedError

    def show(self, value: Any) -> str:
        """The value as a message may show it."""
        return repr(value)

    def advice(self, value: Any) -> str | None:
        """A hint better than the setting's own for this bad value, if there is one."""
        return None


def as_timedelta(value: Any) -> timedelta | None:
    """Seconds (int or float) or a timedelta as a timedelta; None for anything else."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return timedelta(seconds=value)
        except (OverflowError, ValueError):  # inf, NaN, out of range
            return None
    return None


def is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Duration(Kind):
    """A number of seconds or a timedelta, above 0 (or 0 itself, with ``zero``), at most
    ``most``; read as a timedelta."""

    most: timedelta
    zero: bool = False

    def expected(self) -> str:
        if self.zero:
            return f"0 to {self.most.total_seconds():g} seconds (a number or a timedelta)"
        return (
            f"a positive number of seconds or a positive timedelta, at most {self.most.days} days"
        )

    def read(self, value: Any) -> timedelta:
        duration = as_timedelta(value)
        least_ok = duration is not None and (
            duration >= timedelta(0) if self.zero else duration > timedelta(0)
        )
        if duration is None or not least_ok or duration > self.most:
            raise ValueError(value)
        return duration


@dataclass(frozen=True)
class Integer(Kind):
    """An int (not a bool) from ``least``, at most ``most`` if given; or None, with
    ``none``."""

    least: int
    most: int | None = None
    none: bool = False

    def expected(self) -> str:
        text = "a positive integer" if self.least == 1 else f"an integer, {self.least} or more"
        if self.most is not None:
            text += f", at most {self.most}"
        return f"{text} or None" if self.none else text

    def read(self, value: Any) -> int | None:
        if value is None and self.none:
            return None
        if not is_integer(value) or value < self.least:
            raise ValueError(value)
        if self.most is not None and value > self.most:
            raise ValueError(value)
        return int(value)


@dataclass(frozen=True)
class Seconds(Kind):
    """A positive int or finite float, at most ``most``; read as it is (socket timeouts)."""

    most: float

    def expected(self) -> str:
        return f"a positive number of seconds, at most {self.most:g}"

    def read(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(value)
        if not math.isfinite(value) or not 0 < value <= self.most:
            raise ValueError(value)
        return value


@dataclass(frozen=True)
class Choice(Kind):
    options: tuple[str, ...]

    def expected(self) -> str:
        return f"one of {', '.join(map(repr, self.options))}"

    def read(self, value: Any) -> str:
        if value not in self.options:
            raise ValueError(value)
        return str(value)


class Processes(Kind):
    """``"auto"`` or an int (not a bool) from 1 to MAX_PROCESSES."""

    def expected(self) -> str:
        return f"'{AUTO}' (one per usable CPU) or a whole number from 1 to {MAX_PROCESSES}"

    def read(self, value: Any) -> int | str:
        if value == AUTO:
            return AUTO
        if not is_integer(value) or not 1 <= value <= MAX_PROCESSES:
            raise ValueError(value)
        return int(value)


class Flag(Kind):
    def expected(self) -> str:
        return "True or False"

    def read(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(value)
        return value


class KeyPrefix(Kind):
    def expected(self) -> str:
        return "a non-empty string without braces or spaces"

    def read(self, value: Any) -> str:
        if not isinstance(value, str) or not value or any(c in value for c in "{} "):
            raise ValueError(value)
        return value


class CacheAlias(Kind):
    """None, or the name of a cache (``delayjobs.checks`` also finds it in ``CACHES``)."""

    def expected(self) -> str:
        return "None or the alias of a django-redis cache in CACHES"

    def read(self, value: Any) -> str | None:
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(value)
        return value


class QueueLimits(Kind):
    def expected(self) -> str:
        return f"a dict mapping queue names ({QUEUE_RULE}) to positive integers"

    def read(self, value: Any) -> dict[str, int]:
        if not isinstance(value, dict) or not all(
            is_queue(queue) and is_integer(limit) and limit >= 1 for queue, limit in value.items()
        ):
            raise ValueError(value)
        return value


class RedisUrl(Kind):
    def expected(self) -> str:
        return "None or a valid redis://, rediss:// or unix:// URL"

    def read(self, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(value)
        parse_url(value)  # what redis-py does with it: a bad port fails here, not at runtime
        return value

    def show(self, value: Any) -> str:
        return repr(mask_url(value)) if isinstance(value, str) else repr(value)

    def advice(self, value: Any) -> str | None:
        if isinstance(value, str) and "sentinel" in value.partition("://")[0].lower():
            # redis-py has no URL for Sentinel, and a grammar of our own would be one more
            # to learn: Sentinel goes through django-redis's documented configuration.
            return (
                "Redis Sentinel has no URL: configure a django-redis cache with "
                "'django_redis.pool.SentinelConnectionFactory' and name it in "
                "REDIS_CACHE_ALIAS instead (see the Redis Sentinel how-to)."
            )
        return None


#: Query parameters that carry a secret: redis-py reads ``password`` from the query string
#: and hands the others to the connection as they are (``ssl_password``: the key file's).
_SECRET_PARAMETER = re.compile(r"([?&][^=&#]*password=)[^&#]*", re.IGNORECASE)


def mask_url(url: str) -> str:
    """``url`` with every password replaced by ``***``, for logs and error messages.

    Masks the credentials and any query parameter whose name ends in ``password``. Errs
    on the side of hiding: everything before the last ``@`` counts as credentials (a
    password may hold a raw ``/``, ``?`` or ``#`` that a URL parser would cut it at), and
    a string that is not quite a URL (``redis:/:pw@host``) is masked all the same.
    """
    url = _SECRET_PARAMETER.sub(r"\1***", url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user, colon, _password = credentials.partition(":")
    # Without a colon the one token may be a password written as a user name: hide it.
    shown = f"{user}:***" if colon else "***"
    return f"{scheme}{sep}{shown}@{host}"


# The table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One key of ``DELAYJOBS``."""

    name: str
    default: Any
    kind: Kind
    #: The system check that reports a value ``kind`` refuses, and its advice.
    check_id: str
    hint: str
    #: What it does, for the settings reference.
    doc: str

    def problem(self, value: Any) -> str:
        """What is wrong with ``value`` (one ``kind`` refuses), naming the setting."""
        return (
            f"DELAYJOBS[{self.name!r}] must be {self.kind.expected()}; got {self.kind.show(value)}."
        )

    def read(self, value: Any) -> Any:
        """``value`` as the code uses it; ``ImproperlyConfigured`` if ``kind`` refuses it."""
        try:
            return self.kind.read(value)
        except ValueError:
            hint = self.kind.advice(value) or self.hint
            raise ImproperlyConfigured(
                f"{self.problem(value)} {hint} (system check {self.check_id})"
            ) from None


def _duration(name: str, seconds: float, doc: str) -> Setting:
    return Setting(
        name,
        timedelta(seconds=seconds),
        Duration(MAX_DURATION),
        "delayjobs.E005",
        f"For example {name!r}: {seconds:g} (seconds), or datetime.timedelta(seconds={seconds:g}).",
        doc,
    )


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "REDIS_URL",
        None,
        RedisUrl(),
        "delayjobs.E003",
        "For example 'redis://127.0.0.1:6379/0', or 'rediss://user:pass@host/0' for TLS.",
        "Where the timing index lives: a Redis URL, or (REDIS_CACHE_ALIAS) the alias of a "
        "django-redis cache whose connection pool is reused. At most one of the two; "
        "neither: redis://127.0.0.1:6379/0.",
    ),
    Setting(
        "REDIS_CACHE_ALIAS",
        None,
        CacheAlias(),
        "delayjobs.E004",
        "Add it to CACHES with BACKEND 'django_redis.cache.RedisCache'.",
        "The alias of a django-redis cache whose connection pool is reused, instead of REDIS_URL.",
    ),
    Setting(
        "REDIS_CLUSTER",
        False,
        Flag(),
        "delayjobs.E017",
        "REDIS_CLUSTER = True with REDIS_URL naming any one node of the cluster, e.g. "
        "'redis://10.0.0.1:6379/0'.",
        "REDIS_URL names one node of a Redis Cluster: the client discovers the others and "
        "which node owns which hash slot (django-redis has no cluster client, so a URL only).",
    ),
    Setting(
        "KEY_PREFIX",
        "delayjobs",
        KeyPrefix(),
        "delayjobs.E009",
        "Braces would break the Redis Cluster hash tags of the queue keys.",
        "Prefix of every Redis key, so two projects can share one Redis.",
    ),
    _duration(
        "PRELOAD_INTERVAL",
        10,
        "How often the pre-loader runs. PRELOAD_WINDOW must be longer, or a job could come "
        "due between two passes unloaded.",
    ),
    _duration(
        "PRELOAD_WINDOW",
        60,
        "How far ahead the pre-loader loads jobs into Redis: longer than PRELOAD_INTERVAL.",
    ),
    Setting(
        "PRELOAD_BATCH_SIZE",
        1000,
        Integer(1),
        "delayjobs.E007",
        "The default is 1000.",
        "Rows read per query while loading the window (keyset pagination).",
    ),
    Setting(
        "CONCURRENCY",
        32,
        Integer(1, MAX_CONCURRENCY),
        "delayjobs.E007",
        "The default is 32.",
        "Default number of jobs one consumer process runs at once (its thread pool size, "
        "threads started as needed). Job bodies wait (on the database, Redis, HTTP) more "
        "than they compute, and a waiting thread gives the GIL up, so threads to spare keep "
        "the CPU busy. A thread holds a database connection only while its job uses the "
        "ORM (CONN_MAX_AGE 0), or from its first query on (CONN_MAX_AGE > 0).",
    ),
    Setting(
        "PROCESSES",
        AUTO,
        Processes(),
        "delayjobs.E019",
        "The default, 'auto', starts one consumer process per CPU; 1 runs the consumer in "
        "the command's own process, without a supervisor.",
        "Default number of consumer processes run_delay_consumer starts (--processes): "
        "'auto', one per CPU the command may run on (1 with --burst, with the Celery "
        "executor, whose workers run the jobs, and on SQLite, which writes one process at a "
        "time), or 1 to 64. More than one: the command's process supervises them (restarts "
        "one that dies, passes signals on).",
    ),
    _duration(
        "IDLE_TIMEOUT",
        5,
        "The longest a consumer sleeps without looking at Redis. Only a safety net: it is "
        "woken by a notification when a sooner job is added.",
    ),
    Setting(
        "REDIS_CONNECT_TIMEOUT",
        1.0,
        Seconds(MAX_TIMEOUT_SECONDS),
        "delayjobs.E010",
        "The default is 1 seconds.",
        "Redis socket timeouts (with REDIS_SOCKET_TIMEOUT), so that a dead Redis cannot "
        "hang schedule() for long.",
    ),
    Setting(
        "REDIS_SOCKET_TIMEOUT",
        2.0,
        Seconds(MAX_TIMEOUT_SECONDS),
        "delayjobs.E010",
        "The default is 2 seconds.",
        "A Redis that stops answering (frozen, or behind a partition that drops packets) "
        "is noticed by a consumer, which then claims from the database, within this long. "
        "2 s is far above anything delayjobs asks of Redis (each script touches at most "
        "1,000 members: milliseconds, whatever the backlog); a Redis blocked longer by "
        "something else is taken for dead, which costs a moment on the database, never a job.",
    ),
    _duration(
        "DATABASE_POLL_INTERVAL",
        1,
        "While Redis cannot be reached, consumers claim due jobs straight from the "
        "database, this often (and go back to Redis by themselves once it answers again).",
    ),
    _duration(
        "CLOCK_OFFSET_WARNING",
        1,
        "Due times and leases use the database server's clock, whatever a host's says; a "
        "consumer whose host clock is further off than this is flagged (log, status, "
        "dashboard), as a sign of broken time sync.",
    ),
    Setting(
        "QUEUE_CONCURRENCY",
        {},
        QueueLimits(),
        "delayjobs.E011",
        "For example {'sms': 2}: at most two jobs of the queue 'sms' run at once in each "
        "consumer process.",
        "Per consumer process: the most jobs of one queue running at once, e.g. "
        '{"sms": 2}. A flood of one queue then leaves slots for the others. Job types '
        "have their own limit, JobType.concurrency.",
    ),
    Setting(
        "CLAIM_AHEAD",
        timedelta(milliseconds=20),
        Duration(MAX_CLAIM_AHEAD, zero=True),
        "delayjobs.E014",
        "The default, 0.02 (20 ms), hides the claim's round trips; 0 claims a job only once "
        "it is due.",
        "How long before its run_at a consumer claims a job, to start it from a timer at "
        "that exact moment (the claim's round trips are then out of the way). A job "
        "claimed early is running: cancel() no longer stops it. 0 claims jobs only once due.",
    ),
    Setting(
        "MAX_PAYLOAD_BYTES",
        64 * 1024,
        Integer(1, none=True),
        "delayjobs.E012",
        "The default is 65536 (64 KiB). Store ids in payloads, not documents.",
        "The largest payload accepted, in bytes of its JSON text. None: no limit.",
    ),
    Setting(
        "MAX_PAYLOAD_DEPTH",
        64,
        Integer(1, MAX_PAYLOAD_DEPTH_LIMIT),
        "delayjobs.E016",
        "The default, 64, is deeper than any payload of ids and values needs.",
        "How deeply a payload (or a result) may nest lists and dicts. Deeper ones pass JSON "
        "encoding yet break what reads them back (the admin, the HTTP API) with recursion.",
    ),
    Setting(
        "EXECUTOR",
        "local",
        Choice(EXECUTORS),
        "delayjobs.E013",
        "'local' runs jobs in each consumer's thread pool; 'celery' hands each claimed job "
        "to a Celery task run by your Celery workers.",
        'Where consumers run the jobs they claim: "local" (their own thread pool) or '
        '"celery" (a Celery task per job, run by Celery\'s workers; delayjobs.contrib.celery).',
    ),
    Setting(
        "MAX_SCHEDULE_AHEAD",
        timedelta(days=36525),
        Duration(MAX_SCHEDULE_AHEAD_LIMIT),
        "delayjobs.E015",
        "The default, timedelta(days=36525), lets jobs be scheduled up to 100 years ahead.",
        "How far ahead a job may be scheduled (a run_at, or now plus a delay). Far-future "
        "dates are mistakes (a year 9999 breaks the admin's date hierarchy) and near the end "
        "of the calendar, arithmetic on them overflows.",
    ),
    Setting(
        "ADMIN_ESTIMATE_ABOVE",
        10_000,
        Integer(0),
        "delayjobs.E018",
        "The default is 10000; 0 always counts exactly.",
        "Past this many rows (the planner's estimate, PostgreSQL only), the admin's job list "
        "shows the estimate instead of counting every row on each page load, and the "
        "dashboard counts from a sample. 0: always count exactly.",
    ),
    Setting(
        "TRACING",
        True,
        Flag(),
        "delayjobs.E020",
        "True (the default) traces through opentelemetry-api when it is installed; False "
        "turns tracing off.",
        "OpenTelemetry spans (messaging conventions) for scheduling and running jobs, when "
        "opentelemetry-api is installed (the otel extra); a no-op until the project sets up "
        "an SDK. False: no span is made and no context stored with jobs.",
    ),
    _duration(
        "MISFIRE_GRACE",
        60,
        "A recurring schedule's tick whose job could not start within this of the tick is "
        "missed (the fleet was down): its misfire policy decides whether it runs. A job "
        "type (misfire_grace) or a schedule row may say otherwise.",
    ),
)

BY_NAME: dict[str, Setting] = {setting.name: setting for setting in SETTINGS}
DEFAULTS: dict[str, Any] = {setting.name: setting.default for setting in SETTINGS}
#: The defaults as read: reading them here also proves that each passes its own row.
_DEFAULT_VALUES: dict[str, Any] = {
    setting.name: setting.read(setting.default) for setting in SETTINGS
}


_UNSET = object()


def configured() -> dict[str, Any]:
    """The project's ``DELAYJOBS`` dict as written (empty if unset).

    ``ImproperlyConfigured`` if it is set to anything but a dict.
    """
    value = getattr(django_settings, "DELAYJOBS", _UNSET)
    if value is _UNSET:
        return {}
    if not isinstance(value, dict):
        raise ImproperlyConfigured(
            f"DELAYJOBS must be a dict, got {type(value).__name__} (system check delayjobs.E001)."
        )
    return value


class Settings:
    """Attribute access to DELAYJOBS, read by the table: ``conf.settings.PRELOAD_WINDOW``."""

    def __getattr__(self, name: str) -> Any:
        setting = BY_NAME.get(name)
        if setting is None:
            raise AttributeError(f"Unknown delayjobs setting {name!r}")
        config = configured()
        if name not in config:
            return _DEFAULT_VALUES[name]
        return setting.read(config[name])

    @property
    def redis_target(self) -> tuple[str, str]:
        """("cache", alias) or ("url", url): how to reach Redis."""
        url, alias = self.REDIS_URL, self.REDIS_CACHE_ALIAS
        if url and alias:
            raise ImproperlyConfigured(
                "DELAYJOBS sets both REDIS_URL and REDIS_CACHE_ALIAS; keep one (system check "
                "delayjobs.E002)."
            )
        if alias:
            return ("cache", alias)
        return ("url", url or "redis://127.0.0.1:6379/0")


settings = Settings()
