"""Settings of the test suite, its own: every setting the tests rely on is stated here.

The installed apps are delayjobs, the sample project's two apps (the bindings, admin and
sample-project tests use their models and views), the reference Django Tasks backend and
the ``tests`` app. Of the sample project's settings only the middleware and templates of
its views are imported, by name; the README's demo (.ci/demo-fresh-clone) runs the rest.

``DELAYJOBS_TEST_DB`` selects the database: "sqlite" (default, a file so that consumer
subprocesses share it) or "postgres". Servers are started on import unless their address
is already in the environment (see tests/services_setup.py). ``DELAYJOBS_TEST_SERVICES=none``
starts nothing, for tests/unit: Redis is an address nothing listens on, the database an
in-memory SQLite.

``DELAYJOBS_TEST_DB_NAME`` overrides the database NAME. pytest-django runs the tests
against a renamed test database ("test_…"); the consumer_process fixture passes that name
to subprocesses through this variable, so they open the very database the test writes to.
"""

from __future__ import annotations

import json
import os
from urllib.parse import urlsplit

import django

from sampleproject.settings import MIDDLEWARE as SAMPLE_MIDDLEWARE
from sampleproject.settings import TEMPLATES as SAMPLE_TEMPLATES
from tests.services_setup import (
    LOOPBACK,
    SQLITE_NAME,
    SQLITE_TEST_NAME,
    ensure_services,
)
from tests.skewed_clock import install_from_environment as install_skewed_clock
from tests.support.sentinel import CACHE_ALIAS as SENTINEL_CACHE_ALIAS
from tests.support.sentinel import SENTINELS_ENV, parse_sentinels, sentinel_cache
from tests.support.sentinel import SERVICE_ENV as SENTINEL_SERVICE_ENV

SECRET_KEY = "django-insecure-delayjobs-tests-only"
# Consumer and manage.py subprocesses run with it, as they did on the sample's settings;
# pytest-django turns it off in the test process itself.
DEBUG = True
# The browser tests' live server answers on localhost; the test client is always allowed.
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]

_CONTRIB = ("admin", "auth", "contenttypes", "sessions", "messages", "staticfiles")
INSTALLED_APPS = [
    *(f"django.contrib.{name}" for name in _CONTRIB),
    "delayjobs",
    # The sample's apps: the bindings, admin and sample-project tests use their models.
    "sampleproject.meetings",
    "sampleproject.orders",
    # django_tasks_db: the reference backend of tests/integration/test_tasks_differential.py.
    "django_tasks_db",
    "tests",
]

# The sample project's URLs: its apps' views (tests/integration/test_sampleproject.py, the
# browser tests), the admin, and the HTTP API and its docs where the sample mounts them.
# Those views run under the sample's own middleware and templates, imported by name: a
# change to the sample's stack is tested with it. Nothing else comes from its settings.
ROOT_URLCONF = "sampleproject.urls"
MIDDLEWARE = SAMPLE_MIDDLEWARE
TEMPLATES = SAMPLE_TEMPLATES

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TIME_ZONE = "UTC"
USE_TZ = True
STATIC_URL = "static/"

# The sample's meetings send reminders by e-mail, in consumer subprocesses too: locmem
# keeps them in memory. MAILERS replaces EMAIL_BACKEND from Django 6.1.
if django.VERSION >= (6, 1):
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
else:
    EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
DEFAULT_FROM_EMAIL = "meetings@localhost"

SERVICES = ensure_services()

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
elif SERVICES.db == "none":
    # tests/unit: no test there opens the database (tests/unit/conftest.py sees to it).
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
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
# The Celery executor's tests start a real Celery worker (sampleproject's app, which reads
# the CELERY_* settings) on the tests' Redis, in another database than delayjobs' keys.
CELERY_BROKER_URL = os.environ.get("DELAYJOBS_TEST_CELERY_BROKER") or (
    urlsplit(SERVICES.redis_url)._replace(path="/1").geturl()
)
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# tests/scale/test_sentinel.py: Redis through Sentinel, by a django-redis cache configured
# as django-redis documents it (tests.support.sentinel.sentinel_cache), named by
# delayjobs' REDIS_CACHE_ALIAS as a project would.
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

# Hashing passwords properly is slow on purpose; tests do not need that.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
# A test may read more of its subprocesses' output: delayjobs' logger at this level (DEBUG
# shows each job the Celery executor hands over, by attempt).
if os.environ.get("DELAYJOBS_TEST_LOG_LEVEL"):
    LOGGING["loggers"] = {"delayjobs": {"level": os.environ["DELAYJOBS_TEST_LOG_LEVEL"]}}

# Django's Tasks framework on delayjobs (tests/integration/test_tasks_backend.py, tasks in
# tests/tasks.py): django.tasks on Django 6, the django-tasks backport on Django 5.2.
_TASKS_PACKAGE = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
TASKS = {
    "default": {
        "BACKEND": "delayjobs.contrib.tasks.backend.DelayJobsBackend",
        "QUEUES": ["default", "other"],
    },
    "retrying": {
        "BACKEND": "delayjobs.contrib.tasks.backend.DelayJobsBackend",
        "OPTIONS": {"MAX_ATTEMPTS": 2},
    },
    "once": {
        "BACKEND": "delayjobs.contrib.tasks.backend.DelayJobsBackend",
        "OPTIONS": {"MAX_ATTEMPTS": 1},
    },
    # tests/integration/test_tasks_differential.py: the same scenarios on the reference database
    # backend (django-tasks-db) and on delayjobs', one attempt each.
    "reference": {
        "BACKEND": "django_tasks_db.DatabaseBackend",
        "QUEUES": ["default", "other"],
    },
    "differential": {
        "BACKEND": "delayjobs.contrib.tasks.backend.DelayJobsBackend",
        "QUEUES": ["default", "other"],
        "OPTIONS": {"MAX_ATTEMPTS": 1},
    },
    # Not a delayjobs backend: a row naming it must be refused by consumers.
    "immediate": {"BACKEND": f"{_TASKS_PACKAGE}.backends.immediate.ImmediateBackend"},
}

# A subprocess's spans (tests/integration/test_tracing.py): an SDK writing them to a file,
# as a project would set one up in its settings or its WSGI/Celery entry points.
if os.environ.get("DELAYJOBS_TEST_TRACES"):
    from tests.support.tracing import export_to_file

    export_to_file(
        os.environ["DELAYJOBS_TEST_TRACES"], os.environ.get("DELAYJOBS_TEST_SERVICE", "consumer")
    )
