"""What the delayjobs commands share: option validators and logging set-up.

The validators raise ArgumentTypeError, so that one may serve as an argparse ``type``;
``handle()`` runs them (again) through ``checked()``, because ``call_command`` passes
keyword options to ``handle()`` without parsing them.
"""

from __future__ import annotations

import logging
from argparse import ArgumentTypeError
from collections.abc import Callable
from typing import Any, TextIO, TypeVar

from django.core.management.base import CommandError

from delayjobs.checks import MAX_CONCURRENCY
from delayjobs.jobtypes import QUEUE_PATTERN
from delayjobs.models import DelayedJob

LEVELS = {0: logging.ERROR, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}
WORKER_ID_MAX_LENGTH = DelayedJob._meta.get_field("worker_id").max_length

T = TypeVar("T")


def concurrency(value: object) -> int:
    """--concurrency: a whole number of threads, 1 to MAX_CONCURRENCY."""
    number = value
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, int):
        raise ArgumentTypeError(f"must be a whole number, got {shown(value)}")
    if number < 1:
        raise ArgumentTypeError(f"must be at least 1, got {shown(number)}")
    if number > MAX_CONCURRENCY:
        raise ArgumentTypeError(
            f"must be at most {MAX_CONCURRENCY} (one thread each), got {shown(number)}"
        )
    return number


def queue_name(value: object) -> str:
    """--queue: a queue name as schedule() accepts it."""
    # fullmatch: the pattern's "$" would also match before a trailing newline.
    if not isinstance(value, str) or not QUEUE_PATTERN.fullmatch(value):
        raise ArgumentTypeError("use 1-100 letters, digits and '_.-'")
    return value


def worker_id(value: object) -> str:
    """--worker-id: stored in job rows, so it must fit there and be printable text."""
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= WORKER_ID_MAX_LENGTH
        or not value.isprintable()  # also refuses NUL, newlines and lone surrogates
    ):
        raise ArgumentTypeError(f"use 1-{WORKER_ID_MAX_LENGTH} printable characters")
    return value


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


def configure_logging(verbosity: int, stream: TextIO) -> None:
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
