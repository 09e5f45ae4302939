"""Who makes a request: an API key (``Authorization: Bearer``) or a Django session.

A request that carries an ``Authorization`` header is judged by that header alone: a bad
key is refused even if a session cookie came along, so a service never acts as whoever
last logged in to the browser it shares. Session requests with unsafe methods must pass
Django's CSRF check; key requests are exempt, since a browser never adds a Bearer header
to a forged request by itself.

A session counts only for staff users (``is_staff``), as in the admin: the API is a tool
of the site's operators, not of every logged-in visitor. Keys need not belong to staff:
a service's user is usually a plain account with only the permissions it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware

from delayjobs import api_keys as keys
from delayjobs.http.errors import ApiError
from delayjobs.models import ApiKey

#: The challenge of every 401, as RFC 6750 asks.
CHALLENGE = 'Bearer realm="delayjobs"'
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


@dataclass(frozen=True)
class Identity:
    user: Any
    #: The key used, or None for a session.
    api_key: ApiKey | None


def authenticate(request: HttpRequest) -> Identity:
    """The request's identity; ApiError (401, or 403 for CSRF) if it has none."""
    header = request.META.get("HTTP_AUTHORIZATION")
    if header is not None:
        return _from_bearer(header)
    user = getattr(request, "user", None)  # None without AuthenticationMiddleware
    if user is not None and user.is_authenticated and user.is_active:
        if not user.is_staff:
            raise unauthenticated(
                "A session authenticates only staff users; send 'Authorization: Bearer <key>'."
            )
        if request.method not in SAFE_METHODS:
            _check_csrf(request)
        return Identity(user, None)
    raise unauthenticated(
        "Authentication credentials were not provided: send 'Authorization: Bearer <key>'."
    )


def unauthenticated(detail: str) -> ApiError:
    return ApiError("not_authenticated", detail, headers={"WWW-Authenticate": CHALLENGE})


def _from_bearer(header: str) -> Identity:
    scheme, _space, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        raise unauthenticated("Malformed Authorization header: expected 'Bearer <key>'.")
    # find_key checks the key's format before it queries: junk never reaches the database.
    key = keys.find_key(token)
    # One message for an unknown prefix and a wrong secret: neither helps a guesser.
    if key is None:
        raise unauthenticated("Invalid API key.")
    if not key.is_active:
        raise unauthenticated("This API key has been revoked.")
    if not key.user.is_active:
        raise unauthenticated("The user of this API key is inactive.")
    keys.touch(key)
    return Identity(key.user, key)


class _CsrfCheck(CsrfViewMiddleware):
    """Django's own CSRF check, run on demand, giving the reason instead of a 403 page."""

    def _reject(self, request: HttpRequest, reason: str) -> Any:
        return reason


def _no_response(request: HttpRequest) -> HttpResponse:
    """The view the CSRF check is run around; never called: the check only compares."""
    raise AssertionError("the CSRF check called its view")


def _check_csrf(request: HttpRequest) -> None:
    check = _CsrfCheck(_no_response)
    # process_request reads the CSRF cookie (or session) that process_view compares.
    check.process_request(request)
    reason = check.process_view(request, _no_response, (), {})
    if reason:
        raise ApiError("csrf_failed", f"CSRF check failed: {reason}")
