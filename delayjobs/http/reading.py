"""A request's body, read by the API's own rules before ninja sees it: the size limits
(refused before reading a byte where the length is declared), application/json in UTF-8,
and strict JSON (no repeated names, no NaN, no number beyond a double, a bounded depth)."""

from __future__ import annotations

import json
import math
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, RawPostDataException

from delayjobs.conf import settings as conf
from delayjobs.http.errors import ApiError
from delayjobs.http.invalid import not_an_object
from delayjobs.http.operation import Operation
from delayjobs.payload import nesting_depth

JSON_CONTENT_TYPE = "application/json"

#: Levels a request body adds around a payload: {"jobs": [{"payload": ...}]}.
BODY_ENVELOPE_DEPTH = 3


def read_body(request: HttpRequest, operation: Operation) -> Any:
    """The operation's body as a JSON value, for its pydantic model to validate; None for
    an operation without one, or an empty body where the body is optional."""
    if operation.body is None:
        return None
    raw = _raw_body(request, operation)
    if not raw:
        if not operation.body_required:
            return None
        raise ApiError("malformed", "The body is empty: send a JSON object.")
    _require_json(request)
    value = decode_json(raw)
    if value is None:  # ninja takes a null body for none at all: cancel would pass
        raise not_an_object(operation.body, value)
    return value


def _raw_body(request: HttpRequest, operation: Operation) -> bytes:
    limit, setting = operation.body_limit()
    source = f" (Django's {setting})" if setting else ""
    too_large = ApiError("too_large", f"The body is over the limit of {limit} bytes{source}.")
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:  # refused before reading a byte of it
        raise too_large
    try:
        raw = request.body
    except RequestDataTooBig:  # over DATA_UPLOAD_MAX_MEMORY_SIZE, Django's own limit
        raise too_large from None
    except RawPostDataException:
        # The session's CSRF check parsed a multipart form body, and with it the stream.
        _require_json(request)
        raise
    if len(raw) > limit:
        raise too_large
    return raw


def _require_json(request: HttpRequest) -> None:
    content_type = (request.content_type or "").lower()
    charset = (request.content_params or {}).get("charset", "utf-8").lower()
    if content_type != JSON_CONTENT_TYPE or charset not in ("utf-8", "utf8"):
        given = request.META.get("CONTENT_TYPE") or "none"
        raise ApiError(
            "unsupported_media_type",
            f"Send the body as {JSON_CONTENT_TYPE} (UTF-8); the Content-Type was {given}.",
        )


class _DuplicateName(ValueError):
    pass


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Which of two values a parser keeps differs between JSON libraries: refuse both.
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise _DuplicateName(name)
        result[name] = value
    return result


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _NumberOutOfRange(ValueError):
    pass


def _finite_float(text: str) -> float:
    # 1e400 is valid JSON, but no double holds it: Python would read it as infinity.
    value = float(text)
    if not math.isfinite(value):
        raise _NumberOutOfRange(text)
    return value


def decode_json(raw: bytes) -> Any:
    """The JSON value of ``raw``; ApiError("malformed") for anything that is not JSON."""
    try:
        value = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_refuse_duplicates,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
        )
        limit = conf.MAX_PAYLOAD_DEPTH + BODY_ENVELOPE_DEPTH
        if nesting_depth(value, limit) <= limit:
            return value
        detail = (
            f"The body nests lists and objects more than {limit} levels deep (a payload "
            f"may nest {conf.MAX_PAYLOAD_DEPTH}: DELAYJOBS['MAX_PAYLOAD_DEPTH'])."
        )
    except UnicodeDecodeError:
        detail = "The body is not UTF-8 text."
    except json.JSONDecodeError as exc:
        detail = f"The body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
    except _DuplicateName as exc:
        detail = f"The body has the field {exc.args[0]!r} twice."
    except _NumberOutOfRange as exc:
        detail = (
            f"The body holds the number {exc.args[0][:40]}, too large for this API: numbers "
            f"must be within about ±1.8e308 (a 64-bit float)."
        )
    except RecursionError:
        detail = "The body is nested too deeply."
    except ValueError as exc:  # NaN, Infinity, numbers of thousands of digits
        detail = f"The body is not valid JSON: {exc}."
    raise ApiError("malformed", detail)
