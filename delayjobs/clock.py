"""Compatibility path: the code lives in delayjobs.core.clock."""

from delayjobs.core.clock import (
    SAMPLES,
    SERVER_TIME_SQL,
    SYNC_INTERVAL,
    SharedClock,
    epoch,
    now,
    read_database_time,
    report_offset,
    shared,
    time_ns,
)

__all__ = [
    "SAMPLES",
    "SERVER_TIME_SQL",
    "SYNC_INTERVAL",
    "SharedClock",
    "epoch",
    "now",
    "read_database_time",
    "report_offset",
    "shared",
    "time_ns",
]
