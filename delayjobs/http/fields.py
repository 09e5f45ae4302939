"""Request fields: each one's JSON Schema and its conversion to Python, declared once.

The views parse bodies and query strings with these declarations, and the OpenAPI
document describes them from the same ones, so the two cannot drift apart. Conversions
only check JSON types and turn text into datetimes and seconds into timedeltas; the
rules of a valid job stay in ``delayjobs.api``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from delayjobs.http.errors import ApiError

Schema = dict[str, Any]


class FieldError(ValueError):
    """A value of the wrong shape; ``errors`` maps sub-fields to messages (nested values)."""

    def __init__(self, message: str, errors: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.errors = dict(errors or {})


@dataclass(frozen=True)
class Kind:
    """A JSON type: its schema, and the conversion of a decoded JSON value (or query text)."""

    schema: Schema
    convert: Callable[[Any], Any]


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise FieldError(f"must be a string, got {_json_type(value)}.")
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
        raise FieldError(f"must be true or false, got {_json_type(value)}.")
    return value


def _integer(value: Any) -> int:
    # JSON has no integer type: 3.0 is accepted as 3, 3.5 is not; true is not 1.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(f"must be an integer, got {_json_type(value)}.")
    return value


def number_text(value: float) -> str:
    """A JSON number as a person would write it: 3600, 90.5, 1e+300 (not 3600.0)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def _seconds(value: Any) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise FieldError(f"must be a number of seconds, got {_json_type(value)}.")
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
        if not low <= delta <= high:
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


def _aware_datetime(value: Any) -> datetime:
    text = _string(value)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise FieldError(
            f"must be an ISO 8601 date and time with an offset "
            f"(2030-01-15T14:30:00Z), got {text!r}."
        ) from None
    if timezone.is_naive(moment):
        raise FieldError(
            f"must carry a UTC offset ('Z' or '+02:00'): {text!r} could be any time zone."
        )
    try:
        # Stored in UTC: 0001-01-01T00:30+01:00 is a valid text, but no time in UTC.
        moment.astimezone(UTC)
    except OverflowError:
        raise FieldError(f"must be between the years 1 and 9999 in UTC, got {text!r}.") from None
    return moment


def _anything(value: Any) -> Any:
    return value


STRING = Kind({"type": "string"}, _string)
#: A string used in a database lookup.
TEXT = Kind({"type": "string"}, _text)
BOOLEAN = Kind({"type": "boolean"}, _boolean)
INTEGER = Kind({"type": "integer"}, _integer)
SECONDS = Kind({"type": "number", "minimum": 0}, _seconds)
#: Seconds from now until a job is due.
DELAY = Kind({"type": "number", "minimum": 0}, _delay)
DATETIME = Kind({"type": "string", "format": "date-time"}, _aware_datetime)
ANY_JSON = Kind({}, _anything)


def _json_type(value: Any) -> str:
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
    kind: Kind
    description: str
    required: bool = False
    #: null is accepted (and given to the operation as None).
    nullable: bool = False
    #: Extra JSON Schema keywords (bounds, examples) for the document only.
    schema_extra: Schema = field(default_factory=dict)

    def schema(self) -> Schema:
        schema = {**self.kind.schema, **self.schema_extra, "description": self.description}
        if self.nullable and "type" in schema:
            schema["type"] = [schema["type"], "null"]
        return schema

    def convert(self, value: Any) -> Any:
        if value is None and self.nullable:
            return None
        return self.kind.convert(value)


@dataclass(frozen=True)
class Body:
    """A JSON object body: its fields; unknown fields are refused, not ignored."""

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

    def schema(self) -> Schema:
        schema: Schema = {
            "type": "object",
            "properties": {item.name: item.schema() for item in self.fields},
            "additionalProperties": False,
        }
        required = [item.name for item in self.fields if item.required]
        if required:
            schema["required"] = required
        if self.one_of:
            schema["oneOf"] = [{"required": [name]} for name in self.one_of]
        if self.exclusive:
            schema["not"] = {
                "required": list(self.exclusive),
                "properties": {name: {"not": {"type": "null"}} for name in self.exclusive},
            }
        if self.description:
            schema["description"] = self.description
        return schema

    def parse(self, data: Any) -> dict[str, Any]:
        """The fields present in ``data`` (a decoded JSON value), converted; FieldError."""
        if not isinstance(data, dict):
            raise FieldError(f"The {self.name} must be a JSON object, got {_json_type(data)}.")
        known = {item.name: item for item in self.fields}
        errors: dict[str, str] = dict.fromkeys(sorted(set(data) - set(known)), "Unknown field.")
        values: dict[str, Any] = {}
        for name, item in known.items():
            if name not in data:
                if item.required:
                    errors[name] = "This field is required."
                continue
            try:
                values[name] = item.convert(data[name])
            except FieldError as exc:
                # A nested value's own problems name themselves (jobs[1].run_at).
                errors.update({f"{name}{sub}": text for sub, text in exc.errors.items()})
                if not exc.errors:
                    errors[name] = str(exc)
        if not errors:
            errors.update(self._cross_field_errors(values))
        if errors:
            raise FieldError(f"Invalid {self.name}.", errors)
        return values

    def _cross_field_errors(self, values: dict[str, Any]) -> dict[str, str]:
        for group in (self.one_of, self.exclusive):
            given = [name for name in group if values.get(name) is not None]
            if len(given) > 1:
                return dict.fromkeys(given, f"Give {' or '.join(group)}, not both.")
        if self.one_of and not set(self.one_of) & set(values):
            return dict.fromkeys(self.one_of, "Give one of these fields.")
        return self.check(values) if self.check else {}


def list_of(body: Body, max_items: int) -> Kind:
    """A JSON array of ``body`` objects, 1 to ``max_items`` of them."""

    def convert(value: Any) -> list[dict[str, Any]]:
        if not isinstance(value, list):
            raise FieldError(f"must be an array, got {_json_type(value)}.")
        if not 1 <= len(value) <= max_items:
            raise FieldError(f"must hold 1 to {max_items} items, got {len(value)}.")
        items, errors = [], {}
        for index, item in enumerate(value):
            try:
                items.append(body.parse(item))
            except FieldError as exc:
                errors.update(
                    {f"[{index}]{_dotted(sub)}": text for sub, text in exc.errors.items()}
                )
                if not exc.errors:
                    errors[f"[{index}]"] = str(exc)
        if errors:
            raise FieldError("has invalid items.", errors)
        return items

    schema = {"type": "array", "items": body.schema(), "minItems": 1, "maxItems": max_items}
    return Kind(schema, convert)


def _dotted(name: str) -> str:
    return name if name.startswith("[") else f".{name}"


@dataclass(frozen=True)
class Param:
    """A query string parameter: text, converted by ``convert`` (FieldError if bad)."""

    name: str
    schema: Schema
    description: str
    convert: Callable[[str], Any] = _text
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
