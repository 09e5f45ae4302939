"""What the delayjobs commands share: option validators and logging set-up.

The validators raise ArgumentTypeError, so that one may serve as an argparse ``type``;
``handle()`` runs them (again) through ``checked()``, because ``call_command`` passes
keyword options to ``handle()`` without parsing them.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from argparse import ArgumentParser, ArgumentTypeError
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TextIO, TypeVar

from django.core.management.base import BaseCommand, CommandError, OutputWrapper

from delayjobs import pauses
from delayjobs.conf import AUTO, BY_NAME, EXECUTORS, MAX_CONCURRENCY
from delayjobs.core.db import max_length
from delayjobs.exceptions import InvalidJob
from delayjobs.models import ACTIVE_STATUSES, DelayedJob, JobStatus, Schedule
from delayjobs.names import QUEUE_RULE, is_queue
from delayjobs.recurring.definitions import pause_schedule, resume_schedule, sync_code_schedules

LEVELS = {0: logging.ERROR, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}
WORKER_ID_MAX_LENGTH = max_length(DelayedJob, "worker_id")

T = TypeVar("T")

DURATION_PATTERN = re.compile(r"([0-9]{1,9})([smhd])")
DURATION_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
#: Longer than any retention anyone means, and far from datetime's limits.
MAX_DURATION = timedelta(days=36500)
MAX_BATCH_SIZE = 100_000
#: What prune_delay_jobs may delete: jobs that will not run again unless retried.
FINISHED_STATUSES = tuple(status for status in JobStatus if status not in ACTIVE_STATUSES)


def concurrency(value: object) -> int:
    """--concurrency: a whole number of threads, 1 to MAX_CONCURRENCY."""
    number = whole_number(value)
    if number < 1:
        raise ArgumentTypeError(f"must be at least 1, got {shown(number)}")
    if number > MAX_CONCURRENCY:
        raise ArgumentTypeError(
            f"must be at most {MAX_CONCURRENCY} (one thread each), got {shown(number)}"
        )
    return number


def processes(value: object) -> int | str:
    """--processes: 'auto' or a whole number of consumer processes, 1 to MAX_PROCESSES; the
    same rule as the PROCESSES setting."""
    kind = BY_NAME["PROCESSES"].kind
    number = value
    if isinstance(value, str) and value != AUTO:
        try:
            number = whole_number(value)
        except ArgumentTypeError:
            number = None
    try:
        read: int | str = kind.read(number)
    except ValueError:
        raise ArgumentTypeError(f"use {kind.expected()}, got {shown(value)}") from None
    return read


def queue_name(value: object) -> str:
    """--queue: a queue name as schedule() accepts it."""
    if not is_queue(value):
        raise ArgumentTypeError(f"use {QUEUE_RULE}")
    return str(value)


def worker_id(value: object) -> str:
    """--worker-id: stored in job rows, so it must fit there and be printable text."""
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= WORKER_ID_MAX_LENGTH
        or not value.isprintable()  # also refuses NUL, newlines and lone surrogates
    ):
        raise ArgumentTypeError(f"use 1-{WORKER_ID_MAX_LENGTH} printable characters")
    return value


def executor(value: object) -> str:
    """--executor: where a consumer runs the jobs it claims."""
    if value not in EXECUTORS:
        raise ArgumentTypeError(f"use one of {', '.join(EXECUTORS)}, got {shown(value)}")
    return str(value)


def port(value: object) -> int:
    """--metrics-port: a TCP port, 1 to 65535."""
    number = whole_number(value)
    if not 1 <= number <= 65535:
        raise ArgumentTypeError(f"must be a TCP port, 1 to 65535, got {shown(number)}")
    return number


def ip_address(value: object) -> str:
    """--metrics-address: an IPv4 or IPv6 address to listen on."""
    try:
        return str(ipaddress.ip_address(value if isinstance(value, str) else ""))
    except ValueError:
        raise ArgumentTypeError(
            f"use an IP address such as 127.0.0.1 or 0.0.0.0, got {shown(value)}"
        ) from None


#: What `celery -A` takes: a dotted module path, optionally ":attribute.path".
CELERY_APP_PATTERN = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?")


def celery_app(value: object) -> str:
    """--celery-app: where the Celery app is, as ``celery -A`` takes it."""
    if not isinstance(value, str) or not CELERY_APP_PATTERN.fullmatch(value):
        raise ArgumentTypeError(
            f"use a module path, optionally with ':attribute', as for celery -A (proj, "
            f"proj.celery:app), got {shown(value)}"
        )
    return value


def duration(value: object) -> timedelta:
    """--older-than: a whole number and a unit, as in 90s, 30m, 12h or 14d. A timedelta is
    one already parsed: call_command parses a required option, then hands handle() the
    text it was given, so handle() checks it again either way."""
    if isinstance(value, timedelta):
        length = value
    else:
        match = DURATION_PATTERN.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise ArgumentTypeError(
                f"use a whole number and a unit (s, m, h or d) as in 90s, 30m, 12h or 14d, "
                f"got {shown(value)}"
            )
        number, unit = match.groups()
        length = timedelta(**{DURATION_UNITS[unit]: int(number)})
    if not timedelta(0) < length <= MAX_DURATION:
        raise ArgumentTypeError(
            f"must be more than 0 and at most {MAX_DURATION.days}d, got {shown(value)}"
        )
    return length


def batch_size(value: object) -> int:
    """--batch-size: rows per delete, 1 to MAX_BATCH_SIZE."""
    number = whole_number(value)
    if not 1 <= number <= MAX_BATCH_SIZE:
        raise ArgumentTypeError(f"must be 1 to {MAX_BATCH_SIZE}, got {shown(number)}")
    return number


def finished_status(value: object) -> str:
    """--status of prune_delay_jobs: a finished status."""
    finished = ", ".join(FINISHED_STATUSES)
    if value in ACTIVE_STATUSES:
        raise ArgumentTypeError(f"{value} jobs are active and are never pruned; use {finished}")
    if value not in FINISHED_STATUSES:
        raise ArgumentTypeError(f"use {finished}, got {shown(value)}")
    return str(value)


def whole_number(value: object) -> int:
    """An int, or its decimal text (as from a command line); not a bool."""
    number = value
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, int):
        raise ArgumentTypeError(f"must be a whole number, got {shown(value)}")
    return number


def checked(option: str, validate: Callable[[Any], T], value: object) -> T:
    """``validate(value)``, with a refusal as a CommandError naming the option."""
    try:
        return validate(value)
    except ArgumentTypeError as exc:
        raise CommandError(f"{option}: {exc}.") from None


def flag(option: str, value: object) -> bool:
    """A store_true/store_false option given to call_command: only True or False."""
    if not isinstance(value, bool):
        raise CommandError(f"{option} is a flag: True or False, got {shown(value)}.")
    return value


def shown(value: object, width: int = 80) -> str:
    """``repr(value)`` cut to ``width`` characters, for error messages."""
    try:
        text = repr(value)
    except ValueError:  # an int of more than sys.get_int_max_str_digits() digits
        return f"a {type(value).__name__} too large to print"
    return text if len(text) <= width else f"{text[: width - 3]}..."


def configure_logging(verbosity: int, stream: TextIO | OutputWrapper) -> None:
    """Show delayjobs' log lines on the command's output, unless LOGGING already does."""
    logger = logging.getLogger("delayjobs")
    if logger.handlers or logging.getLogger().handlers:
        return  # the project's LOGGING decides, levels included
    logger.setLevel(LEVELS.get(verbosity, logging.DEBUG))
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        logging.Formatter("%(asctime)s.%(msecs)03d %(levelname)s %(message)s", "%H:%M:%S")
    )
    logger.addHandler(handler)


class PauseCommand(BaseCommand):
    """pause_delay_jobs and resume_delay_jobs: one queue or one job type per call."""

    #: False: pause; True: resume.
    resume: bool

    def add_arguments(self, parser: ArgumentParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--queue", metavar="Q", type=queue_name, help="A queue.")
        target.add_argument("--job-type", metavar="T", help="A registered job type's name.")
        target.add_argument(
            "--schedule",
            metavar="S",
            help="A recurring schedule's name (a code schedule's is its job type's name).",
        )

    def handle(
        self, *, queue: object, job_type: object, schedule: object = None, **options: Any
    ) -> None:
        # call_command passes a required group's option through argparse, but a keyword
        # given as None, or both keywords, reach handle() as they are.
        if [queue, job_type, schedule].count(None) != 2:
            raise CommandError("Give --queue, --job-type or --schedule, one of them.")
        if schedule is not None:
            self._schedule(schedule)
            return
        if queue is not None:
            option, name = "queue", checked(f"--queue {shown(queue)}", queue_name, queue)
        elif isinstance(job_type, str):
            option, name = "job_type", job_type
        else:
            raise CommandError(f"--job-type: give a job type's name, got {shown(job_type)}.")
        target = {option: name}
        what = f"{option.replace('_', ' ')} {name}"
        # Not str.capitalize(): that would lower-case the name too.
        subject = what[0].upper() + what[1:]
        try:
            changed = (
                pauses.resume(**target) if self.resume else pauses.pause(**target, by="manage.py")
            )
        except InvalidJob as exc:  # an unknown job type, above all
            raise CommandError(str(exc)) from None
        if self.resume:
            self.stdout.write(
                f"Resumed {what}: its scheduled jobs run again where they were."
                if changed
                else f"{subject} was not paused: nothing changed."
            )
        else:
            self.stdout.write(
                f"Paused {what}: no consumer claims its jobs until resume_delay_jobs; they stay "
                f"scheduled."
                if changed
                else f"{subject} was already paused: nothing changed."
            )

    def _schedule(self, name: object) -> None:
        if not isinstance(name, str) or not name:
            raise CommandError(f"--schedule: give a schedule's name, got {shown(name)}.")
        problems = sync_code_schedules()  # a code schedule before any pass
        row = Schedule.objects.filter(name=name).first()
        if row is None:
            known = ", ".join(Schedule.objects.values_list("name", flat=True)) or "none"
            raise CommandError(f"No schedule named {shown(name)}. Schedules: {known}.")
        was_enabled = row.enabled
        if self.resume:
            resume_schedule(row)
            self.stdout.write(
                f"Resumed schedule {name}: it ticks again from its next tick."
                if not was_enabled
                else f"Schedule {name} was not paused: nothing changed."
            )
        else:
            pause_schedule(row, by="manage.py")
            self.stdout.write(
                f"Paused schedule {name}: no tick makes a job, and the jobs of its coming "
                f"ticks are cancelled, until resume_delay_jobs --schedule {name}."
                if was_enabled
                else f"Schedule {name} was already paused: nothing changed."
            )
        for problem in problems:
            self.stderr.write(problem)
