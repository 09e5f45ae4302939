from __future__ import annotations

import gc
import os
import signal
import sys
from argparse import ArgumentParser
from collections.abc import Callable
from functools import partial
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from delayjobs.checks import CONSUMER_CHECKS
from delayjobs.conf import AUTO, MAX_PROCESSES, SETTINGS, settings
from delayjobs.core import metrics
from delayjobs.engine.consumer import Consumer
from delayjobs.engine.executors import executor_class
from delayjobs.engine.supervisor import CHILD_STOP_SIGNALS, EXIT_CONFIG, Supervisor, usable_cpus
from delayjobs.jobtypes import registry
from delayjobs.management import base
from delayjobs.management.base import checked, configure_logging, flag
from delayjobs.models import jobs_database

#: Builds the consumer of one process: Consumer with every option already checked.
MakeConsumer = Callable[[], Consumer]


class Command(BaseCommand):
    # Only the checks of what a consumer reads (its settings, the job types), before it
    # starts: Django's full set would import the URLconf (the admin, the HTTP API, every
    # view) into a process that serves none of it, and cost more than the rest of start-up.
    requires_system_checks = [CONSUMER_CHECKS]
    help = (
        "Run delayed jobs when they are due: pop due ids from Redis, claim their rows, run "
        "them in a thread pool, in one consumer process per CPU (--processes). SIGTERM/SIGINT "
        "finish running jobs and exit; a second one exits at once."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="Q",
            help="Queue to consume; repeat for several (default: every queue of a "
            "registered job type).",
        )
        parser.add_argument(
            "--concurrency",
            type=base.concurrency,
            default=None,
            metavar="N",
            help=f"Jobs run at once in each process, in threads, 1 to {base.MAX_CONCURRENCY} "
            f"(default: DELAYJOBS['CONCURRENCY'], 32).",
        )
        parser.add_argument(
            "--processes",
            type=base.processes,
            default=None,
            metavar="N",
            help=f"Consumer processes to run, 1 to {MAX_PROCESSES}, or '{AUTO}': one per CPU "
            f"this command may use (one with --burst, --executor celery or on SQLite). Above 1, "
            f"this process supervises them: it restarts one that dies and passes SIGTERM/SIGINT "
            f"on. Default: DELAYJOBS['PROCESSES'], '{AUTO}'.",
        )
        parser.add_argument("--burst", action="store_true", help="Run what is due now, then exit.")
        parser.add_argument(
            "--no-preload",
            action="store_false",
            dest="preload",
            help="Do not run the pre-loader in this process (run preload_delay_jobs or the "
            "Celery task instead).",
        )
        parser.add_argument(
            "--worker-id",
            default=None,
            help="Name in job rows and logs; with N processes, each is named ID-1 to ID-N "
            "(default: host:pid:random, each process its own).",
        )
        parser.add_argument(
            "--executor",
            default=None,
            metavar="{local,celery}",
            help="Where claimed jobs run: 'local' (this process's threads) or 'celery' (a "
            "Celery task per job, run by your Celery workers). Default: "
            "DELAYJOBS['EXECUTOR'], 'local'.",
        )
        parser.add_argument(
            "--metrics-port",
            type=base.port,
            default=None,
            metavar="PORT",
            help="Serve Prometheus metrics on this port (needs the metrics extra; with more "
            "than one process, from the first, and PROMETHEUS_MULTIPROC_DIR set).",
        )
        parser.add_argument(
            "--metrics-address",
            type=base.ip_address,
            default="127.0.0.1",
            metavar="IP",
            help="The address --metrics-port listens on (default 127.0.0.1: this host only; "
            "0.0.0.0 for every interface).",
        )
        parser.add_argument(
            "--celery-app",
            default=None,
            metavar="MODULE[:ATTRIBUTE]",
            help="With --executor celery: the Celery app to publish with, as `celery -A` "
            "takes it (e.g. proj, proj.celery:app). Default: the app your project loads "
            "when Django starts, as Celery's Django guide sets it up.",
        )

    def handle(
        self,
        *,
        verbosity: int,
        queues: list[str] | None,
        concurrency: int | None,
        burst: bool,
        preload: bool,
        worker_id: str | None,
        executor: str | None = None,
        celery_app: str | None = None,
        metrics_port: int | None = None,
        metrics_address: str = "127.0.0.1",
        processes: object = None,
        **options: Any,
    ) -> None:
        # Checked here, not (only) by argparse: call_command passes keyword options unparsed.
        if queues is not None and (not isinstance(queues, list | tuple) or not queues):
            raise CommandError(
                f"--queue: give a list of queue names, got {base.shown(queues)}; leave it out "
                f"to consume every queue of a registered job type."
            )
        if queues is None and not registry.names():
            raise CommandError(
                "No job types are registered, so there is nothing to run. Define them with "
                "@delayjobs.register in a 'delay_jobs' module of an installed app."
            )
        if concurrency is None:
            concurrency = setting("CONCURRENCY")
        executor = checked(
            "--executor", base.executor, setting("EXECUTOR") if executor is None else executor
        )
        count = how_many(
            checked(
                "--processes",
                base.processes,
                setting("PROCESSES") if processes is None else processes,
            ),
            executor,
            burst=burst is True,
        )
        # Every option is checked before the consumer is built: a CommandError names it.
        make = partial(
            Consumer,
            queues=queues
            and [checked(f"--queue {base.shown(q)}", base.queue_name, q) for q in queues],
            concurrency=checked("--concurrency", base.concurrency, concurrency),
            burst=flag("--burst", burst),
            executor=executor,
            celery_app=None
            if celery_app is None
            else checked(f"--celery-app {base.shown(celery_app)}", base.celery_app, celery_app),
        )
        preload = flag("--no-preload (preload)", preload)
        worker_ids = worker_names(worker_id, count)
        metrics_at = None
        if metrics_port is not None:
            metrics_at = (
                checked("--metrics-port", base.port, metrics_port),
                checked("--metrics-address", base.ip_address, metrics_address),
            )
            if count > 1:
                need_multiprocess_metrics(count)
        if count > 1:
            before_fork(count, executor, celery_app)
        configure_logging(verbosity, self.stdout)
        if count == 1:
            exit_code = consume(partial(make, preload=preload, worker_id=worker_ids[0]), metrics_at)
        else:
            exit_code = Supervisor(
                count,
                partial(
                    self._child,
                    make=make,
                    preload=preload,
                    worker_ids=worker_ids,
                    metrics_at=metrics_at,
                ),
                burst=burst,
            ).run()
        if exit_code:
            # Not a CommandError: nothing was wrong with the command; a supervisor should
            # simply start a fresh consumer (see EXIT_ALL_THREADS_STUCK).
            sys.exit(exit_code)

    def _child(
        self,
        slot: int,
        *,
        make: Callable[..., Consumer],
        preload: bool,
        worker_ids: list[str | None],
        metrics_at: tuple[int, str] | None,
    ) -> int:
        """Consumer process ``slot`` (1 to N) of a supervisor. The first runs the pre-loader
        (one pass at a time per host is enough; its Redis lock keeps it to one across hosts)
        and serves the metrics, if asked to."""
        first = slot == 1
        try:
            return consume(
                partial(make, preload=preload and first, worker_id=worker_ids[slot - 1]),
                metrics_at if first else None,
                stop_signals=CHILD_STOP_SIGNALS,
            )
        except CommandError as exc:
            self.stderr.write(f"CommandError: {exc}")
            return EXIT_CONFIG


