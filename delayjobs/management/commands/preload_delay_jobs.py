from __future__ import annotations

import signal
import threading
from argparse import ArgumentParser
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand

from delayjobs.engine import preloader
from delayjobs.management.base import configure_logging, flag


class Command(BaseCommand):
    help = (
        "Run one pre-loader pass: return jobs with expired leases, run job types' plan() "
        "hooks, load jobs due within PRELOAD_WINDOW into Redis. --loop repeats it every "
        "PRELOAD_INTERVAL."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--loop", action="store_true", help="Run a pass every PRELOAD_INTERVAL until stopped."
        )

    def handle(self, *, verbosity: int, loop: bool, **options: Any) -> None:
        # Checked: call_command passes keyword options unparsed, and loop="no" is truthy.
        loop = flag("--loop", loop)
        configure_logging(verbosity, self.stdout)
        if not loop:
            result = preloader.preload()
            if verbosity:
                self.stdout.write(f"Pre-loader pass: {result}")
            return
        stop = threading.Event()

        def request_stop(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        preloader.run_forever(stop)
