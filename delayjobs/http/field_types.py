"""The JSON types a request field may have (``Kind``): each one's JSON Schema and its
conversion of a decoded JSON value (or query text) to Python, with the API's own messages.
Conversions only check JSON types and turn text into datetimes and seconds into
timedeltas; the rules of a valid job stay in ``delayjobs.api``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from delayjobs.conf import settings as conf

Schema = dict[str, Any]

#: JSON Schema (ECMA-262) for text without NUL, which PostgreSQL cannot compare or store.
NO_NUL = "^[^\\u0000]*$"
TEXT_SCHEMA: Schema = {"type": "string", "pattern": NO_NUL}


class FieldError(ValueError):
    """A value of the wrong shape; ``errors`` maps sub-fields to messages (nested values)."""

    def __init__(self, message: str, errors: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.errors = dict(errors or {})


@dataclass(frozen=True)
class Kind:
    """A JSON type: its schema, and the conversion of a decoded JSON value (or query text).

    ``schema`` may be a function: a bound that depends on settings or on the time (the
    latest run_at) is computed each time the document is built."""

    schema: Schema | Callable[[], Schema]
    convert: Callable[[Any], Any]

    def json_schema(self) -> Schema:
        return self.schema() if callable(self.schema) else dict(self.schema)


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise FieldError(f"must be a string, got {json_type(value)}.")
    return value


def _text(value: Any) -> str:
    """A string the database can compare: PostgreSQL refuses NUL characters and lone
    surrogates in a query, and that must be a 400, not a server error."""
    text = _string(value)
    if "\x00" in text:
        raise FieldError("must not contain NUL characters.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise FieldError("must be valid Unicode text (it holds a lone surrogate).") from None
    return text


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise FieldError(f"must be true or false, got {json_type(value)}.")
    return value


def _integer(value: Any) -> int:
    # JSON has no integer type: 3.0 is accepted as 3, 3.5 is not; true is not 1.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(f"must be an integer, got {json_type(value)}.")
    return value


def number_text(value: float) -> str:
    """A JSON number as a person would write it: 3600, 90.5, 1e+300 (not 3600.0)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def _seconds(value: Any) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise FieldError(f"must be a number of seconds, got {json_type(value)}.")
    if value < 0:
        raise FieldError(f"must be 0 or more seconds, got {number_text(value)}.")
    try:
        return timedelta(seconds=value)
    except OverflowError:
        raise FieldError(f"{number_text(value)} seconds is too long.") from None


def seconds_between(low: timedelta, high: timedelta) -> Kind:
    """A number of seconds from ``low`` to ``high``, as a timedelta."""
    low_text, high_text = number_text(low.total_seconds()), number_text(high.total_seconds())
    days = f" ({high.days} days)" if high.days and high == timedelta(days=high.days) else ""
    message = f"must be from {low_text} to {high_text} seconds{days}"

    def convert(value: Any) -> timedelta:
        delta = _seconds(value)
        # The number as sent, not the timedelta rounded to microseconds: 0.0009999996 is
        # below the documented minimum of 0.001 even though it rounds up to it.
        if not low.total_seconds() <= value <= high.total_seconds():
            raise FieldError(f"{message}, got {number_text(value)}.")
        return delta

    schema = {"type": "number", "minimum": low.total_seconds(), "maximum": high.total_seconds()}
    return Kind(schema, convert)


def integer_between(low: int, high: int) -> Kind:
    """An integer from ``low`` to ``high``."""

    def convert(value: Any) -> int:
        number = _integer(value)
        if not low <= number <= high:
            shown = number_text(value) if isinstance(value, float) else str(number)
            raise FieldError(f"must be an integer from {low} to {high}, got {shown}.")
        return number

    return Kind({"type": "integer", "minimum": low, "maximum": high}, convert)


#: The latest moment a job can be due: Python's (and so the API's) last representable time.
LATEST = datetime.max.replace(tzinfo=UTC)


def _delay(value: Any) -> timedelta:
    delay = _seconds(value)
    # The job must be due at a time that exists: before the end of the year 9999 (UTC).
    if delay >= LATEST - timezone.now() - timedelta(days=1):
        raise FieldError(
            f"{number_text(value)} seconds from now is after the year 9999: no job can be due then."
        )
    return delay


