"""Django settings of the peers built on Django's Tasks framework: dj-queue and
django-tasks-db, the one whose app ``DELAYJOBS_BENCH_TASKS_APP`` names.

Their tables live in a database of their own (named after the app) as ``default``, with
persistent connections: dj-queue's own benchmarks keep them open, and django-tasks-db's
worker would otherwise connect again for every task (it closes old connections as a
request does). The ``body`` alias is benchmarks.settings' own, for the ``orm`` body.
Neither delayjobs nor any other app is installed: a peer's worker loads its own app only.
``TASKS[...]["OPTIONS"]`` comes from ``DELAYJOBS_BENCH_TASKS_OPTIONS`` (JSON), set by the
peer's system for its configuration.
"""

from __future__ import annotations

import json
import os

from benchmarks.environment import TASKS_APP_ENV, TASKS_OPTIONS_ENV
from benchmarks.settings import DATABASES as _BENCHMARK_DATABASES
from benchmarks.settings import (  # noqa: F401 - settings of this module as well
    DEBUG,
    DEFAULT_AUTO_FIELD,
    LOGGING,
    SECRET_KEY,
    TIME_ZONE,
    USE_TZ,
)

#: The peer's app -> its TASKS backend.
BACKENDS = {
    "dj_queue": "dj_queue.backend.DjQueueBackend",
    "django_tasks_db": "django_tasks_db.DatabaseBackend",
}
APP = os.environ[TASKS_APP_ENV]

INSTALLED_APPS = ["benchmarks", APP]
DATABASES = {
    "default": {**_BENCHMARK_DATABASES["body"], "NAME": APP},
    "body": _BENCHMARK_DATABASES["body"],
}
TASKS = {
    "default": {
        "BACKEND": BACKENDS[APP],
        "QUEUES": [],
        "OPTIONS": json.loads(os.environ.get(TASKS_OPTIONS_ENV) or "{}"),
    }
}
