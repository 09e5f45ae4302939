"""What the fleet-wide limits are doing, for the admin, ``delayjobs_status`` and metrics:
per limit group and key, the slots in use (and those consumers reserved), the starts in
the rate's window (reserved ones included) and the jobs due but waiting. Read from the
rows (the truth the claims decide by); no query at all for a project without limits.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Q, Sum

from delayjobs.core.display import format_duration
from delayjobs.jobtypes import limits_of, registry
from delayjobs.limits import KEY_SEPARATOR, Limits
from delayjobs.models import DelayedJob, JobStatus, LimitReservation, LimitStart


@dataclass(frozen=True)
class LimitUsage:
    """One limit key's figures: its group, its key (None: the whole group)."""

    group: str
    key: str | None
    job_types: list[str]
    global_concurrency: int | None
    #: The rate as ``(count, per)``, or None.
    rate: tuple[int, timedelta] | None
    running: int
    window_starts: int
    waiting: int
    #: Slots consumers reserved for their next claims, counted as in use on top of
    #: ``running`` (delayjobs.transitions.reservations).
    reserved: int = 0

    @property
    def label(self) -> str:
        return self.group if self.key is None else f"{self.group} {KEY_SEPARATOR} {self.key}"

    @property
    def shown_running(self) -> str:
        """Running out of the global concurrency, as people read it: "2 / 3" ("-": none)."""
        if self.global_concurrency is None:
            return "-"
        if self.reserved:
            return f"{self.running} + {self.reserved} reserved / {self.global_concurrency}"
        return f"{self.running} / {self.global_concurrency}"

    @property
    def shown_starts(self) -> str:
        """Starts in the window out of the rate: "18 / 20 per 1.0 s" ("-": no rate)."""
        if self.rate is None:
            return "-"
        count, per = self.rate
        return f"{self.window_starts} / {count} per {format_duration(per)}"


def limit_groups() -> dict[str, tuple[Limits, list[str]]]:
    """Every limit group of the registered types: its limits and its types."""
    groups: dict[str, tuple[Limits, list[str]]] = {}
    for jobtype in registry:
        limits = limits_of(jobtype)
        if limits is not None:
            groups.setdefault(limits.group, (limits, []))[1].append(jobtype.name)
    return groups


def limit_usage(now: datetime) -> list[LimitUsage]:
    """Every limit key with jobs running, waiting or starts in its window, busiest first."""
    groups = limit_groups()
    if not groups:
        return []
    running: dict[str, int] = defaultdict(int)
    waiting: dict[str, int] = defaultdict(int)
    rows = (
        DelayedJob.objects.filter(limit_key__isnull=False)
        .filter(Q(status=JobStatus.RUNNING) | Q(status=JobStatus.SCHEDULED, run_at__lte=now))
        .order_by()
        .values_list("limit_key", "status")
        .annotate(n=Count("pk"))
    )
    for key, status, n in rows:
        (running if status == JobStatus.RUNNING else waiting)[key or ""] += n
    reserved: dict[str, int] = dict(
        LimitReservation.objects.filter(until__gt=now.timestamp())
        .order_by()
        .values_list("limit_key")
        .annotate(n=Sum("slots"))
    )
    starts: dict[str, int] = {}
    for group, (limits, _types) in groups.items():
        if limits.rate is None:
            continue
        since = now.timestamp() - limits.rate.per.total_seconds()
        in_group = Q(limit_key=group) | Q(limit_key__startswith=group + KEY_SEPARATOR)
        starts.update(
            LimitStart.objects.filter(in_group, started__gt=since)
            .order_by()
            .values_list("limit_key")
            .annotate(n=Sum("count"))
        )
    usage = []
    for stored in sorted(set(running) | set(waiting) | set(starts) | set(reserved)):
        group, _sep, key = stored.partition(KEY_SEPARATOR)
        if group not in groups:
            continue  # a type no longer limited, or not registered here
        limits, types = groups[group]
        usage.append(
            LimitUsage(
                group=group,
                key=key or None,
                job_types=sorted(types),
                global_concurrency=limits.global_concurrency,
                rate=(limits.rate.count, limits.rate.per) if limits.rate else None,
                running=running.get(stored, 0),
                window_starts=starts.get(stored, 0),
                waiting=waiting.get(stored, 0),
                reserved=reserved.get(stored, 0),
            )
        )
    usage.sort(key=lambda u: (-(u.running + u.waiting), u.group, u.key or ""))
    return usage
