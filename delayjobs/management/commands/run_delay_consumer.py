from __future__ import annotations

import gc
import signal
import sys
from argparse import ArgumentParser
from functools import partial
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from delayjobs.checks import CONSUMER_CHECKS
from delayjobs.conf import settings
from delayjobs.core import metrics
from delayjobs.engine.consumer import Consumer
from delayjobs.jobtypes import registry
from delayjobs.management import base
from delayjobs.management.base import checked, configure_logging, flag


class Command(BaseCommand):
    # Only the checks of what a consumer reads (its settings, the job types), before it
    # starts: Django's full set would import the URLconf (the admin, the HTTP API, every
    # view) into a process that serves none of it, and cost more than the rest of start-up.
    requires_system_checks = [CONSUMER_CHECKS]
    help = (
        "Run delayed jobs when they are due: pop due ids from Redis, claim their rows, run "
        "them in a thread pool. SIGTERM/SIGINT finish running jobs and exit; a second one "
        "exits at once."
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
            help=f"Jobs run at once, in threads, 1 to {base.MAX_CONCURRENCY} (default: "
            f"DELAYJOBS['CONCURRENCY'], 10).",
        )
        parser.add_argument("--burst", action="store_true", help="Run what is due now, then exit.")
        parser.add_argument(
            "--no-preload",
            action="store_false",
            dest="preload",
            help="Do not run the pre-loader in this process (run preload_delay_jobs or the "
            "Celery task instead).",
        )
        parser.add_argument("--worker-id", default=None, help="Name in job rows and logs.")
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
            help="Serve Prometheus metrics on this port (needs the metrics extra).",
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
        # Every option is checked before the consumer is built: a CommandError names it.
        new_consumer = partial(
            Consumer,
            queues=queues
            and [checked(f"--queue {base.shown(q)}", base.queue_name, q) for q in queues],
            concurrency=checked("--concurrency", base.concurrency, concurrency),
            burst=flag("--burst", burst),
            preload=flag("--no-preload (preload)", preload),
            worker_id=None
            if worker_id is None
            else checked(f"--worker-id {base.shown(worker_id)}", base.worker_id, worker_id),
            executor=checked(
                "--executor", base.executor, setting("EXECUTOR") if executor is None else executor
            ),
            celery_app=None
            if celery_app is None
            else checked(f"--celery-app {base.shown(celery_app)}", base.celery_app, celery_app),
        )
        configure_logging(verbosity, self.stdout)
        try:
            consumer = new_consumer()
            if metrics_port is not None:
                serve_metrics(
                    checked("--metrics-port", base.port, metrics_port),
                    checked("--metrics-address", base.ip_address, metrics_address),
                )
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        signal.signal(signal.SIGTERM, consumer.request_stop)
        signal.signal(signal.SIGINT, consumer.request_stop)
        freeze_startup_objects()
        exit_code = consumer.run()
        if exit_code:
            # Not a CommandError: nothing was wrong with the command; a supervisor should
            # simply start a fresh consumer (see EXIT_ALL_THREADS_STUCK).
            sys.exit(exit_code)


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
