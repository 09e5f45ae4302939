"""What the delayjobs commands share: argument validators and logging set-up."""

from __future__ import annotations

import logging
from argparse import ArgumentTypeError
from typing import TextIO

LEVELS = {0: logging.ERROR, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"must be a whole number, got {value!r}") from None
    if number < 1:
        raise ArgumentTypeError(f"must be at least 1, got {number}")
    return number


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
