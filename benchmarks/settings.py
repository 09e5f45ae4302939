"""Django settings of the benchmarks: delayjobs, the bench job type, PostgreSQL and Redis.

The driver (``benchmarks.core``) starts the servers and exports their addresses in the
environment, so the consumer subprocesses it starts read the very same settings:

- ``DELAYJOBS_BENCH_DATABASE``: a Django ``DATABASES`` entry as JSON;
- ``DELAYJOBS_BENCH_REDIS_URL``: a ``redis://`` URL;
- ``DELAYJOBS_BENCH_CONN_MAX_AGE``: optional ``CONN_MAX_AGE`` of that database, in seconds
  or ``none`` for persistent connections (unset: Django's default, 0).
- ``DELAYJOBS_BENCH_TRACING``: ``api`` (the default: ``opentelemetry-api`` installed, no
  SDK, as a project with the ``otel`` extra and no tracing set up), ``off``
  (``DELAYJOBS["TRACING"] = False``), or ``sdk`` (the OpenTelemetry SDK with a batch span
  processor, every span recorded and handed to an exporter that drops it: the cost of
  tracing within the process, without a collector's network). Set it in the environment of
  ``benchmarks/run.sh``; the consumer processes inherit it.

delayjobs' own settings are left at their defaults: the benchmark measures what a user
gets out of the box.
"""

from __future__ import annotations

import json
import os

from django.core.exceptions import ImproperlyConfigured

from benchmarks.environment import CONN_MAX_AGE_ENV, DATABASE_ENV, REDIS_URL_ENV


def _required(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ImproperlyConfigured(
            f"{name} is not set. Run the benchmarks with `benchmarks/run.sh`, which "
            f"starts PostgreSQL and Redis and sets it."
        )
    return value


SECRET_KEY = "delayjobs-benchmarks-not-secret"
DEBUG = False  # DEBUG=True would keep every SQL query in memory
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "delayjobs",
    "benchmarks",
]


def _conn_max_age() -> int | None:
    value = os.environ.get(CONN_MAX_AGE_ENV, "0").strip().lower()
    return None if value == "none" else int(value)


_DATABASE = json.loads(_required(DATABASE_ENV))
DATABASES = {
    "default": {**_DATABASE, "CONN_MAX_AGE": _conn_max_age()},
    # The ``orm`` job body's own connections (benchmarks.bodies): same database, kept open,
    # so that no system pays a new connection per job whatever it does with ``default``.
    "body": {**_DATABASE, "CONN_MAX_AGE": None},
}

TRACING_ENV = "DELAYJOBS_BENCH_TRACING"
_TRACING = os.environ.get(TRACING_ENV, "api")
if _TRACING not in ("off", "api", "sdk"):
    raise ImproperlyConfigured(f"{TRACING_ENV} must be off, api or sdk, not {_TRACING!r}.")

DELAYJOBS = {
    "REDIS_URL": _required(REDIS_URL_ENV),
    "KEY_PREFIX": "dj-bench",
    "TRACING": _TRACING != "off",
}

if _TRACING == "sdk":
    from benchmarks.tracing_sdk import set_up_sdk

    set_up_sdk()

# Errors only: log lines per job would distort what is measured.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "ERROR"},
}
