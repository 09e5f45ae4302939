"""Payloads (and results) as a JSON column stores them: round-tripped, within the limits.

``storable_json`` is what everyone who stores a JSON value calls (``schedule``, the
executors storing a result); a value that cannot be stored raises ``InvalidJob`` saying why.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from delayjobs.conf import settings as conf
from delayjobs.exceptions import InvalidJob

#: A NUL character as json.dumps writes it: \u0000 after an even run of backslashes (an
#: odd run would make it a literal backslash followed by "u0000").
ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def normalize_payload(payload: Any) -> Any:
    """The payload as it will be stored and read back: a JSON round trip, within the limit."""
    if payload is None:
        return {}
    return storable_json(payload, "The payload", field="payload")


def nesting_depth(value: Any, limit: int) -> int:
    """How deeply ``value`` nests lists, tuples and dicts (a scalar is 0), counted without
    recursion and only up to ``limit + 1``, so that any value is measured safely."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def storable_json(value: Any, what: str, *, field: str | None = None) -> Any:
    """``value`` after a JSON round trip, as a JSON column stores it; ``InvalidJob`` if it
    cannot be stored or is over ``MAX_PAYLOAD_BYTES`` or ``MAX_PAYLOAD_DEPTH``. ``what``
    names it in the message, ``field`` in the error (``InvalidJob.field``)."""
    depth_limit = conf.MAX_PAYLOAD_DEPTH
    if nesting_depth(value, depth_limit) > depth_limit:
        _refuse_circular(value, what, field)
        raise InvalidJob(
            f"{what} nests lists and dicts more than {depth_limit} levels deep "
            f"(DELAYJOBS['MAX_PAYLOAD_DEPTH']). Store flat data: ids and values.",
            field=field,
        )
    try:
        # ensure_ascii=False: the text is then what the size limit measures (its UTF-8
        # bytes), and a lone surrogate stays one, to be refused when it fails to encode.
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidJob(
            f"{what} must be JSON-serializable (dicts, lists, strings, finite numbers, "
            f"booleans, None): {exc}. Store ids and ISO strings, not objects.",
            field=field,
        ) from None
    except RecursionError:
        raise InvalidJob(
            f"{what} is nested too deeply to be stored as JSON.", field=field
        ) from None
    if ESCAPED_NUL.search(text):
        # PostgreSQL's jsonb cannot hold it: refuse it everywhere, not only there.
        raise InvalidJob(f"{what} must not contain NUL characters (\\u0000).", field=field)
    size = len(text) if text.isascii() else utf8_length(text, what, field=field)
    limit = conf.MAX_PAYLOAD_BYTES
    if limit is not None and size > limit:
        raise InvalidJob(
            f"{what} is {size} bytes of JSON, over the limit of {limit} bytes "
            f"(DELAYJOBS['MAX_PAYLOAD_BYTES']). Store ids, not documents.",
            field=field,
        )
    return json.loads(text)


def _refuse_circular(value: Any, what: str, field: str | None) -> None:
    """InvalidJob saying so if ``value`` contains itself: endlessly deep, but the fix is
    not flatter data. json finds the cycle at its second visit, long before recursing far;
    a value merely too deep raises RecursionError or encodes, and is left to the caller."""
    try:
        json.dumps(value)
    except ValueError as exc:
        raise InvalidJob(
            f"{what} must be JSON-serializable: {exc} (it contains itself).", field=field
        ) from None
    except (RecursionError, TypeError):
        pass


def utf8_length(text: str, label: str, *, field: str | None = None) -> int:
    """How many bytes ``text`` takes in UTF-8; ``InvalidJob`` naming ``label`` if it holds a
    lone surrogate, which cannot be encoded."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        # Neither PostgreSQL nor SQLite can store it; it is never valid text anyway.
        raise InvalidJob(
            f"{label} must be valid Unicode text: it contains the lone surrogate "
            f"{text[exc.start]!r} at position {exc.start}.",
            field=field,
        ) from None
