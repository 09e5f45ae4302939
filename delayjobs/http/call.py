"""One parsed request as a handler sees it (``Call``), and what a handler answers
(``Reply``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.http import HttpRequest
from django.urls import reverse
from django.utils.translation import gettext

from delayjobs.http import permissions
from delayjobs.http.serialize import job_json
from delayjobs.models import DelayedJob

#: Ids above this cannot exist (a 64-bit primary key); looking one up could overflow.
MAX_ID = 2**63 - 1


@dataclass(frozen=True)
class Call:
    """One parsed request, as a handler sees it."""

    request: HttpRequest
    user: Any
    #: Path parameters (job_id).
    path: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    query: dict[str, Any] = field(default_factory=dict)
    #: The API key the request came with; None for a session (or a public operation).
    api_key: Any = None

    def url(self, name: str, **kwargs: Any) -> str:
        """The absolute URL of one of this API's endpoints, wherever it is mounted."""
        namespace = self.request.resolver_match.namespace if self.request.resolver_match else ""
        route = f"{namespace}:{name}" if namespace else name
        return self.request.build_absolute_uri(reverse(route, kwargs=kwargs))

    @property
    def can_view(self) -> bool:
        """Whether the caller may read jobs: only then do replies show a job's fields."""
        return self.user is not None and bool(self.user.has_perm(permissions.VIEW))

    def job_body(self, job: DelayedJob) -> dict[str, Any]:
        """The job as the caller may see it: every field, or only its id without
        view_delayedjob (a job found by key may be another service's)."""
        return job_json(job) if self.can_view else {"id": job.pk}

    @property
    def actor(self) -> str:
        """How the caller authenticated, for the audit log: the key's name, or a session."""
        if self.api_key is None:
            return gettext("session")
        return gettext("API key %(name)r") % {"name": self.api_key.name}


@dataclass(frozen=True)
class Reply:
    status: int
    data: Any
    headers: dict[str, str] = field(default_factory=dict)
