"""Compatibility path: the code lives in delayjobs.index.handoff."""

from delayjobs.index.handoff import (
    PAUSE_AFTER_FAILURE,
    index_due_soon,
    index_on_commit,
    resume,
    unindex,
    unindex_on_commit,
)

__all__ = [
    "PAUSE_AFTER_FAILURE",
    "index_due_soon",
    "index_on_commit",
    "resume",
    "unindex",
    "unindex_on_commit",
]
