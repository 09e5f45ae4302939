"""Compatibility path: the code lives in delayjobs.transitions.bulk."""

from delayjobs.transitions.bulk import (
    ATTEMPT_FIELDS,
    BULK_CREATE_BATCH,
    insert_attempts,
    insert_jobs,
)

__all__ = ["ATTEMPT_FIELDS", "BULK_CREATE_BATCH", "insert_attempts", "insert_jobs"]
