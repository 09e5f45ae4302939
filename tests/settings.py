"""Settings of the test suite: the sample project, plus real Redis and a real database.

``DELAYJOBS_TEST_DB`` selects the database: "sqlite" (default, a file so that consumer
subprocesses share it) or "postgres". Servers are started on import unless their address
is already in the environment (see tests/services_setup.py).

``DELAYJOBS_TEST_DB_NAME`` overrides the database NAME. pytest-django runs the tests
against a renamed test database ("test_…"); the consumer_process fixture passes that name
to subprocesses through this variable, so they open the very database the test writes to.
"""

from __future__ import annotations

import json
import os
from urllib.parse import urlsplit

import django

from sampleproject.settings import *  # noqa: F403
from sampleproject.settings import INSTALLED_APPS
from tests.scale.sentinel import CACHE_ALIAS as SENTINEL_CACHE_ALIAS
from tests.scale.sentinel import SENTINELS_ENV, parse_sentinels, sentinel_cache
from tests.scale.sentinel import SERVICE_ENV as SENTINEL_SERVICE_ENV
from tests.services_setup import (
    LOOPBACK,
    SQLITE_NAME,
    SQLITE_TEST_NAME,
    ensure_services,
)
from tests.skewed_clock import install_from_environment as install_skewed_clock

SERVICES = ensure_services()

# django_tasks_db: the reference backend of tests/test_tasks_differential.py.
INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db", "tests"]

DB_NAME_OVERRIDE = os.environ.get("DELAYJOBS_TEST_DB_NAME")

if SERVICES.db == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": DB_NAME_OVERRIDE or "delayjobs",
            "USER": "postgres",
            "PASSWORD": "",
            # A consumer in a network namespace of tests/scale reaches it at another address.
            "HOST": os.environ.get("DELAYJOBS_TEST_PG_HOST") or LOOPBACK,
            "PORT": str(SERVICES.pg_port),
            # libpq options of a run, as JSON: tcp_user_timeout for tests/scale, say.
            "OPTIONS": json.loads(os.environ.get("DELAYJOBS_TEST_PG_OPTIONS") or "{}"),
            "TEST": {"NAME": "test_delayjobs"},
        }
    }
    # A test may reach the database otherwise, e.g. through a PgBouncer (tests/scale): a JSON
    # object merged into the entry, as DELAYJOBS_TEST_OVERRIDES is into DELAYJOBS.
    DATABASES["default"].update(json.loads(os.environ.get("DELAYJOBS_TEST_DB_OVERRIDES") or "{}"))
else:
    assert SERVICES.sqlite_dir is not None
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DB_NAME_OVERRIDE or str(SERVICES.sqlite_dir / SQLITE_NAME),
            "TEST": {"NAME": str(SERVICES.sqlite_dir / SQLITE_TEST_NAME)},
            "OPTIONS": {
                # Consumers in other processes write concurrently: wait for the lock
                # instead of failing, take it at BEGIN (no upgrade deadlocks), and let
                # readers proceed while one writer commits (WAL).
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

DELAYJOBS = {
    "REDIS_URL": SERVICES.redis_url,
    "REDIS_CACHE_ALIAS": None,
    "KEY_PREFIX": "dj-test",
    # Short interval and window so that tests about the pre-loader finish in seconds.
    "PRELOAD_INTERVAL": 1,
    "PRELOAD_WINDOW": 5,
}
# The Celery executor's tests start a real Celery worker (sampleproject's app) on the
# tests' Redis, in another database than delayjobs' keys.
CELERY_BROKER_URL = os.environ.get("DELAYJOBS_TEST_CELERY_BROKER") or (
    urlsplit(SERVICES.redis_url)._replace(path="/1").geturl()
)
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# tests/scale/test_sentinel.py: Redis through Sentinel, by a django-redis cache configured
# as django-redis documents it (tests.scale.sentinel.sentinel_cache), named by delayjobs'
# REDIS_CACHE_ALIAS as a project would.
if os.environ.get(SENTINELS_ENV):
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        SENTINEL_CACHE_ALIAS: sentinel_cache(
            parse_sentinels(os.environ[SENTINELS_ENV]), os.environ[SENTINEL_SERVICE_ENV]
        ),
    }
    DELAYJOBS.update(REDIS_URL=None, REDIS_CACHE_ALIAS=SENTINEL_CACHE_ALIAS)

# A test may give its consumer subprocesses other DELAYJOBS values: a JSON object, merged.
DELAYJOBS.update(json.loads(os.environ.get("DELAYJOBS_TEST_OVERRIDES") or "{}"))

# A consumer whose host clock is off, for tests/scale/test_clocks.py (see the module).
install_skewed_clock()

USE_TZ = True

# Hashing passwords properly is slow on purpose; tests do not need that.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}

# Django's Tasks framework on delayjobs (tests/test_tasks_backend.py, tasks in tests/tasks.py):
# django.tasks on Django 6, the django-tasks backport on Django 5.2.
_TASKS_PACKAGE = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
TASKS = {
    "default": {
        "BACKEND": "delayjobs.backends.DelayJobsBackend",
        "QUEUES": ["default", "other"],
    },
    "retrying": {
        "BACKEND": "delayjobs.backends.DelayJobsBackend",
        "OPTIONS": {"MAX_ATTEMPTS": 2},
    },
    "once": {
        "BACKEND": "delayjobs.backends.DelayJobsBackend",
        "OPTIONS": {"MAX_ATTEMPTS": 1},
    },
    # tests/test_tasks_differential.py: the same scenarios on the reference database
    # backend (django-tasks-db) and on delayjobs', one attempt each.
    "reference": {
        "BACKEND": "django_tasks_db.DatabaseBackend",
        "QUEUES": ["default", "other"],
    },
    "differential": {
        "BACKEND": "delayjobs.backends.DelayJobsBackend",
        "QUEUES": ["default", "other"],
        "OPTIONS": {"MAX_ATTEMPTS": 1},
    },
    # Not a delayjobs backend: a row naming it must be refused by consumers.
    "immediate": {"BACKEND": f"{_TASKS_PACKAGE}.backends.immediate.ImmediateBackend"},
}
