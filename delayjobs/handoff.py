"""Handing jobs to the Redis index after their rows are committed, best effort.

The database write is what makes a job exist; Redis is only the timing index. So a
failed hand-off is logged and left to the next pre-loader pass (DESIGN invariants 1, 7).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from django.db import transaction
from redis import RedisError

from delayjobs.conf import settings
from delayjobs.redis_store import IndexEntry, describe_target, get_store

logger = logging.getLogger(__name__)


def index_due_soon(entries: Iterable[IndexEntry], *, moved: bool = False) -> None:
    """Add the entries due inside the pre-load window to Redis; later ones wait for a pass.

    With ``moved``, entries due later are removed instead, in case an earlier time of them
    is still there (a job moved later would otherwise be popped early, only to be skipped).
    """
    horizon = time.time() + settings.PRELOAD_WINDOW.total_seconds()
    soon: list[IndexEntry] = []
    later: list[IndexEntry] = []
    for entry in entries:
        (soon if entry[2] < horizon else later).append(entry)
    if not moved:
        later = []
    try:
        if soon:
            get_store().add(soon)
        if later:
            get_store().remove(later)
    except RedisError as exc:
        logger.warning(
            "Could not hand %d job(s) to Redis at %s (%s: %s); the next pre-loader pass "
            "will load them from the database.",
            len(soon) + len(later),
            describe_target(),
            type(exc).__name__,
            exc,
        )


def unindex(entries: Iterable[IndexEntry]) -> None:
    """Drop entries from Redis. Harmless to skip: a popped cancelled job is never claimed."""
    entries = list(entries)
    if not entries:
        return
    try:
        get_store().remove(entries)
    except RedisError as exc:
        logger.info("Could not remove job(s) from Redis (%s); they will be skipped.", exc)


def index_on_commit(
    entries: list[IndexEntry], using: str | None = None, *, moved: bool = False
) -> None:
    """Index the entries once the current transaction commits (at once if there is none)."""
    if entries:
        transaction.on_commit(lambda: index_due_soon(entries, moved=moved), using=using)


def unindex_on_commit(entries: list[IndexEntry], using: str | None = None) -> None:
    if entries:
        transaction.on_commit(lambda: unindex(entries), using=using)
