"""How times and durations read in the admin, the dashboard and the commands."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from delayjobs.core import display


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0, "0.0 ms"),
        (0.0004, "0.4 ms"),
        (0.0099, "9.9 ms"),
        (0.010, "10 ms"),
        (0.0184, "18 ms"),
        (0.9994, "999 ms"),
        (1, "1.0 s"),
        (1.2, "1.2 s"),
        (59.9, "59.9 s"),
        (60, "1 min"),
        (180, "3 min"),
        (245, "4 min 5 s"),
        (3600, "1 h"),
        (7380, "2 h 3 min"),
        (86400, "1 d"),
        (3 * 86400 + 4 * 3600 + 5, "3 d 4 h"),
        (-0.0185, "-18 ms"),
        (-2, "-2.0 s"),
    ],
)
def test_format_duration_at_each_unit_boundary(seconds, text):
    value = None if seconds is None else timedelta(seconds=seconds)
    assert display.format_duration(value) == text


MOMENT = datetime(2026, 1, 31, 13, 5, 9, 42_500, tzinfo=UTC)


def test_moments_are_shown_in_the_current_time_zone_to_the_second_or_the_millisecond():
    with timezone.override(zoneinfo.ZoneInfo("Europe/Paris")):
        assert display.format_time(MOMENT) == "2026-01-31 14:05:09+01:00"
        assert display.format_precise_time(MOMENT) == "2026-01-31 14:05:09.042 CET"
    assert display.format_time(None) == display.format_precise_time(None) == "-"
