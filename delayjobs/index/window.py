"""Loading the window: every scheduled job due soon, from the rows into the Redis index.

Used by the pre-loader's pass, by a consumer back from Redis-down mode, and by resume()
(the jobs of a queue or job type that come back). The callers say which jobs are paused,
so that this module, below ``delayjobs.pauses``, need not import it.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q

from delayjobs.conf import settings
from delayjobs.index.store import RedisStore
from delayjobs.lanes import index_entry
from delayjobs.models import DelayedJob


def load_window(
    store: RedisStore, horizon: datetime, *, leave_out: Q, only: Q | None = None
) -> int:
    """Add every scheduled job due before ``horizon`` (and matching ``only``) to Redis,
    batch by batch, except those matching ``leave_out``: the paused ones
    (``delayjobs.pauses.paused().matching()``), which no consumer would take.
    """
    batch_size = settings.PRELOAD_BATCH_SIZE
    rows = DelayedJob.objects.due_before(horizon)
    if leave_out:
        rows = rows.exclude(leave_out)
    if only is not None:
        rows = rows.filter(only)
    rows = rows.order_by("run_at", "id")
    loaded = 0
    after: tuple[datetime, int] | None = None
    while True:
        page = rows
        if after is not None:
            # Keyset pagination: constant cost per page, unlike OFFSET.
            page = page.filter(run_at__gte=after[0]).exclude(run_at=after[0], id__lte=after[1])
        batch = list(page.values_list("id", "queue", "job_type", "run_at")[:batch_size])
        if not batch:
            return loaded
        store.add(
            index_entry(pk, queue, job_type, run_at.timestamp())
            for pk, queue, job_type, run_at in batch
        )
        loaded += len(batch)
        last_pk, _queue, _job_type, last_run_at = batch[-1]
        after = (last_run_at, last_pk)
        if len(batch) < batch_size:
            return loaded
