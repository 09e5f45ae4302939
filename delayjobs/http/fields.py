"""Request fields: each one's JSON Schema and its conversion to Python, declared once.

Bodies are validated by pydantic models made from these declarations
(``delayjobs.http.app``), query strings by ``parse_query``, and the OpenAPI document
describes both from the same declarations, so the two cannot drift apart. The types a
field may have, and their conversions, are in ``delayjobs.http.field_types``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from delayjobs.http.errors import ApiError
from delayjobs.http.field_types import TEXT, FieldError, Kind, Schema


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
class Param:
    """A query string parameter: text, converted by ``convert`` (FieldError if bad)."""

    name: str
    schema: Schema | Callable[[], Schema]
    description: str
    convert: Callable[[str], Any] = TEXT.convert

    def json_schema(self) -> Schema:
        return self.schema() if callable(self.schema) else dict(self.schema)

    #: May be given several times (?status=failed&status=expired).
    repeated: bool = False


@dataclass(frozen=True)
class ListOf:
    """A field's kind: a JSON array of ``body`` objects, 1 to ``max_items`` of them."""

    body: Body
    max_items: int


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
