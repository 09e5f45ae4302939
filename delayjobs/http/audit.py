"""The admin's log, written by the API: an entry per job changed, naming the user and the
key (or session), as the admin's own actions write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.http import HttpRequest
from django.utils.translation import gettext

from delayjobs.http.schemas import iso
from delayjobs.models import DelayedJob


def audit_scheduled(
    request: HttpRequest, jobs: Sequence[DelayedJob], moved: dict[int, Any]
) -> None:
    """The log entries of a schedule: "scheduled" for each new job, "moved" for each job
    a replace moved (``moved``: when each was due before)."""
    actor = request.auth.actor  # type: ignore[attr-defined]
    scheduled = gettext("Scheduled through the HTTP API (%(actor)s).") % {"actor": actor}
    replaced = gettext(
        "Moved through the HTTP API by a schedule with replace, from %(old)s to %(new)s "
        "(%(actor)s)."
    )
    audit(request, [(job, scheduled) for job in jobs if job.pk not in moved], added=True)
    audit(
        request,
        [
            (job, replaced % {"old": iso(moved[job.pk]), "new": iso(job.run_at), "actor": actor})
            for job in jobs
            if job.pk in moved
        ],
    )


def audit(
    request: HttpRequest, entries: Sequence[tuple[DelayedJob, str]], *, added: bool = False
) -> None:
    """An admin log entry per job, as the admin's actions write: the user, and a message
    naming the API and the key (or session) used. Nothing without django.contrib.admin."""
    if not entries or not apps.is_installed("django.contrib.admin"):
        return
    from django.contrib.admin.models import ADDITION, CHANGE, LogEntry

    content_type = ContentType.objects.get_for_model(DelayedJob, for_concrete_model=False)
    LogEntry.objects.bulk_create(
        [
            LogEntry(
                user_id=request.auth.user.pk,  # type: ignore[attr-defined]
                content_type_id=content_type.pk,
                object_id=str(job.pk),
                object_repr=str(job)[:200],
                action_flag=ADDITION if added else CHANGE,
                change_message=message,
            )
            for job, message in entries
        ]
    )
