"""API keys: how they look, how they are made, and how a presented key is checked.

A key reads ``dj_<prefix>_<secret>``. The prefix is stored as it is and finds the row;
only the SHA-256 digest of the secret is stored, so a copy of the database does not
give away working keys. The secret has 256 random bits: a plain (unsalted, fast) hash is
enough, as no dictionary can guess it.

The HTTP API checks presented keys with ``find_key``; the admin and
``create_delay_api_key`` make them with ``create_api_key``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, router, transaction
from django.db.models import Q
from django.utils import timezone

from delayjobs.core.db import max_length
from delayjobs.jobtypes import registry
from delayjobs.models import ApiKey

SCHEME = "dj"
#: 6 random bytes as 12 hex digits: fits ApiKey.prefix (16) and never contains "_".
PREFIX_BYTES = 6
SECRET_BYTES = 32
#: last_used_at is written at most this often per key: a busy service would otherwise
#: write the key's row on every request.
TOUCH_INTERVAL = timedelta(minutes=1)
NAME_MAX_LENGTH = max_length(ApiKey, "name")
#: The whole shape of a key: checked before any query, so that junk in a header (a NUL,
#: non-ASCII text, a prefix longer than the column) is refused without reaching the
#: database, which may not even accept it as a parameter (PostgreSQL refuses NUL).
KEY_FORMAT = re.compile(
    rf"{SCHEME}_(?P<prefix>[0-9a-f]{{{PREFIX_BYTES * 2}}})_(?P<secret>[A-Za-z0-9_-]{{20,128}})"
)


@dataclass(frozen=True)
class KeyMaterial:
    """A new key: the plaintext to hand out once, and what the row stores."""

    prefix: str
    plaintext: str
    digest: str


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_key_material() -> KeyMaterial:
    prefix = secrets.token_hex(PREFIX_BYTES)
    secret = secrets.token_urlsafe(SECRET_BYTES)
    return KeyMaterial(prefix, f"{SCHEME}_{prefix}_{secret}", digest(secret))


def split_key(plaintext: str) -> tuple[str, str] | None:
    """(prefix, secret) of a key in the ``dj_<prefix>_<secret>`` form, else None.

    The prefix is 12 lowercase hex digits, the secret URL-safe base64 (which may itself
    contain "_"); anything else is not a key this module made.
    """
    # fullmatch: "$" would also match before a trailing newline.
    match = KEY_FORMAT.fullmatch(plaintext)
    if match is None:
        return None
    return match["prefix"], match["secret"]


def find_key(plaintext: str) -> ApiKey | None:
    """The key row whose prefix and secret match ``plaintext`` (active or not), or None."""
    parts = split_key(plaintext)
    if parts is None:
        return None
    prefix, secret = parts
    # From the database that takes the writes: a key revoked (or a user deactivated) a
    # moment ago must not still pass on a lagging replica.
    database = router.db_for_write(ApiKey)
    key = ApiKey.objects.using(database).select_related("user").filter(prefix=prefix).first()
    # compare_digest: the time taken does not tell how much of the digest matched.
    if key is None or not hmac.compare_digest(digest(secret), key.digest):
        return None
    return key


def create_api_key(user: Any, name: str, job_types: Iterable[str] = ()) -> tuple[ApiKey, str]:
    """Create a key for ``user``; return the row and the plaintext, which is not stored.

    ``job_types``: private job types the key may schedule besides the public ones.
    """
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX_LENGTH:
        raise ValueError(f"The key's name must be 1-{NAME_MAX_LENGTH} characters, got {name!r}.")
    allowed = check_job_types(job_types)
    # Two keys drawing the same 48-bit prefix is unlikely, not impossible: draw again.
    for _attempt in range(3):
        material = new_key_material()
        try:
            with transaction.atomic():
                key = ApiKey.objects.create(
                    user=user,
                    name=name,
                    prefix=material.prefix,
                    digest=material.digest,
                    job_types=allowed,
                )
        except IntegrityError:
            if ApiKey.objects.filter(prefix=material.prefix).exists():
                continue
            raise
        return key, material.plaintext
    raise RuntimeError("could not draw an unused key prefix")  # pragma: no cover


def check_job_types(names: Iterable[str]) -> list[str]:
    """A key's list of private job types: registered names, each once, sorted."""
    if isinstance(names, str):
        raise ValueError(f"job_types must be a list of job type names, got the string {names!r}.")
    names = list(names)
    unknown = [name for name in names if not isinstance(name, str) or name not in registry]
    if unknown:
        raise ValueError(
            f"Unknown job types {unknown!r}: a key may only name registered job types."
        )
    return sorted(set(names))


def touch(key: ApiKey) -> None:
    """Record that ``key`` was used now, unless that was recorded less than a minute ago."""
    now = timezone.now()
    if key.last_used_at is not None and now - key.last_used_at < TOUCH_INTERVAL:
        return
    # Conditional: of many requests racing past the check above, one writes.
    ApiKey.objects.filter(pk=key.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - TOUCH_INTERVAL)
    ).update(last_used_at=now)
    key.last_used_at = now
