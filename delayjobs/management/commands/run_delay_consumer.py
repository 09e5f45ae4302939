from __future__ import annotations

import signal
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from delayjobs.consumer import Consumer
from delayjobs.jobtypes import QUEUE_PATTERN, registry
from delayjobs.management.base import configure_logging, positive_int


class Command(BaseCommand):
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
            type=positive_int,
            default=None,
            metavar="N",
            help="Jobs run at once, in threads (default: DELAYJOBS['CONCURRENCY'], 10).",
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

    def handle(
        self,
        *,
        verbosity: int,
        queues: list[str] | None,
        concurrency: int | None,
        burst: bool,
        preload: bool,
        worker_id: str | None,
        **options: Any,
    ) -> None:
        configure_logging(verbosity, self.stdout)
        for queue in queues or ():
            if not QUEUE_PATTERN.match(queue):
                raise CommandError(f"--queue {queue!r}: use 1-100 letters, digits and '_.-'.")
        if queues is None and not registry.names():
            raise CommandError(
                "No job types are registered, so there is nothing to run. Define them with "
                "@delayjobs.register in a 'delay_jobs' module of an installed app."
            )
        consumer = Consumer(
            queues=queues,
            concurrency=concurrency,
            burst=burst,
            preload=preload,
            worker_id=worker_id,
        )
        signal.signal(signal.SIGTERM, consumer.request_stop)
        signal.signal(signal.SIGINT, consumer.request_stop)
        consumer.run()
