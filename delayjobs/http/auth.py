"""Who may call an operation, and how much they may send: ninja auth classes, which run
before ninja reads the body. Once the caller is known: its permissions (403), then the
body's declared length (413), so that neither costs a read.

A request with an ``Authorization`` header is judged by that header alone: a service never
acts as whoever last logged in to the browser it shares. A session counts only for staff
users, as in the admin, and must pass Django's CSRF check for unsafe methods (a browser
never adds a Bearer header by itself). A key's user need not be staff: a service's user is
usually a plain account with only the permissions it needs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.conf import settings
from django.http import HttpRequest
from django.utils.translation import gettext
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from delayjobs import api_keys as keys
from delayjobs.http.errors import ApiError, unauthenticated
from delayjobs.models import ApiKey

#: The largest body of one request; a job's payload is at most 64 KiB by default
#: (DELAYJOBS["MAX_PAYLOAD_BYTES"]), so this leaves room for the rest and more.
MAX_BODY_BYTES = 1024 * 1024
#: A bulk request carries up to a thousand jobs.
MAX_BULK_BODY_BYTES = 8 * 1024 * 1024


class Identity(NamedTuple):
    """``request.auth`` of an authenticated request: its user, and the key (None: a session)."""

    user: Any
    api_key: ApiKey | None

    @property
    def actor(self) -> str:
        """How the caller authenticated, for the audit log: the key's name, or a session."""
        if self.api_key is None:
            return gettext("session")
        return gettext("API key %(name)r") % {"name": self.api_key.name}


class Gate:
    """What an operation asks of an authenticated caller: its permissions, and at most
    ``max_body`` bytes of body (or Django's DATA_UPLOAD_MAX_MEMORY_SIZE, if smaller, which
    Django enforces as it reads). None: the operation reads no body, and ninja never will."""

    def __init__(self, permissions: tuple[str, ...], max_body: int | None, **auth: Any) -> None:
        self.permissions, self.max_body = permissions, max_body
        super().__init__(**auth)

    def admit(self, request: HttpRequest, user: Any, api_key: ApiKey | None) -> Identity:
        if not user.has_perms(self.permissions):
            needed = " and ".join(self.permissions)
            raise ApiError("permission_denied", f"This operation needs {needed}.")
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if self.max_body is not None and declared > self.max_body:
            raise ApiError("too_large", f"The body is over the limit of {self.max_body} bytes.")
        return Identity(user, api_key)


class ApiKeyAuth(Gate, HttpBearer):
    """``Authorization: Bearer dj_<prefix>_<secret>`` (``manage.py create_delay_api_key``)."""

    openapi_bearerFormat = "dj_<prefix>_<secret>"  # noqa: N815  (the OpenAPI name)

    def __call__(self, request: HttpRequest) -> Identity | None:
        header = request.headers.get("Authorization")
        if header is None:
            return None
        scheme, _space, token = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            raise unauthenticated("Malformed Authorization header: expected 'Bearer <key>'.")
        return self.authenticate(request, token.strip())

    def authenticate(self, request: HttpRequest, token: str) -> Identity:
        # find_key checks the key's format before it queries: junk never reaches the database.
        key = keys.find_key(token)
        if key is None or not key.is_active or not key.user.is_active:
            # One answer for all: neither helps a guesser.
            raise unauthenticated("Invalid, revoked or inactive API key.")
        keys.touch(key)
        return self.admit(request, key.user, key)


class StaffSessionAuth(Gate, APIKeyCookie):
    """A logged-in Django session of a staff user; unsafe methods need X-CSRFToken."""

    param_name = settings.SESSION_COOKIE_NAME

    def authenticate(self, request: HttpRequest, key: str | None) -> Identity | None:
        # Only without an Authorization header: ApiKeyAuth, first, judges any.
        user = getattr(request, "user", None)  # None without AuthenticationMiddleware
        if user is None or not user.is_authenticated:
            return None
        if not user.is_staff or not user.is_active:
            raise unauthenticated("A session authenticates only active staff users.")
        if request.method not in ("GET", "HEAD", "OPTIONS", "TRACE") and check_csrf(request):
            raise ApiError("csrf_failed", "CSRF check failed: send the X-CSRFToken header.")
        return self.admit(request, user, None)


def access(*permissions: str, max_body: int | None) -> list[Any]:
    """The auth of an operation needing ``permissions``: a key, or a staff session (whose
    CSRF check is StaffSessionAuth's own, for staff sessions only)."""
    return [ApiKeyAuth(permissions, max_body), StaffSessionAuth(permissions, max_body, csrf=False)]