def consume(
    make: MakeConsumer,
    metrics_at: tuple[int, str] | None,
    stop_signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT),
) -> int:
    """Build a consumer and run it in this process until it stops; its exit code."""
    try:
        consumer = make()
        if metrics_at is not None:
            serve_metrics(*metrics_at)
    except ImproperlyConfigured as exc:
        raise CommandError(str(exc)) from None
    for signum in stop_signals:
        signal.signal(signum, consumer.request_stop)
    if hasattr(signal, "pthread_sigmask"):  # not on Windows
        # A supervisor's child has them blocked until its handler is in place: one sent
        # meanwhile stops it now, gracefully, instead of killing it.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
    freeze_startup_objects()
    return consumer.run()


def before_fork(count: int, executor: str, celery_app: str | None) -> None:
    """What would fail in every child alike fails here instead, once, before any fork: a
    setting the consumer reads, an option its executor refuses."""
    if not hasattr(os, "fork"):
        raise CommandError(f"--processes {count}: this platform cannot fork; use --processes 1.")
    if executor == "celery":
        # Celery's workers run the jobs: a consumer process only claims and publishes, and
        # a Celery app (its broker pools) is not ours to fork.
        raise CommandError(
            f"--processes {count} with --executor celery: one consumer process claims and "
            f"publishes for every Celery worker; use --processes 1 (what '{AUTO}' means with "
            f"it), and more commands, on more hosts, for more."
        )
    for row in SETTINGS:
        setting(row.name)
    try:
        executor_class(executor).prepare(celery_app)
    except ImproperlyConfigured as exc:
        raise CommandError(str(exc)) from None


