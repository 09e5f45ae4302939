"""What one operation of the API is (``Operation``): its route, method, permissions,
body, query, responses and handler. ``openapi.OPERATIONS`` lists them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from delayjobs.http.call import Call, Reply
from delayjobs.http.errors import ERRORS
from delayjobs.http.fields import Body, Param
from delayjobs.http.permissions import VIEW

Schema = dict[str, Any]

#: The largest body of one request; a job's payload is at most 64 KiB by default
#: (DELAYJOBS["MAX_PAYLOAD_BYTES"]), so this leaves room for the rest and more.
MAX_BODY_BYTES = 1024 * 1024
#: A bulk request carries up to MAX_BULK_JOBS jobs.
MAX_BULK_BODY_BYTES = 8 * 1024 * 1024


#: A body that must be empty, or an empty JSON object, for actions that take no input.
NO_FIELDS = Body("request", ())


@dataclass(frozen=True)
class Operation:
    method: str
    #: A Django route under the mount point ("jobs/<int:job_id>/").
    route: str
    #: The URL name of the route (shared by the operations on one route).
    name: str
    operation_id: str
    summary: str
    handler: Callable[[Call], Reply]
    #: The permission needed (app_label.codename); None: public, no authentication.
    permission: str | None
    #: Status, description and schema of the successful response.
    success: tuple[int, str, Schema]
    body: Body | None = None
    #: False: the body may be left out (actions that take no input).
    body_required: bool = True
    query: tuple[Param, ...] = ()
    #: Runs in one transaction: all of it applies, or nothing does.
    writes: bool = False
    max_body_bytes: int = MAX_BODY_BYTES
    #: May answer 409 (the job's state forbids it; key conflicts).
    conflicts: bool = False
    #: May answer 404 (no such job); always so for a route with a job id.
    finds_job: bool = False
    #: The success response has a Location header: the new job's URL.
    location: bool = False
    #: More to say in the document than the permission needed.
    notes: str = ""
    #: Also needs the view permission: an action on existing jobs, which the admin offers
    #: only on its job list. Without it a caller could act on jobs it may not see, and
    #: learn from 404 against 409 which ids exist and in what state.
    needs_view: bool = False
    #: Operations on the job in the success response (OpenAPI links, by operationId).
    links: tuple[str, ...] = ()

    def permissions(self) -> tuple[str, ...]:
        """Every permission this operation needs; () for a public one."""
        if self.permission is None:
            return ()
        return (self.permission, VIEW) if self.needs_view else (self.permission,)

    def body_limit(self) -> tuple[int, str]:
        """The largest body this operation takes, and the setting that makes it so: "" for
        the API's own limit, or DATA_UPLOAD_MAX_MEMORY_SIZE when Django's is smaller
        (Django refuses such a body before the API could read it)."""
        django_limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if django_limit is not None and django_limit < self.max_body_bytes:
            return django_limit, "DATA_UPLOAD_MAX_MEMORY_SIZE"
        return self.max_body_bytes, ""

    def error_codes(self) -> list[str]:
        """Every error code this operation can answer with."""
        # "invalid" everywhere: unknown query parameters are refused on every operation.
        codes = ["method_not_allowed", "invalid", "server_error"]
        if self.permission is not None:
            codes += ["not_authenticated", "permission_denied"]
            if self.method != "GET":
                codes.append("csrf_failed")
        if self.body is not None:
            codes += ["malformed", "invalid", "too_large", "unsupported_media_type"]
        if "<int:job_id>" in self.route or self.finds_job:
            codes.append("not_found")
        if self.conflicts:
            codes += ["duplicate_key", "invalid_transition"]
        if self.writes:
            codes.append("try_again")
        return sorted(set(codes), key=list(ERRORS).index)


def describe_permissions(permissions: Sequence[str]) -> str:
    """'the permission a' or 'the permissions a and b', for messages and the document."""
    if len(permissions) == 1:
        return f"the permission {permissions[0]}"
    return f"the permissions {', '.join(permissions[:-1])} and {permissions[-1]}"
