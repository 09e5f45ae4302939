"""The API's operations: ninja views that call the public API (``delayjobs.api``), which
keeps every rule of a valid job and of each transition; each declares its permissions,
schemas and errors (``operation``), from which ninja makes the OpenAPI document. A write
runs in one transaction: refused half-way, it leaves nothing behind, and its jobs reach
Redis only once it commits. Each change is written to the admin's log."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.translation import gettext
from ninja import Path, Query, Router, Status
from pydantic import BaseModel

from delayjobs import api
from delayjobs.core import tracing
from delayjobs.exceptions import DuplicateJob, InvalidTransition, JobNotFound, UnknownJobType
from delayjobs.http import schemas
from delayjobs.http.auth import MAX_BODY_BYTES, MAX_BULK_BODY_BYTES, Identity, access
from delayjobs.http.errors import ApiError
from delayjobs.jobtypes import registry
from delayjobs.models import DelayedJob, jobs_database

#: The URL namespace of the API (``delayjobs.http.urls``).
NS = "delayjobs_api"
#: The permissions operations need: the admin's, as app_label.codename.
VIEW = "delayjobs.view_delayedjob"
ADD = "delayjobs.add_delayedjob"
CANCEL = "delayjobs.cancel_delayedjob"
RESCHEDULE = "delayjobs.reschedule_delayedjob"
RETRY = "delayjobs.retry_delayedjob"
router = Router()
#: A job's id in a path: a larger one cannot exist.
JobId = Path(..., le=schemas.MAX_ID)
View = Callable[..., Any]


def operation(
    method: str,
    path: str,
    permissions: Sequence[str],
    response: dict[int, Any],
    *,
    max_body: int = MAX_BODY_BYTES,
    finds_job: bool = False,
    **options: Any,
) -> Callable[[View], View]:
    """Registers the view as a ninja operation needing ``permissions``; a GET also answers
    HEAD (the server drops the body). A POST writes, in one transaction: a deadlock may
    roll it back (503), a job's state or key may conflict (409). A view with a ``body``
    reads one, of at most ``max_body`` bytes (413, 415). A job named by its id in the path,
    or ``finds_job`` otherwise, may not exist (404)."""

    def register(view: View) -> View:
        body = "body" in inspect.signature(view).parameters
        statuses = {400, 401, 403, 405, 422, 500}
        statuses |= {413, 415} if body else set()
        statuses |= {409, 503} if method == "POST" else set()
        statuses |= {404} if "job_id" in path or finds_job else set()
        common: dict[str, Any] = {
            "auth": access(*permissions, max_body=max_body if body else None),
            "response": {**response, tuple(sorted(statuses)): schemas.Error},
        }
        extra = {"x-permissions": list(permissions), **options.pop("openapi_extra", {})}
        view = in_transaction(view) if method == "POST" else view
        router.add_api_operation(path, [method], view, openapi_extra=extra, **options, **common)
        if method == "GET":
            router.add_api_operation(path, ["HEAD"], view, include_in_schema=False, **common)
        return view

    return register


def in_transaction(view: View) -> View:
    @functools.wraps(view)
    def run(request: HttpRequest, **values: Any) -> Any:
        # A POST sends jobs: their send span continues the caller's trace (traceparent).
        with tracing.continued(request.headers), transaction.atomic(using=jobs_database()):
            return view(request, **values)

    return run


def caller(request: HttpRequest) -> Identity:
    return request.auth  # type: ignore[attr-defined]  # set by ninja, from auth


def sent(body: BaseModel) -> dict[str, Any]:
    """The fields of ``body`` sent, validated (times as datetimes, seconds as timedeltas):
    the function called applies its own defaults to the others."""
    return {name: getattr(body, name) for name in body.model_fields_set}


def shown(request: HttpRequest, jobs: list[DelayedJob]) -> list[dict[str, Any]]:
    """The jobs as the caller may see them: every field, or only their ids without the view
    permission (scheduling does not let a caller read jobs; a job found by key may be
    another service's)."""
    if caller(request).user.has_perm(VIEW):  # once: a bulk request may have a thousand
        return [schemas.job_json(job) for job in jobs]
    return [{"id": job.pk} for job in jobs]


def key_taken(request: HttpRequest, exc: DuplicateJob, field: str | None) -> ApiError:
    """The 409 for a key an active job holds. Only a caller who may view jobs learns which
    job holds it and why: any other caller gets one answer whatever the job (of a job type
    it may not schedule, running, or plainly taken), which any schedule with that key
    would tell anyway."""
    fields = {field: "An active job holds this key."} if field else {}
    if not caller(request).user.has_perm(VIEW):
        detail = f"Key {exc.key!r} is taken: an active job holds it."
        return ApiError("duplicate_key", detail, fields=fields)
    return ApiError("duplicate_key", str(exc), fields=fields, existing_id=exc.existing_id)


# Scheduling ------------------------------------------------------------------------------

LINKS = {
    target: {"operationId": target, "parameters": {"job_id": "$response.body#/id"}}
    for target in ("getJob", "cancelJob", "rescheduleJob", "retryJob")
}
LOCATION = {"Location": {"description": "The job's URL.", "schema": {"type": "string"}}}
CREATED = {"responses": {201: {"links": LINKS, "headers": LOCATION}}}


@operation("POST", "jobs/", [ADD], {201: schemas.JobOrId}, url_name="jobs", openapi_extra=CREATED)
def schedule_job(
    request: HttpRequest, body: schemas.ScheduleIn, response: HttpResponse
) -> Status[Any]:
    """Schedules a job (delayjobs.schedule). With replace, it also needs
    delayjobs.reschedule_delayedjob. The reply shows the job's fields only with
    delayjobs.view_delayedjob; without it, only its id."""
    [spec], moved = prepare(request, [body], bulk=False)
    try:
        job = api.schedule(**spec)
    except DuplicateJob as exc:
        raise key_taken(request, exc, "key") from exc
    audit_scheduled(request, [job], moved)
    response["Location"] = request.build_absolute_uri(reverse(f"{NS}:job", args=[job.pk]))
    return Status(201, shown(request, [job])[0])


@operation("POST", "jobs/bulk/", [ADD], {201: schemas.Scheduled}, max_body=MAX_BULK_BODY_BYTES)
def schedule_jobs(request: HttpRequest, body: schemas.BulkScheduleIn) -> Status[Any]:
    """Schedules many jobs, all or none (delayjobs.schedule_many): as scheduleJob, for
    each job of the list."""
    specs, moved = prepare(request, body.jobs, bulk=True)
    try:
        jobs = api.schedule_many(specs)
    except DuplicateJob as exc:
        index = next(i for i, spec in enumerate(specs) if spec.get("key") == exc.key)
        raise key_taken(request, exc, f"jobs.{index}.key") from exc
    audit_scheduled(request, jobs, moved)
    return Status(201, {"jobs": shown(request, jobs)})


def prepare(
    request: HttpRequest, bodies: Sequence[schemas.ScheduleIn], *, bulk: bool
) -> tuple[list[dict[str, Any]], dict[int, Any]]:
    """The specs to give schedule(), and when each job a replace will move was due.

    Refuses, before anything is written: a replace without the permission to move jobs; a
    job type not open to the key, exactly as an unknown one (the API must not tell which
    internal job types exist); a key twice in one request; a replace that would move a
    job that is not scheduled, or change its job type or queue."""
    identity = caller(request)
    specs = [sent(body) for body in bodies]
    if any(spec.get("replace") for spec in specs) and not identity.user.has_perm(RESCHEDULE):
        raise ApiError("permission_denied", f"replace: true needs {RESCHEDULE} too.")
    listed = identity.api_key.job_types if identity.api_key is not None else []
    seen: set[str] = set()
    moved: dict[int, Any] = {}
    for index, spec in enumerate(specs):
        at = f"jobs.{index}." if bulk else ""
        name = spec["job_type"]
        if name not in registry or not (registry.get(name).public or name in listed):
            exc = UnknownJobType(name)
            exc.index = index if bulk else None
            raise exc
        if (key := spec.get("key")) is None:
            continue
        if key in seen:
            detail = "Given to an earlier job of this request too."
            raise ApiError("duplicate_key", detail, fields={f"{at}key": detail})
        seen.add(key)
        if spec.get("replace"):
            # No holder now: a job that takes the key meanwhile is a 409, never moved.
            holder = replaceable_holder(request, spec, f"{at}key")
            spec["replace"] = holder is not None
            moved.update({holder.pk: holder.run_at} if holder else {})
    return specs, moved


def replaceable_holder(request: HttpRequest, spec: dict[str, Any], field: str) -> Any:
    """The job ``spec``'s replace may move, locked (schedule() refuses it unless it is
    scheduled); None without one; 409 if it is another job type or on another queue: over
    HTTP, a replace never changes them."""
    active = DelayedJob.objects.using(jobs_database()).select_for_update().active()
    holder = active.filter(key=spec["key"]).first()
    queue = spec.get("queue") or registry.get(spec["job_type"]).queue
    if holder is None or (holder.job_type, holder.queue) == (spec["job_type"], queue):
        return holder
    why = (
        f"it is a {holder.job_type!r} job on queue {holder.queue!r}, and replace over HTTP "
        f"never changes a job's job type or queue; cancel it and schedule a new one"
    )
    raise key_taken(request, DuplicateJob(spec["key"], holder.pk, why), field)


# Reading -------------------------------------------------------------------------------


@operation("GET", "jobs/", [VIEW], {200: schemas.JobList})
def list_jobs(request: HttpRequest, query: Query[schemas.ListQuery]) -> dict[str, Any]:
    """Lists jobs, newest first (by id: a stable order, and a keyset page needs no OFFSET
    scan), a page at a time: next_cursor leads to the next page."""
    filters = query.model_dump(include={"job_type", "queue", "key", "object_id"}, exclude_none=True)
    if query.status:
        filters["status__in"] = query.status
    if query.object_type is not None:
        app_label, _dot, model = query.object_type.partition(".")
        found = ContentType.objects.filter(app_label=app_label, model=model.lower())
        filters["content_type__in"] = list(found)  # none for a model that does not exist
    if query.cursor is not None:
        filters["pk__lt"] = min(int(query.cursor), schemas.MAX_ID)
    jobs = DelayedJob.objects.select_related("content_type").filter(**filters).order_by("-pk")
    page = list(jobs[: query.limit + 1])
    jobs_json = [schemas.job_json(job) for job in page[: query.limit]]
    if len(page) <= query.limit:  # the last page
        return {"jobs": jobs_json, "next_cursor": None, "next": None}
    params = request.GET.copy()
    params["cursor"] = cursor = str(page[query.limit - 1].pk)
    next_url = request.build_absolute_uri(f"{request.path}?{params.urlencode()}")
    return {"jobs": jobs_json, "next_cursor": cursor, "next": next_url}


@operation("GET", "jobs/{int:job_id}/", [VIEW], {200: schemas.JobDetail}, url_name="job")
def get_job(request: HttpRequest, job_id: int = JobId) -> dict[str, Any]:
    """One job, with its attempts, oldest first."""
    job = DelayedJob.objects.select_related("content_type").filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(f"Job {job_id} does not exist.")
    return schemas.job_json(job, list(job.history.order_by("started_at", "id")))


# Actions ---------------------------------------------------------------------------------
# Each also needs the view permission, as in the admin, whose actions are on its job
# list: without it a caller could act on jobs it may not see, and learn from 404 against
# 409 which ids exist and in what state. Each answers the job, after the change.


@operation("POST", "jobs/cancel/", [CANCEL, VIEW], {200: schemas.Job}, finds_job=True)
def cancel_job_by_key(request: HttpRequest, body: schemas.CancelByKeyIn) -> dict[str, Any]:
    """Cancels the scheduled job holding a business key."""
    job = DelayedJob.objects.active().filter(key=body.key).first()
    if job is None:
        raise JobNotFound(f"No scheduled or running job holds key {body.key!r}.")
    return cancel(request, job)


@operation("POST", "jobs/{int:job_id}/cancel/", [CANCEL, VIEW], {200: schemas.Job})
def cancel_job(request: HttpRequest, job_id: int = JobId) -> dict[str, Any]:
    """Cancels a scheduled job (a running one is not interrupted: 409)."""
    job = DelayedJob.objects.filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(f"Job {job_id} does not exist.")
    return cancel(request, job)


def cancel(request: HttpRequest, job: DelayedJob) -> dict[str, Any]:
    cancelled = api.cancel(job.pk)
    job.refresh_from_db()
    if not cancelled:
        raise InvalidTransition(f"Cannot cancel job {job.pk}: it is {job.status}.")
    audit(request, [(job, gettext("Cancelled through the HTTP API (%(actor)s)."), {})])
    return schemas.job_json(job)


@operation("POST", "jobs/{int:job_id}/reschedule/", [RESCHEDULE, VIEW], {200: schemas.Job})
def reschedule_job(request: HttpRequest, body: schemas.RescheduleIn, job_id: int = JobId) -> Any:
    """Moves a scheduled job to run_at, or after delay, or now."""
    was = locked_field(job_id, "run_at")
    job = api.reschedule(job_id, **sent(body))
    message = gettext("Rescheduled through the HTTP API from %(old)s to %(new)s (%(actor)s).")
    audit(request, [(job, message, {"old": iso(was), "new": iso(job.run_at)})])
    return schemas.job_json(job)


@operation("POST", "jobs/{int:job_id}/retry/", [RETRY, VIEW], {200: schemas.Job})
def retry_job(request: HttpRequest, job_id: int = JobId) -> dict[str, Any]:
    """Runs a finished job (failed, cancelled, succeeded, skipped, expired) again now; its
    history stays."""
    was = locked_field(job_id, "status")
    try:
        job = api.retry(job_id)
    except DuplicateJob as exc:  # its key, taken since: it can run again once that job ends
        raise key_taken(request, exc, None) from exc
    message = gettext("Retried through the HTTP API (was %(status)s; %(actor)s).")
    audit(request, [(job, message, {"status": was})])
    return schemas.job_json(job)


def locked_field(job_id: int, name: str) -> Any:
    """One field of the job, its row locked until the transaction ends: what it was
    before the change, for the audit log."""
    rows = DelayedJob.objects.using(jobs_database()).select_for_update().filter(pk=job_id)
    values = rows.values_list(name, flat=True)
    if not values:
        raise JobNotFound(f"Job {job_id} does not exist.")
    return values[0]


# The admin's log -------------------------------------------------------------------------


def audit_scheduled(request: HttpRequest, jobs: list[DelayedJob], moved: dict[int, Any]) -> None:
    """The log entries of a schedule: "scheduled" for each new job, "moved" for each job
    a replace moved (``moved``: when each was due before)."""
    scheduled = gettext("Scheduled through the HTTP API (%(actor)s).")
    replaced = gettext(
        "Moved through the HTTP API by a schedule with replace, from %(old)s to %(new)s "
        "(%(actor)s)."
    )
    audit(request, [(job, scheduled, {}) for job in jobs if job.pk not in moved], added=True)
    audit(
        request,
        [
            (job, replaced, {"old": iso(moved[job.pk]), "new": iso(job.run_at)})
            for job in jobs
            if job.pk in moved
        ],
    )


def iso(moment: datetime | None) -> str | None:
    """A time as the API writes it: ISO 8601 in UTC, 2030-01-15T14:30:00.123456Z."""
    return None if moment is None else moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def audit(
    request: HttpRequest, entries: Sequence[tuple[DelayedJob, str, dict]], *, added: bool = False
) -> None:
    """An entry per job, as the admin's actions write: the user, and the message filled in
    (with the key or session used). Nothing without django.contrib.admin."""
    if not entries or not apps.is_installed("django.contrib.admin"):
        return
    from django.contrib.admin.models import ADDITION, CHANGE, LogEntry

    identity = caller(request)
    content_type = ContentType.objects.get_for_model(DelayedJob, for_concrete_model=False)
    LogEntry.objects.bulk_create(
        [
            LogEntry(
                user_id=identity.user.pk,
                content_type_id=content_type.pk,
                object_id=str(job.pk),
                object_repr=str(job)[:200],
                action_flag=ADDITION if added else CHANGE,
                change_message=message % {**values, "actor": identity.actor},
            )
            for job, message, values in entries
        ]
    )
