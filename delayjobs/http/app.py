"""The API's operations on django-ninja: pydantic models of the request bodies, which
validate them and give the OpenAPI document their schemas, and ninja operations that run
the handlers.

``views.Endpoint`` still routes (each path with and without its slash, HEAD as GET,
OPTIONS, a JSON 405 with Allow), authenticates, checks permissions and reads the body,
in that order, because ninja does none of these as the API promises: its 405 is an HTML
page, it answers neither HEAD nor OPTIONS, and it reads the body before any check of its
own could refuse a caller. Each field's conversion (``fields.Kind``) is the pydantic
validator of the field, so every message stays the API's own ("must be an integer from 1
to 100, got 101."), not pydantic's ("Input should be less than or equal to 100").
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

try:
    from ninja import NinjaAPI
    from ninja.errors import ValidationError, ValidationErrorContext
    from ninja.openapi.docs import Swagger
    from ninja.operation import Operation as NinjaOperation
    from ninja.parser import Parser
    from pydantic import BaseModel, BeforeValidator, ConfigDict, create_model, model_validator
    from pydantic import Field as PydanticField
except ImportError as exc:  # the http extra is not installed (pydantic comes with ninja)
    raise ImproperlyConfigured(
        "The HTTP API (delayjobs.http) runs on django-ninja: install the http extra, "
        "pip install 'django-delayjobs[http]'."
    ) from exc

from delayjobs.http.errors import ApiError
from delayjobs.http.field_types import FieldError
from delayjobs.http.field_types import Schema as JsonSchema
from delayjobs.http.fields import Body, Field, ListOf
from delayjobs.http.invalid import invalid

#: What answers once ninja has validated the body: given the body's fields (those sent).
Respond = Callable[[dict[str, Any]], HttpResponse]


@dataclass(frozen=True)
class Handover:
    """What ``views`` hands to a ninja operation with the request: the operation, the body
    as decoded JSON (None: no body), and what answers once the body is valid."""

    operation: Any
    json_value: Any
    respond: Respond


def handover(request: HttpRequest) -> Handover:
    return request.delayjobs_handover  # type: ignore[attr-defined]


def run(
    operations: dict[str, NinjaOperation],
    request: HttpRequest,
    path: dict[str, Any],
    given: Handover,
) -> HttpResponse:
    """The ninja operation's response: the body validated, then ``given.respond``'s."""
    request.delayjobs_handover = given  # type: ignore[attr-defined]
    response = operations[given.operation.operation_id].run(request, **path)
    return response  # type: ignore[return-value]  # ninja's views always answer HttpResponse


class RequestModel(BaseModel):
    """A request body: unknown fields are refused, not ignored (a typo must not pass).

    A plain pydantic model, not ninja's Schema: Schema wraps every object it validates so
    that it can read Django models' attributes, which made a bulk request of 500 jobs
    take 40 ms to validate instead of 5 (measured): bodies are JSON, never models."""

    model_config = ConfigDict(extra="forbid")


def _model_name(body: Body) -> str:
    return "".join(word.capitalize() for word in body.name.split())


def _field_schema(item: Field) -> Callable[[dict[str, Any]], None]:
    # Called each time the document is built: some bounds depend on settings and on the
    # date (the latest run_at). Pydantic's own schema of Any (a title) is replaced whole.
    def replace(schema: dict[str, Any]) -> None:
        schema.clear()
        schema.update(item.schema())
        if "$ref" in schema:  # pydantic would look it up among its own models
            schema[_REF] = schema.pop("$ref")

    return replace


def _annotation(item: Field) -> Any:
    if isinstance(item.kind, ListOf):
        items = request_model(item.kind.body)
        return Annotated[
            list[items],  # type: ignore[valid-type]
            PydanticField(
                min_length=1, max_length=item.kind.max_items, description=item.description
            ),
        ]
    return Annotated[
        Any, BeforeValidator(item.convert), PydanticField(json_schema_extra=_field_schema(item))
    ]


#: Each body's model, by the body's name: one model per body, shared by its operations.
_MODELS: dict[str, type[RequestModel]] = {}


def request_model(body: Body) -> type[RequestModel]:
    """The pydantic model of ``body``: its fields, with the API's conversions and messages,
    and the rules across them."""
    if body.name in _MODELS:
        return _MODELS[body.name]

    def rules(model: RequestModel) -> RequestModel:
        # The fields sent, read off the model: a model_dump() per job cost a bulk request
        # of 500 jobs 6 ms (measured), 5% of its time.
        sent = {name: getattr(model, name) for name in model.model_fields_set}
        errors = body.cross_field_errors(sent)
        if errors:
            raise FieldError(f"Invalid {body.name}.", errors)
        return model

    def rules_schema(schema: dict[str, Any]) -> None:
        # Pydantic titles each property after its name: the descriptions say more.
        schema.pop("title", None)
        for item in schema.get("properties", {}).values():
            item.pop("title", None)
        schema.update(body.rules_schema())

    fields: dict[str, Any] = {
        item.name: (_annotation(item), ... if item.required else None) for item in body.fields
    }
    validators: dict[str, Any] = {"rules": model_validator(mode="after")(rules)}
    model = create_model(
        _model_name(body), __base__=RequestModel, __validators__=validators, **fields
    )
    model.model_config["json_schema_extra"] = rules_schema
    model.model_rebuild(force=True)
    _MODELS[body.name] = model
    return model


#: A field's "$ref" to one of the document's components, while pydantic builds the schema.
_REF = "x-delayjobs-ref"


def body_schema(body: Body) -> tuple[JsonSchema, dict[str, JsonSchema]]:
    """The body's JSON Schema, and the component schemas it refers to (a bulk request's
    items), as pydantic makes them."""
    schema = _restore_refs(
        request_model(body).model_json_schema(ref_template="#/components/schemas/{model}")
    )
    return schema, schema.pop("$defs", {})


def _restore_refs(value: Any) -> Any:
    if isinstance(value, dict):
        return {"$ref" if key == _REF else key: _restore_refs(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_restore_refs(item) for item in value]
    return value


# The ninja API ---------------------------------------------------------------------------


class _Decoded(Parser):
    """The body as ``views`` decoded it, by the API's stricter rules (no duplicate names,
    no NaN, no number beyond a double, a bounded depth): ninja's json.loads takes all."""

    def parse_body(self, request: HttpRequest) -> Any:
        return handover(request).json_value


