"""Which consumers are alive: each one keeps a ``Consumer`` row fresh with its heartbeat.

The dashboard and ``delayjobs_status`` read these rows. A row whose ``last_seen`` is old
belongs to a consumer that died; rows older than STALE_AFTER are deleted by the next
consumer that starts, so they do not pile up.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from datetime import timedelta

from delayjobs.core import clock
from delayjobs.models import Consumer

STALE_AFTER = timedelta(days=1)


def announce(
    worker_id: str, *, queues: Sequence[str], concurrency: int, clock_offset: float | None
) -> None:
    """A consumer starts: write its row (replacing one of the same id), drop stale ones."""
    now = clock.now()
    Consumer.objects.filter(last_seen__lt=now - STALE_AFTER).delete()
    Consumer.objects.update_or_create(
        worker_id=worker_id,
        defaults={
            "hostname": socket.gethostname()[:255],
            "pid": os.getpid(),
            "queues": list(queues),
            "concurrency": concurrency,
            "started_at": now,
            "last_seen": now,
            "processed": 0,
            "database_mode": False,
            "clock_offset": clock_offset,
        },
    )


def beat(
    worker_id: str, *, processed: int, database_mode: bool, clock_offset: float | None
) -> bool:
    """A heartbeat; False if the row is gone (deleted by hand), so the caller re-announces."""
    return bool(
        Consumer.objects.filter(worker_id=worker_id).update(
            last_seen=clock.now(),
            processed=processed,
            database_mode=database_mode,
            clock_offset=clock_offset,
        )
    )


def withdraw(worker_id: str) -> None:
    """A consumer stops cleanly: it is no longer alive."""
    Consumer.objects.filter(worker_id=worker_id).delete()
