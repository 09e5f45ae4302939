"""The checks of the DELAYJOBS settings: each read by its row of ``delayjobs.conf.SETTINGS``
(the same rule ``conf.settings`` reads it by), then what only settings together can get
wrong."""

from __future__ import annotations

from typing import Any

from django.core import checks

from delayjobs.conf import SETTINGS


def read_each(config: dict[str, Any]) -> tuple[list[checks.CheckMessage], dict[str, Any]]:
    """An Error (the row's id and hint) for each setting whose value its row refuses, and
    the values of the others as read, for the checks of settings together."""
    messages: list[checks.CheckMessage] = []
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        raw = config.get(setting.name, setting.default)
        try:
            values[setting.name] = setting.kind.read(raw)
        except ValueError:
            messages.append(
                checks.Error(
                    setting.problem(raw),
                    hint=setting.kind.advice(raw) or setting.hint,
                    id=setting.check_id,
                )
            )
    return messages, values


def check_window(values: dict[str, Any]) -> list[checks.CheckMessage]:
    """The window is longer than the interval (each read fine: a bad one is reported once,
    by its own row)."""
    interval, window = values.get("PRELOAD_INTERVAL"), values.get("PRELOAD_WINDOW")
    if interval is None or window is None or window > interval:
        return []
    return [
        checks.Error(
            f"PRELOAD_WINDOW ({window.total_seconds():g} s) must be longer than "
            f"PRELOAD_INTERVAL ({interval.total_seconds():g} s).",
            hint="Otherwise a job can come due between two pre-loader passes without ever "
            "having been loaded into Redis, and fire up to an interval late. A window of "
            "3-6 intervals is a good choice.",
            id="delayjobs.E006",
        )
    ]
