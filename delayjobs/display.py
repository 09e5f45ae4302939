"""Compatibility path: the code lives in delayjobs.core.display."""

from delayjobs.core.display import UNITS, format_duration, format_precise_time, format_time

__all__ = ["UNITS", "format_duration", "format_precise_time", "format_time"]
