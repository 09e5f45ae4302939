"""Schedules and cancels the fault suite's jobs in a process of its own, as an app would.

``python -m tests.faults.driver`` reads one JSON request on stdin and writes one JSON
answer on stdout. It runs with the environment of ``FaultServices.env()``, so it uses the
suite's database and Redis through the public API (``schedule``, ``schedule_many``,
``cancel``), hand-offs to Redis included, while the pytest process's own database is not
involved at all.

Requests:
- ``{"action": "schedule", "count": N, "start_in": S, "spread": D, "work_ms": W,
  "bulk": true, "cancel": K, "cancel_margin": M}``: N jobs due from S seconds from now
  (negative: in the past) spread evenly over D seconds, in one ``schedule_many`` or with
  one ``schedule`` each; then K of them are cancelled (see below). With ``"queues": [...]``
  job n goes to ``queues[n % len(queues)]`` instead of the job type's queue. With
  ``"then_pause": Q`` the queue Q is paused right after (answer: ``paused_at``).
- ``{"action": "cancel", "ids": [...], "count": K, "margin": M}``: cancel K of the given
  jobs, evenly spread over those still scheduled and due at least M seconds from now.
- ``{"action": "pause", "queue": Q}`` and ``{"action": "resume", "queue": Q}``: pause or
  resume a queue, as the admin or ``delayjobs.pause()`` would; answers whether anything
  changed and when the change was committed (epoch seconds).
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

#: Cancels sent at once (see cancel_some).
CANCEL_THREADS = 10


def schedule(request: dict[str, Any]) -> dict[str, Any]:
    import delayjobs
    from tests.faults.jobs import NAME

    count = int(request["count"])
    now = time.time()
    first = now + float(request["start_in"])
    step = float(request.get("spread", 0.0)) / count
    payload = {"work_ms": request.get("work_ms", 5)}
    run_ats = [datetime.fromtimestamp(first + step * n, UTC) for n in range(count)]
    queues = request.get("queues") or [None]
    specs = [
        {"job_type": NAME, "payload": payload, "run_at": run_at, "queue": queues[n % len(queues)]}
        for n, run_at in enumerate(run_ats)
    ]
    began = time.time()
    if request.get("bulk", True):
        jobs = delayjobs.schedule_many(specs)
        scheduled_at = [time.time()] * count
    else:
        jobs, scheduled_at = [], []
        for spec in specs:
            jobs.append(delayjobs.schedule(**spec))
            scheduled_at.append(time.time())
    ended = time.time()
    ids = [job.pk for job in jobs]
    cancelled = cancel_some(ids, int(request.get("cancel", 0)), request.get("cancel_margin", 1.0))
    paused_at = None
    if request.get("then_pause"):
        from delayjobs import pauses

        pauses.pause(queue=request["then_pause"])
        paused_at = time.time()
    return {
        "paused_at": paused_at,
        "ids": ids,
        "run_at": [run_at.timestamp() for run_at in run_ats],
        "scheduled_at": scheduled_at,
        "began": began,
        "ended": ended,
        "cancelled": cancelled,
    }


def cancel_some(ids: list[int], count: int, margin: float) -> list[int]:
    """Cancel ``count`` jobs spread over those of ``ids`` due ``margin`` s from now or later.

    Returns the jobs that ``cancel()`` reports cancelled: a job that started meanwhile is
    not (``cancel()`` returns 0 for it) and is expected to run.
    """
    from django.db import connections

    import delayjobs
    from delayjobs.models import DelayedJob, JobStatus

    if count <= 0:
        return []
    not_before = datetime.now(UTC) + timedelta(seconds=margin)
    candidates = list(
        DelayedJob.objects.filter(pk__in=ids, status=JobStatus.SCHEDULED, run_at__gte=not_before)
        .order_by("run_at", "pk")
        .values_list("pk", flat=True)
    )
    chosen = [candidates[n * len(candidates) // count] for n in range(min(count, len(candidates)))]

    def cancelled(pk: int) -> bool:
        try:
            return delayjobs.cancel(pk) == 1
        finally:
            connections.close_all()  # this thread's

    # Side by side, as many callers would: one by one, a hundred cancels took 13 s of a
    # loaded machine (each a few round trips), while the jobs they were among fell due.
    with ThreadPoolExecutor(max_workers=CANCEL_THREADS) as pool:
        return [pk for pk, done in zip(chosen, pool.map(cancelled, chosen), strict=True) if done]


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    request = json.load(sys.stdin)
    if request["action"] == "schedule":
        answer = schedule(request)
    elif request["action"] in ("pause", "resume"):
        from delayjobs import pauses

        change = pauses.pause if request["action"] == "pause" else pauses.resume
        answer = {"changed": change(queue=request["queue"]), "at": time.time()}
    elif request["action"] == "cancel":
        answer = {
            "cancelled": cancel_some(request["ids"], int(request["count"]), request["margin"])
        }
    else:
        raise SystemExit(f"unknown action {request['action']!r}")
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