class _Api(NinjaAPI):
    def validation_error_from_error_contexts(
        self, error_contexts: list[ValidationErrorContext[Any]]
    ) -> ValidationError:
        # Ninja's own turns each error's exception into text and drops what was sent; the
        # API's messages need both (a rule's fields, the JSON type of the value).
        return ValidationError(
            [
                dict(error)
                for context in error_contexts
                for error in context.pydantic_validation_error.errors(include_url=False)
            ]
        )


def _reraise(request: HttpRequest, exc: Any) -> HttpResponse:
    # views.Endpoint answers the JSON 500 and logs it, for errors outside ninja too.
    raise exc


def build(operations: Sequence[Any]) -> dict[str, NinjaOperation]:
    """A ninja operation for each of the API's ``operations`` (openapi.Operation), by
    operationId: it validates the body, then answers with the request's Handover."""
    api = _Api(
        title="delayjobs", parser=_Decoded(), urls_namespace="delayjobs_ninja", docs_url=None
    )
    for operation in operations:
        api.default_router.add_api_operation(
            operation.route.replace("<int:job_id>", "{job_id}"),
            [operation.method],
            _view(operation),
            operation_id=operation.operation_id,
            url_name=operation.name,
        )

    def validation_error(request: HttpRequest, exc: Any) -> HttpResponse:
        return invalid(handover(request).operation.body, list(exc.errors)).response()

    def api_error(request: HttpRequest, exc: Any) -> HttpResponse:
        return exc.response()

    api.add_exception_handler(ValidationError, validation_error)
    api.add_exception_handler(ApiError, api_error)
    api.add_exception_handler(Exception, _reraise)
    # Private to ninja, but the only way to the operations bound to the API, which run.
    return {
        str(operation.operation_id): operation
        for router in api._get_bound_routers()
        for path_view in router.path_operations.values()
        for operation in path_view.operations
    }


def _view(operation: Any) -> Callable[..., HttpResponse]:
    def view(request: HttpRequest, **values: Any) -> HttpResponse:
        body = values.get("body")
        # Only the fields sent: an absent field is the API's default, not None.
        return handover(request).respond(body.model_dump(exclude_unset=True) if body else {})

    parameters = [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if "<int:job_id>" in operation.route:
        parameters.append(
            inspect.Parameter("job_id", inspect.Parameter.KEYWORD_ONLY, annotation=int)
        )
    if operation.body is not None:
        parameters.append(
            inspect.Parameter(
                "body",
                inspect.Parameter.KEYWORD_ONLY,
                annotation=request_model(operation.body),
                default=inspect.Parameter.empty if operation.body_required else None,
            )
        )
    view.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    view.__name__ = operation.operation_id
    return view


class _Swagger(Swagger):
    def __init__(self, document_url: str) -> None:
        super().__init__()
        self.document_url = document_url

    def get_openapi_url(self, api: NinjaAPI, path_params: dict[str, Any]) -> str:
        # The API's own document, not one of ninja's: ninja serves no URL of this API.
        return self.document_url


def docs_page(
    request: HttpRequest, document_url: str, operations: dict[str, NinjaOperation]
) -> HttpResponse:
    """ninja's Swagger UI page, reading the document at ``document_url``."""
    api = next(iter(operations.values())).api
    return _Swagger(document_url).render_page(request, api)
