"""The peers built on Django's Tasks framework, scheduled with ``run_after``: dj-queue and
django-tasks-db, each on a database of its own (``benchmarks.tasks_settings``). Their task
and scheduling client: ``django_tasks_app``.

**django-tasks-db** (the reference database backend of Django Tasks; Django 5.2 with the
django-tasks backport, in ``.venv-bench``): its worker, ``manage.py db_worker``, runs one
task at a time and, when it finds none, sleeps ``--interval`` (1 s by default) before it
looks again; that is its only knob, and its docs give no advice. Best configuration: 2
workers (one per CPU: a worker has no threads), ``--interval 0.1`` (as Procrastinate's
polling here), persistent database connections. No bulk call: W3's bulk is a loop.

**dj-queue** (``dj_queue``; Python >= 3.12 and Django >= 6, so in ``.venv-bench-py312``):
a supervisor runs workers (threads claiming ready jobs), a dispatcher (moves due scheduled
jobs to ready, ``batch_size`` rows every ``polling_interval``, 500 and 1 s by default) and
a scheduler. Best configuration, from its README: ``--mode async`` (the supervised parts
as threads of one process; the default ``fork`` mode is a process for each, over the 2
processes every system here gets) on 2 processes, one full and one ``--only-work`` (its
advice for adding capacity), ``--skip-recurring`` (no recurring tasks); 8 threads a worker
(its own benchmarks' count), worker ``polling_interval`` 0.1 (its default), dispatcher
``polling_interval`` 0.1 (its README's examples go to 0.05 for latency-sensitive work),
``preserve_finished_jobs`` off (its queue-health advice when results are not needed),
LISTEN/NOTIFY and SKIP LOCKED on (its defaults); persistent database connections. Bulk:
``enqueue_all``. ``fork-1x8`` is its default mode: the supervisor, a worker process and a
dispatcher process.

Full run: see ``benchmarks/systems/bare_system.py``.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from benchmarks import harness
from benchmarks.environment import TASKS_APP_ENV, TASKS_OPTIONS_ENV
from benchmarks.systems.base import RemoteScheduling, python312

SETTINGS_MODULE = "benchmarks.tasks_settings"


class DjangoTasksSystem(RemoteScheduling):
    """What both peers share: the settings, their database, the client."""

    client_module = "benchmarks.systems.django_tasks_app"
    #: The peer's Django app (its database is named after it) and the app's label (its
    #: migrations and the start of its tables' names).
    app: ClassVar[str]
    label: ClassVar[str]

    @property
    def database(self) -> dict[str, str]:
        return harness.peer_database(self.app)

    def options(self) -> dict[str, Any]:
        """TASKS["default"]["OPTIONS"] of the configuration."""
        return {}

    def consumer_env(self) -> dict[str, str]:
        return {
            **super().consumer_env(),
            "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
            TASKS_APP_ENV: self.app,
            TASKS_OPTIONS_ENV: json.dumps(self.options()),
        }

    def setup(self) -> None:
        harness.create_database(self.database)
        migrate = self.django("migrate", self.label, "--verbosity", "0")
        harness.run_command(migrate, self.consumer_env())

    def reset(self) -> None:
        harness.truncate_tables(self.database, self.label + "_")

    def django(self, *args: str) -> list[str]:
        """A management command in the peer's venv."""
        return [self.client_python(), "-m", "django", *args]


class DjangoTasksDbSystem(DjangoTasksSystem):
    name = "django-tasks-db"
    app = "django_tasks_db"
    label = "django_tasks_database"
    has_bulk = False
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        "2-poll0.1": {"processes": 2, "interval": "0.1"},
        "2-poll1": {"processes": 2, "interval": "1"},
    }

    def describe(self) -> str:
        return (
            f"{self.config['processes']} x `db_worker --interval {self.config['interval']}` "
            "(one task at a time), `run_after`, persistent connections"
        )

    @property
    def executors(self) -> int:
        return int(self.config["processes"])

    def consumer_commands(self) -> list[list[str]]:
        command = self.django(
            "db_worker", "--interval", self.config["interval"], "--no-startup-delay"
        )
        return [[*command, "--verbosity", "0"]] * self.executors


class DjQueueSystem(DjangoTasksSystem):
    name = "djqueue"
    app = label = "dj_queue"
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        "async-2x8": {"mode": "async", "processes": 2, "threads": 8},
        "fork-1x8": {"mode": "fork", "processes": 1, "threads": 8},
    }

    def client_python(self) -> str:
        return python312()

    def describe(self) -> str:
        mode, threads = self.config["mode"], self.config["threads"]
        if mode == "async":
            how = "2 x `dj_queue --mode async` (one full, one `--only-work`)"
        else:
            how = "1 `dj_queue` (fork: supervisor, worker and dispatcher processes)"
        return (
            f"{how}, {threads} threads a worker, dispatcher polling 0.1 s, finished jobs not "
            "kept, `run_after`, `enqueue_all`, persistent connections"
        )

    def options(self) -> dict[str, Any]:
        return {
            "mode": self.config["mode"],
            "workers": [{"queues": "*", "threads": self.config["threads"], "processes": 1}],
            "dispatchers": [{"batch_size": 500, "polling_interval": 0.1}],
            "preserve_finished_jobs": False,
        }

    @property
    def executors(self) -> int:
        return int(self.config["processes"])

    def consumer_commands(self) -> list[list[str]]:
        full = self.django("dj_queue", "--skip-recurring")
        if self.config["mode"] == "fork":
            return [full]
        return [full, self.django("dj_queue", "--only-work")]