def how_many(processes: int | str, executor: str, *, burst: bool = False) -> int:
    """The number of consumer processes ``--processes`` asks for: 'auto' is one per CPU;
    one with the Celery executor, whose workers run the jobs (a consumer process there only
    claims and publishes); one on SQLite, which lets one process write at a time (more
    would wait on each other's writes); and one with ``--burst``, a drain of what is due
    now for cron and tests, which a test calls in its own process and transaction."""
    if processes != AUTO:
        return int(processes)
    if burst or executor == "celery" or not hasattr(os, "fork"):
        return 1
    if connections[jobs_database()].vendor == "sqlite":
        return 1
    return min(usable_cpus(), MAX_PROCESSES)


def worker_names(worker_id: object, count: int) -> list[str | None]:
    """Each process's --worker-id: as given for one process, ID-1 to ID-N for N; None for
    the default (host:pid:random, made by each process, so each has its own pid in it)."""
    if worker_id is None:
        return [None] * count
    name = checked(f"--worker-id {base.shown(worker_id)}", base.worker_id, worker_id)
    if count == 1:
        return [name]
    return [
        checked(
            f"--worker-id {base.shown(name)} (process {slot})", base.worker_id, f"{name}-{slot}"
        )
        for slot in range(1, count + 1)
    ]


def need_multiprocess_metrics(count: int) -> None:
    """--metrics-port with several processes: one port cannot be bound by each, and the
    first process's figures alone would be a fraction of the host's."""
    if not metrics.ENABLED:
        raise CommandError(
            "--metrics-port needs prometheus_client: pip install 'django-delayjobs[metrics]'."
        )
    if not metrics.multiprocess():
        raise CommandError(
            f"--metrics-port with {count} processes needs prometheus_client's multiprocess "
            f"mode: set {metrics.MULTIPROCESS_ENV} to an empty directory before starting the "
            f"command (the first process then serves every process's figures), or run "
            f"--processes 1."
        )


def setting(name: str) -> Any:
    """``DELAYJOBS[name]`` as read; a bad value is a CommandError naming the setting
    (call_command skips the system checks that would have reported it first)."""
    try:
        return getattr(settings, name)
    except ImproperlyConfigured as exc:
        raise CommandError(str(exc)) from None


def serve_metrics(port: int, address: str) -> None:
    try:
        metrics.serve(port, address)
    except OSError as exc:
        raise CommandError(f"--metrics-port {port}: cannot listen on {address} ({exc}).") from None


def freeze_startup_objects() -> None:
    """Leave what start-up loaded (modules, classes, code: most of this process's objects)
    out of every later garbage collection.

    They live as long as the process does, yet a full collection would walk them all again,
    holding the GIL for tens of milliseconds while a due job waits for its thread to start.
    Objects created from now on are collected as usual. No collection first: it would walk
    them all once more (about 30 ms) before the first claim, and start-up leaves no garbage
    to speak of (a collection there finds none), so freezing keeps nothing alive.
    """
    gc.freeze()