def _delay_schema() -> Schema:
    # A longer delay is refused by schedule() (DELAYJOBS["MAX_SCHEDULE_AHEAD"]): say so.
    return {"type": "number", "minimum": 0, "maximum": conf.MAX_SCHEDULE_AHEAD.total_seconds()}


#: RFC 3339's date-time (what JSON Schema's "date-time" format means): seconds required,
#: an offset required ("Z" or +hh:mm), T and Z in either case. ``{year}`` is filled in.
RFC3339 = (
    r"^{year}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])[Tt](?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d"
    r"(?:\.\d+)?(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)$"
)
DATE_TIME_PATTERN = re.compile(RFC3339.format(year=r"\d{4}"))


def digits_between(low: int, high: int, width: int) -> str:
    """A regular expression matching the numbers from ``low`` to ``high`` written with
    ``width`` digits (leading zeros): 0002 to 2125 for the years a job may be due in."""
    return _digit_range(str(low).zfill(width), str(high).zfill(width))


def _digit_range(low: str, high: str) -> str:
    if not low:
        return ""
    if low[0] == high[0]:
        return low[0] + _digit_range(low[1:], high[1:])
    rest = len(low) - 1
    any_rest = f"\\d{{{rest}}}" if rest else ""
    if low[1:] == "0" * rest and high[1:] == "9" * rest:
        return f"[{low[0]}-{high[0]}]{any_rest}"
    parts = [low[0] + _digit_range(low[1:], "9" * rest)]
    if int(high[0]) - int(low[0]) > 1:
        parts.append(f"[{int(low[0]) + 1}-{int(high[0]) - 1}]{any_rest}")
    parts.append(high[0] + _digit_range("0" * rest, high[1:]))
    return f"(?:{'|'.join(parts)})"


def _date_time_schema() -> Schema:
    """RFC 3339, its years bounded: from 0002 (0001 at an offset east of UTC does not
    exist in UTC) to the last whole year within DELAYJOBS["MAX_SCHEDULE_AHEAD"]."""
    last_year = (timezone.now() + conf.MAX_SCHEDULE_AHEAD).year - 1
    year = digits_between(2, last_year, 4)
    return {"type": "string", "format": "date-time", "pattern": RFC3339.format(year=year)}


def _aware_datetime(value: Any) -> datetime:
    text = _string(value)
    if not DATE_TIME_PATTERN.fullmatch(text):
        raise FieldError(_not_rfc3339(text))
    try:
        moment = datetime.fromisoformat(text.upper())
    except ValueError:  # a day the month does not have (2030-02-30)
        raise FieldError(f"must be a date and time that exists, got {text!r}.") from None
    try:
        # Stored in UTC: 0001-01-01T00:30+01:00 is a valid text, but no time in UTC.
        moment.astimezone(UTC)
    except OverflowError:
        raise FieldError(f"must be between the years 1 and 9999 in UTC, got {text!r}.") from None
    return moment


def _not_rfc3339(text: str) -> str:
    """Why ``text`` is not an RFC 3339 date-time, as specifically as can be said."""
    if len(text) > 100:
        return f"must be an RFC 3339 date and time, got {len(text)} characters."
    try:
        naive = timezone.is_naive(datetime.fromisoformat(text))
    except ValueError:
        naive = False
    if naive:
        return f"must carry a UTC offset ('Z' or '+02:00'): {text!r} could be any time zone."
    return (
        f"must be an RFC 3339 date and time with a UTC offset (2030-01-15T14:30:00Z), got {text!r}."
    )


def _anything(value: Any) -> Any:
    return value


STRING = Kind({"type": "string"}, _string)
#: A string used in a database lookup.
TEXT = Kind(TEXT_SCHEMA, _text)
BOOLEAN = Kind({"type": "boolean"}, _boolean)
INTEGER = Kind({"type": "integer"}, _integer)
SECONDS = Kind({"type": "number", "minimum": 0}, _seconds)
#: Seconds from now until a job is due.
DELAY = Kind(_delay_schema, _delay)
DATETIME = Kind(_date_time_schema, _aware_datetime)
ANY_JSON = Kind({}, _anything)
#: A job's payload: checked by schedule() (size, depth, NUL); the document says how.
PAYLOAD = Kind({"$ref": "#/components/schemas/Payload"}, _anything)


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for messages."""
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "an array"
        case dict():
            return "an object"
    return type(value).__name__
