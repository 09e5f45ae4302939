"""Request fields: each one's JSON Schema and its conversion to Python, declared once.

Bodies are validated by pydantic models made from these declarations
(``delayjobs.http.app``), query strings by ``parse_query``, and the OpenAPI document
describes both from the same declarations, so the two cannot drift apart. Conversions
only check JSON types and turn text into datetimes and seconds into timedeltas; the
rules of a valid job stay in ``delayjobs.api``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from delayjobs.conf import settings as conf
from delayjobs.http.errors import ApiError

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


def payload_schemas() -> dict[str, Schema]:
    """The component schema of a payload: any JSON value the database stores, with no NUL
    in its strings or names. Its depth and size limits are in words and in extension
    keywords: JSON Schema cannot count nesting but by one schema per level, and 65 levels
    of them make tools that generate requests from the document (Schemathesis) hang."""
    size = conf.MAX_PAYLOAD_BYTES
    limit = f", and at most {size} bytes as JSON (DELAYJOBS['MAX_PAYLOAD_BYTES'])" if size else ""
    itself = {"$ref": "#/components/schemas/Payload"}
    payload: Schema = {
        "anyOf": [
            {"type": ["null", "boolean", "number"]},
            TEXT_SCHEMA,
            {"type": "array", "items": itself},
            {
                "type": "object",
                "propertyNames": {"pattern": NO_NUL},
                "additionalProperties": itself,
            },
        ],
        "description": (
            f"Any JSON value, nesting lists and objects at most {conf.MAX_PAYLOAD_DEPTH} "
            f"levels deep (DELAYJOBS['MAX_PAYLOAD_DEPTH']), without NUL characters{limit}."
        ),
        "x-maxDepth": conf.MAX_PAYLOAD_DEPTH,
    }
    if size:
        payload["x-maxBytes"] = size
    return {"Payload": payload}


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


@dataclass(frozen=True)
class Field:
    name: str
    kind: Kind | ListOf
    description: str
    required: bool = False
    #: null is accepted (and given to the operation as None).
    nullable: bool = False
    #: Extra JSON Schema keywords (bounds, examples) for the document only.
    schema_extra: Schema = field(default_factory=dict)

    def schema(self) -> Schema:
        assert isinstance(self.kind, Kind), "a list's schema is its items' model's"
        schema = {**self.kind.json_schema(), **self.schema_extra, "description": self.description}
        if self.nullable and "type" in schema:
            schema["type"] = [schema["type"], "null"]
        return schema

    def convert(self, value: Any) -> Any:
        if value is None and self.nullable:
            return None
        assert isinstance(self.kind, Kind), "a list is validated by its items' model"
        return self.kind.convert(value)


@dataclass(frozen=True)
class Body:
    """A JSON object body, declared: its fields and the rules across them.
    ``delayjobs.http.app`` makes a pydantic model of it, which validates requests (unknown
    fields are refused, not ignored) and gives the document its schema."""

    name: str
    fields: tuple[Field, ...]
    description: str = ""
    #: Exactly one of these fields must be present.
    one_of: tuple[str, ...] = ()
    #: At most one of these fields may be present and not null.
    exclusive: tuple[str, ...] = ()
    #: A rule across fields, run on the converted values once each field is valid:
    #: returns {field: message} for the fields at fault.
    check: Callable[[dict[str, Any]], dict[str, str]] | None = None
    #: ``check``'s rule in JSON Schema, for the document.
    check_schema: Schema = field(default_factory=dict)

    def rules_schema(self) -> Schema:
        """The JSON Schema keywords of the rules across fields (one_of, exclusive, check):
        pydantic knows each field, not these."""
        schema: Schema = {}
        if self.one_of:
            schema["oneOf"] = [{"required": [name]} for name in self.one_of]
        if self.exclusive:
            schema["not"] = {
                "required": list(self.exclusive),
                "properties": {name: {"not": {"type": "null"}} for name in self.exclusive},
            }
        schema.update(self.check_schema)
        if self.description:
            schema["description"] = self.description
        return schema

    def cross_field_errors(self, values: dict[str, Any]) -> dict[str, str]:
        """{field: message} for the rules across fields that ``values`` (each field valid,
        only those present) breaks."""
        for group in (self.one_of, self.exclusive):
            given = [name for name in group if values.get(name) is not None]
            if len(given) > 1:
                return dict.fromkeys(given, f"Give {' or '.join(group)}, not both.")
        if self.one_of and not set(self.one_of) & set(values):
            return dict.fromkeys(self.one_of, "Give one of these fields.")
        return self.check(values) if self.check else {}


@dataclass(frozen=True)
class ListOf:
    """A field's kind: a JSON array of ``body`` objects, 1 to ``max_items`` of them."""

    body: Body
    max_items: int


@dataclass(frozen=True)
class Param:
    """A query string parameter: text, converted by ``convert`` (FieldError if bad)."""

    name: str
    schema: Schema | Callable[[], Schema]
    description: str
    convert: Callable[[str], Any] = _text

    def json_schema(self) -> Schema:
        return self.schema() if callable(self.schema) else dict(self.schema)

    #: May be given several times (?status=failed&status=expired).
    repeated: bool = False


def parse_query(query: Any, params: tuple[Param, ...]) -> dict[str, Any]:
    """The parameters present in ``query`` (a QueryDict), converted; 400 for unknown ones."""
    known = {param.name: param for param in params}
    errors = dict.fromkeys(sorted(set(query) - set(known)), "Unknown query parameter.")
    values: dict[str, Any] = {}
    for name, param in known.items():
        given = query.getlist(name)
        if not given:
            continue
        if len(given) > 1 and not param.repeated:
            errors[name] = "Give this parameter once."
            continue
        try:
            converted = [param.convert(text) for text in given]
        except FieldError as exc:
            errors[name] = str(exc)
            continue
        values[name] = converted if param.repeated else converted[0]
    if errors:
        raise ApiError("invalid", "Invalid query parameters.", fields=errors)
    return values
