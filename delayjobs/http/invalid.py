"""Pydantic's validation errors as the API's 400: each field's own message, named as the
API names fields (``jobs[1].run_at``), the first in the detail."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from delayjobs.http.errors import ApiError
from delayjobs.http.field_types import FieldError, json_type
from delayjobs.http.fields import Body, Field, ListOf


def _path(loc: Sequence[str | int]) -> str:
    """A pydantic location as the API names fields: jobs[1].run_at."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text


def _body_at(body: Body, loc: Sequence[str | int]) -> Body:
    """The body (the request's, or a bulk request's item) at ``loc``."""
    for part in loc:
        if isinstance(part, str):
            kind = next((item.kind for item in body.fields if item.name == part), None)
            if isinstance(kind, ListOf):
                body = kind.body
    return body


def invalid(body: Body, errors: list[dict[str, Any]]) -> ApiError:
    """The API's 400 for pydantic's errors on ``body``: each field's own message, the first
    in the detail."""
    fields: dict[str, str] = {}
    for error in _in_order(errors):
        loc = error["loc"][1:]  # ("body", ...): the view's one body parameter
        path = _path(loc)
        kind = error["type"]
        given = error.get("input")
        if kind == "extra_forbidden":
            message = "Unknown field."
        elif kind == "missing":
            message = "This field is required."
        elif kind == "value_error":
            cause = error["ctx"]["error"]
            if isinstance(cause, FieldError) and cause.errors:  # a rule across fields
                prefix = f"{path}." if path else ""
                fields.update({f"{prefix}{name}": text for name, text in cause.errors.items()})
                continue
            message = str(cause)
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            if not path:
                return not_an_object(body, given)
            message = not_an_object(_body_at(body, loc), given).detail
        elif kind == "list_type":
            message = f"must be an array, got {json_type(given)}."
        elif kind in ("too_short", "too_long"):
            item = _field(body, loc)
            high = item.kind.max_items if item and isinstance(item.kind, ListOf) else "?"
            message = f"must hold 1 to {high} items, got {len(given or ())}."
        else:  # a kind of error pydantic adds: its own words rather than none
            message = str(error["msg"])
        fields.setdefault(path, message)
    name, message = next(iter(fields.items()))
    more = len(fields) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''}, see fields)" if more else ""
    return ApiError("invalid", f"Invalid {body.name}. {name}: {message}{suffix}", fields=fields)


def _in_order(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic's errors as the API always listed them: object by object, each object's
    unknown fields first, by name (pydantic lists them after the others, as sent)."""
    objects: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for error in errors:
        objects.setdefault(tuple(error["loc"][:-1]), []).append(error)
    ordered: list[dict[str, Any]] = []
    for found in objects.values():
        unknown = [error for error in found if error["type"] == "extra_forbidden"]
        ordered += sorted(unknown, key=lambda error: str(error["loc"][-1]))
        ordered += [error for error in found if error["type"] != "extra_forbidden"]
    return ordered


def not_an_object(body: Body, value: Any) -> ApiError:
    """The 400 for a body that is JSON but no object."""
    return ApiError("invalid", f"The {body.name} must be a JSON object, got {json_type(value)}.")


def _field(body: Body, loc: Sequence[str | int]) -> Field | None:
    owner = _body_at(body, loc[:-1])
    return next((item for item in owner.fields if item.name == loc[-1]), None)
