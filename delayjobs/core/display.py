"""How times and durations read to people: the admin, the dashboard and the commands.

One place, so that a lateness reads the same everywhere: ``0.4 ms``, ``18 ms``, ``1.2 s``,
``3 min``, ``2 h 5 min``. Moments are shown in the current time zone (the project's
TIME_ZONE, or the one a middleware activated), to the second in lists and to the
millisecond where one job is looked at.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

#: Compound units past a minute: the two largest are precise enough ("2 h 5 min").
UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def format_duration(value: timedelta | None) -> str:
    """A duration as people read it: "0.4 ms", "18 ms", "1.2 s", "3 min", "2 h 5 min"."""
    if value is None:
        return "-"
    seconds = value.total_seconds()
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    if seconds < 0.01:
        text = f"{seconds * 1000:.1f} ms"
    elif seconds < 1:
        text = f"{seconds * 1000:.0f} ms"
    elif seconds < 60:
        text = f"{seconds:.1f} s"
    else:
        whole, parts = int(seconds), list[tuple[int, str]]()
        for name, size in UNITS:
            count, whole = divmod(whole, size)
            if count or parts:
                parts.append((count, name))
        shown = parts[:2]
        if len(shown) == 2 and shown[1][0] == 0:
            shown = shown[:1]  # "3 min", not "3 min 0 s"
        text = " ".join(f"{count} {name}" for count, name in shown)
    return sign + text


def format_time(moment: datetime | None) -> str:
    """A moment in the current time zone, to the second: "2025-01-31 14:05:09+00:00"."""
    if moment is None:
        return "-"
    return timezone.localtime(moment).isoformat(sep=" ", timespec="seconds")


def format_precise_time(moment: datetime | None) -> str:
    """A moment in the current time zone, to the millisecond, with the zone's name:
    "2025-01-31 14:05:09.042 CET"."""
    if moment is None:
        return "-"
    local = timezone.localtime(moment)
    return f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d} {local:%Z}"
