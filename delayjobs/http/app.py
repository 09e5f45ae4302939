"""The API: one ``NinjaAPI``, with its strict JSON parser, its renderer, its exception
handlers and its OpenAPI document (ninja's, with what ninja cannot know added)."""

from __future__ import annotations

import json
import math
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

try:
    from ninja import NinjaAPI, Swagger
    from ninja.errors import ValidationError
    from ninja.parser import Parser
    from ninja.renderers import JSONRenderer
    from pydantic import BaseModel
    from pydantic_core import to_json
except ImportError as exc:  # the http extra is not installed (pydantic comes with ninja)
    raise ImproperlyConfigured(
        "The HTTP API (delayjobs.http) runs on django-ninja: install the http extra, "
        "pip install 'django-delayjobs[http]'."
    ) from exc

from delayjobs.conf import settings as conf
from delayjobs.core.version import __version__
from delayjobs.http import errors, schemas, views
from delayjobs.payload import nesting_depth

#: Levels a request body adds around a payload: {"jobs": [{"payload": ...}]}.
BODY_ENVELOPE_DEPTH = 3


class StrictJSON(Parser):
    """Bodies as strict JSON, UTF-8, sent as application/json: a name twice, NaN, Infinity
    or a number beyond a double, or nesting deeper than any payload may, is refused
    (``malformed``), where Python's json would take them (and which of two values a
    parser keeps differs between libraries)."""

    def parse_body(self, request: HttpRequest) -> Any:
        charset = (request.content_params or {}).get("charset", "utf-8").lower()
        given = (request.content_type or "").lower(), charset.replace("-", "")
        if given != ("application/json", "utf8"):
            raise errors.ApiError("unsupported_media_type", "Send application/json in UTF-8.")
        try:
            value = json.loads(
                request.body.decode("utf-8"),
                object_pairs_hook=_refuse_duplicates,
                parse_constant=_refuse,
                parse_float=_finite,
            )
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise errors.ApiError("malformed", f"The body is not strict JSON: {exc}") from None
        limit = conf.MAX_PAYLOAD_DEPTH + BODY_ENVELOPE_DEPTH
        if nesting_depth(value, limit) > limit:
            raise errors.ApiError("malformed", f"The body nests more than {limit} levels deep.")
        return value


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) < len(pairs):
        raise ValueError("a name appears twice in an object")
    return result


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    # 1e400 is valid JSON, but no double holds it: Python would read it as infinity.
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is beyond a 64-bit float")
    return value


class Renderer(JSONRenderer):
    """JSON by pydantic's serializer: times in ISO 8601 with every digit (Django's encoder,
    ninja's default, keeps milliseconds), durations in seconds, and in Rust, which a bulk
    reply of a thousand jobs notices."""

    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> bytes:
        return to_json(data, timedelta_mode="float")


class DelayJobsAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation: Any) -> str:
        """The view's name in camelCase: schedule_job is scheduleJob."""
        first, *rest = operation.view_func.__name__.split("_")
        return first + "".join(word.capitalize() for word in rest)

    def validation_error_from_error_contexts(self, error_contexts: list[Any]) -> ValidationError:
        """Each error located as the request names it: the view's parameter that holds a
        schema (the body, the list's query) is no part of a field's path."""
        errors = []
        for context in error_contexts:
            params = context.model.model_fields
            for error in context.pydantic_validation_error.errors(include_url=False):
                loc = error["loc"]
                held = params[loc[0]].annotation if loc and loc[0] in params else None
                if isinstance(held, type) and issubclass(held, BaseModel):
                    loc = loc[1:]
                errors.append({"loc": loc, "msg": error["msg"]})
        return ValidationError(errors)

    def get_openapi_schema(self, **kwargs: Any) -> Any:
        """ninja's document, with what its declarations cannot say: the payload's schema
        (recursive) and what each error status means."""
        document = super().get_openapi_schema(**kwargs)
        components = document["components"]["schemas"]
        components["Payload"] = payload_schema()
        components["ScheduleIn"]["properties"]["payload"]["$ref"] = "#/components/schemas/Payload"
        for methods in document["paths"].values():
            for operation in methods.values():
                for status, response in operation["responses"].items():
                    if codes := [code for code, at in errors.ERRORS.items() if at == status]:
                        response["description"] += f": {', '.join(codes)}"
                    if status in HEADERS:
                        response["headers"] = HEADERS[status]
        return document


HEADERS = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}}},
    405: {"Allow": {"description": "The methods the URL takes.", "schema": {"type": "string"}}},
    503: {"Retry-After": {"schema": {"type": "string"}}},
}


def payload_schema() -> dict[str, Any]:
    """Any JSON value the database stores: no NUL in its strings or names. Its depth and
    size limits are in words and extension keywords: JSON Schema counts nesting only by a
    schema per level, and 65 of them make tools that generate requests (Schemathesis) hang."""
    itself = {"$ref": "#/components/schemas/Payload"}
    no_nul = {"type": "string", "pattern": schemas.NO_NUL}
    return {
        "anyOf": [
            {"type": ["null", "boolean", "number"]},
            no_nul,
            {"type": "array", "items": itself},
            {"type": "object", "propertyNames": no_nul, "additionalProperties": itself},
        ],
        "description": f"Any JSON value without NUL characters, nesting at most "
        f"{conf.MAX_PAYLOAD_DEPTH} levels deep, at most {conf.MAX_PAYLOAD_BYTES} bytes.",
        "x-maxDepth": conf.MAX_PAYLOAD_DEPTH,
        "x-maxBytes": conf.MAX_PAYLOAD_BYTES,
    }


api = DelayJobsAPI(
    title="delayjobs",
    version=__version__,
    description=(
        "Schedule, read, cancel, reschedule and retry delayed jobs. Every operation needs "
        "an API key (Authorization: Bearer dj_...) or the Django session of a staff user "
        "(with X-CSRFToken for POST), and the permissions it names (x-permissions). Errors "
        "share one shape (Error): its error code and its fields' paths stay, its wording "
        "may change. Request bodies refuse unknown fields."
    ),
    urls_namespace=views.NS,
    docs_url=None,
    parser=StrictJSON(),
    renderer=Renderer(),
)
api.add_router("", views.router)
errors.install(api)


def api_docs(request: HttpRequest) -> HttpResponse:
    """Swagger UI, django-ninja's, on the API's document. Mount it where the project likes,
    outside the API's own URLs (any other path under the mount point is a JSON 404):
    ``path("delayjobs/api-docs/", api_docs)``. The page is as public as the document;
    trying an operation out needs a key or a staff session."""
    return Swagger().render_page(request, api)
