"""Handing jobs to the Redis index after their rows are committed, best effort.

The database write is what makes a job exist; Redis is only the timing index. So a
failed hand-off is logged and left to the next pre-loader pass (invariants 1 and 7 of
docs/explanation/design.md), and nothing raised here ever reaches the code that
scheduled the job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.core.signals import setting_changed
from django.db import transaction
from django.dispatch import receiver

from delayjobs.conf import settings
from delayjobs.index.client import describe_target
from delayjobs.index.store import get_store
from delayjobs.lanes import IndexEntry

# The old path: users' LOGGING names it.
logger = logging.getLogger("delayjobs.handoff")

#: After a failed hand-off, skip hand-offs for this long: with Redis down, each attempt
#: would cost the caller a connect timeout, and the pre-loader repairs them anyway.
PAUSE_AFTER_FAILURE = 5.0

_paused_until = 0.0


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
    if soon or later:
        _best_effort(lambda: _apply(soon, later), len(soon) + len(later))


def unindex(entries: Iterable[IndexEntry]) -> None:
    """Drop entries from Redis. Harmless to skip: a popped cancelled job is never claimed."""
    gone = list(entries)
    if gone:
        _best_effort(lambda: _apply([], gone), len(gone))


def index_on_commit(
    entries: list[IndexEntry], using: str | None = None, *, moved: bool = False
) -> None:
    """Index the entries once the current transaction commits (at once if there is none)."""
    if entries:
        transaction.on_commit(
            lambda: index_due_soon(entries, moved=moved), using=using, robust=True
        )


def unindex_on_commit(entries: list[IndexEntry], using: str | None = None) -> None:
    if entries:
        transaction.on_commit(lambda: unindex(entries), using=using, robust=True)


def _apply(add: list[IndexEntry], remove: list[IndexEntry]) -> None:
    store = get_store()
    if add:
        store.add(add)
    if remove:
        store.remove(remove)


def _best_effort(operation: Callable[[], None], count: int) -> None:
    global _paused_until
    if time.monotonic() < _paused_until:
        logger.debug("Redis hand-off of %d job(s) skipped after a recent failure.", count)
        return
    try:
        operation()
    except Exception as exc:  # Redis down, misconfigured cache...: never the caller's problem
        _paused_until = time.monotonic() + PAUSE_AFTER_FAILURE
        logger.warning(
            "Could not hand %d job(s) to Redis at %s (%s: %s); the next pre-loader pass will "
            "load them from the database. Hand-offs pause for %.0f s.",
            count,
            describe_target(),
            type(exc).__name__,
            exc,
            PAUSE_AFTER_FAILURE,
        )


@receiver(setting_changed)
def resume(*, setting: str = "DELAYJOBS", **kwargs: Any) -> None:
    """Forget a recent failure when the Redis settings change (tests, mostly)."""
    global _paused_until
    if setting in ("DELAYJOBS", "CACHES"):
        _paused_until = 0.0
