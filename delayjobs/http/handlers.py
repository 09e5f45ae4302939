"""What each endpoint does, once the request is authenticated, permitted and parsed.

Handlers call the public API (``delayjobs.api``), which keeps every rule of a valid job
and of each transition; its exceptions become error responses in ``views``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.http import HttpRequest
from django.urls import reverse
from django.utils.translation import gettext

from delayjobs import api
from delayjobs.db import max_length
from delayjobs.exceptions import InvalidTransition, JobNotFound
from delayjobs.http import permissions
from delayjobs.http.errors import ApiError
from delayjobs.http.fields import (
    BOOLEAN,
    DATETIME,
    DELAY,
    PAYLOAD,
    STRING,
    TEXT,
    TEXT_SCHEMA,
    Body,
    Field,
    FieldError,
    Kind,
    ListOf,
    Param,
    Schema,
    integer_between,
    seconds_between,
)
from delayjobs.http.serialize import iso, job_json
from delayjobs.jobtypes import QUEUE_PATTERN, registry
from delayjobs.models import DelayedJob, JobStatus, jobs_database

#: Ids above this cannot exist (a 64-bit primary key); looking one up could overflow.
MAX_ID = 2**63 - 1
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
#: Jobs one bulk request may schedule: one transaction holds them all.
MAX_BULK_JOBS = 1000


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


# Request bodies ------------------------------------------------------------------------

RUN_AT = Field(
    "run_at",
    DATETIME,
    "When the job is due: RFC 3339, seconds and a UTC offset required "
    "(2030-01-15T14:30:00Z); at most DELAYJOBS['MAX_SCHEDULE_AHEAD'] ahead.",
    nullable=True,
    schema_extra={"examples": ["2030-01-15T14:30:00Z"]},
)
DELAY_FIELD = Field(
    "delay",
    DELAY,
    "Seconds from now until the job is due; at most DELAYJOBS['MAX_SCHEDULE_AHEAD'].",
    nullable=True,
)


def _replace_needs_key(values: dict[str, Any]) -> dict[str, str]:
    if values.get("replace") and values.get("key") is None:
        return {"replace": "true needs a key: it moves the scheduled job holding that key."}
    return {}


#: _replace_needs_key in JSON Schema.
REPLACE_NEEDS_KEY: Schema = {
    "if": {"properties": {"replace": {"const": True}}, "required": ["replace"]},
    "then": {"properties": {"key": {"type": "string"}}, "required": ["key"]},
}


def _public_job_types() -> Schema:
    """The job types every key may schedule. A key may also hold a list of private ones,
    which this public document does not name (nor does any error)."""
    public = sorted(name for name in registry.names() if registry.get(name).public)
    schema: Schema = {"type": "string", "minLength": 1, "maxLength": JOB_TYPE_MAX_LENGTH}
    return {**schema, "enum": public} if public else schema


JOB_TYPE_MAX_LENGTH = max_length(DelayedJob, "job_type")
#: A job type's name: one of the public ones, as the document lists them.
JOB_TYPE = Kind(_public_job_types, STRING.convert)


#: Named as schedule()'s arguments, so that a parsed body is its keyword arguments.
SCHEDULE = Body(
    "schedule request",
    (
        Field(
            "job_type",
            JOB_TYPE,
            "A public job type (JobType.public = True), or a private one on the API key's "
            "list of job types; any other name is refused as unknown (400).",
            required=True,
        ),
        Field("payload", PAYLOAD, "The JSON value the job receives (default {})."),
        RUN_AT,
        DELAY_FIELD,
        Field(
            "key",
            TEXT,
            "Business key: at most one scheduled or running job holds it.",
            nullable=True,
            schema_extra={"minLength": 1, "maxLength": api.KEY_MAX_LENGTH},
        ),
        Field(
            "replace",
            BOOLEAN,
            "With a key held by a scheduled job of the same job type and queue, move that "
            "job (its time, payload, max_attempts, max_lateness and priority) instead of "
            "refusing (409). Needs the permission delayjobs.reschedule_delayedjob as well.",
        ),
        Field(
            "queue",
            STRING,
            "The queue (default: the job type's).",
            nullable=True,
            schema_extra={"pattern": QUEUE_PATTERN.pattern, "minLength": 1, "maxLength": 100},
        ),
        Field(
            "max_attempts",
            integer_between(1, api.MAX_ATTEMPTS_LIMIT),
            "Executions before the job fails; null or absent: the job type's.",
            nullable=True,
        ),
        Field(
            "max_lateness",
            seconds_between(api.MIN_LATENESS, api.MAX_LATENESS),
            "Seconds after run_at past which the job expires instead of starting, from "
            "0.001 to 366 days; null or absent: the job type's limit applies.",
            nullable=True,
        ),
        Field(
            "priority",
            integer_between(-100, 100),
            "Among jobs due together, higher runs first (default 0).",
        ),
    ),
    description="At most one of run_at and delay; neither: due now.",
    exclusive=("run_at", "delay"),
    check=_replace_needs_key,
    check_schema=REPLACE_NEEDS_KEY,
)
BULK_SCHEDULE = Body(
    "bulk schedule request",
    (
        Field(
            "jobs",
            ListOf(SCHEDULE, MAX_BULK_JOBS),
            "Jobs to schedule, all or none, in one transaction. Two jobs with the same key "
            "are a conflict (409 duplicate_key).",
            required=True,
        ),
    ),
)
CANCEL_BY_KEY = Body(
    "cancel request",
    (Field("key", TEXT, "The business key of the job to cancel.", required=True),),
)
RESCHEDULE = Body(
    "reschedule request",
    (
        dataclasses.replace(RUN_AT, nullable=False),
        dataclasses.replace(DELAY_FIELD, nullable=False),
    ),
    description="Exactly one of run_at and delay.",
    one_of=("run_at", "delay"),
)


# Query parameters of the list ----------------------------------------------------------


def _status(text: str) -> str:
    if text not in JobStatus.values:
        raise FieldError(f"must be one of {', '.join(JobStatus.values)}; got {text!r}.")
    return text


def _limit(text: str) -> int:
    # The length first: int() refuses thousands of digits with a ValueError of its own.
    # Without the leading zeros, which int() takes: "050" is 50, as it always was.
    digits = text.lstrip("0") or "0"
    if (
        not text.isascii()
        or not text.isdigit()
        or len(digits) > len(str(MAX_LIMIT))
        or not 1 <= int(digits) <= MAX_LIMIT
    ):
        shown = text if len(text) <= 20 else f"{text[:20]}... ({len(text)} characters)"
        raise FieldError(f"must be a whole number from 1 to {MAX_LIMIT}, got {shown!r}.")
    return int(digits)


#: A model's label as Django writes it: app_label.model_name.
MODEL_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")


def _content_type(text: str) -> ContentType | None:
    """The model named; None for a well-formed name of no model (no job is about it)."""
    if not MODEL_LABEL.fullmatch(text):
        raise FieldError(f"must be a model as app_label.model, got {text!r}.")
    app_label, _dot, model = text.partition(".")
    try:
        return ContentType.objects.get_by_natural_key(app_label, model.lower())
    except ContentType.DoesNotExist:
        return None


def encode_cursor(last_id: int) -> str:
    """The cursor of the page after the one ending with job ``last_id``: that id, as
    text. Not a secret: a client may make one (a page of the jobs before an id)."""
    return str(last_id)


def _cursor(text: str) -> int:
    """The id a page ends before; an id past the largest possible one lists from the top."""
    if not CURSOR.fullmatch(text):
        raise FieldError("must be the next_cursor of a page: a whole number (a job id).")
    return min(int(text), MAX_ID)


CURSOR = re.compile(r"[0-9]{1,19}")


LIST_PARAMS = (
    Param(
        "status",
        {"type": "string", "enum": list(JobStatus.values)},
        "Only jobs in this status; repeat for several.",
        _status,
        repeated=True,
    ),
    Param("job_type", TEXT_SCHEMA, "Only jobs of this job type."),
    Param("queue", TEXT_SCHEMA, "Only jobs in this queue."),
    Param("key", TEXT_SCHEMA, "Only jobs with this business key."),
    Param(
        "object_type",
        {"type": "string", "pattern": f"^{MODEL_LABEL.pattern}$", "examples": ["meetings.meeting"]},
        "Only jobs about objects of this model (app_label.model); a model that does not "
        "exist has no jobs.",
        _content_type,
    ),
    Param(
        "object_id",
        TEXT_SCHEMA,
        "Only jobs about an object with this primary key (of the model object_type names, "
        "with it; of any model, without).",
    ),
    Param(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
        "Jobs per page.",
        _limit,
    ),
    Param(
        "cursor",
        {"type": "string", "pattern": f"^{CURSOR.pattern}$"},
        "Where the page starts: next_cursor of the previous page (the jobs with a smaller id).",
        _cursor,
    ),
)


# Handlers ---------------------------------------------------------------------------


def schedule_job(call: Call) -> Reply:
    [spec], [moved] = _prepare_schedule(call, [call.body], bulk=False)
    before = _due_times(moved)
    job = api.schedule(**spec)
    _audit_scheduled(call, [job], before)
    return Reply(201, call.job_body(job), {"Location": call.url("job", job_id=job.pk)})


def schedule_jobs(call: Call) -> Reply:
    specs, moved = _prepare_schedule(call, call.body["jobs"], bulk=True)
    before = _due_times(*moved)
    jobs = api.schedule_many(specs)
    _audit_scheduled(call, jobs, before)
    return Reply(201, {"jobs": [call.job_body(job) for job in jobs]})


def list_jobs(call: Call) -> Reply:
    """Newest first, by id: a stable order, and a keyset page needs no OFFSET scan."""
    query = call.query
    filters: dict[str, Any] = {
        name: query[name] for name in ("job_type", "queue", "key", "object_id") if name in query
    }
    if "status" in query:
        filters["status__in"] = query["status"]
    if "object_type" in query:
        if query["object_type"] is None:  # a model that does not exist: no job is about it
            filters["pk__in"] = []
        else:
            filters["content_type"] = query["object_type"]
    if "cursor" in query:
        filters["pk__lt"] = query["cursor"]
    limit = query.get("limit", DEFAULT_LIMIT)
    jobs = list(
        DelayedJob.objects.select_related("content_type")
        .filter(**filters)
        .order_by("-pk")[: limit + 1]
    )
    more, jobs = len(jobs) > limit, jobs[:limit]
    cursor = encode_cursor(jobs[-1].pk) if more else None
    next_url = None
    if cursor is not None:
        params = call.request.GET.copy()
        params["cursor"] = cursor
        next_url = call.request.build_absolute_uri(f"{call.request.path}?{params.urlencode()}")
    data = {"jobs": [job_json(job) for job in jobs], "next_cursor": cursor, "next": next_url}
    return Reply(200, data)


def get_job(call: Call) -> Reply:
    job = _job(call)
    return Reply(200, job_json(job, job.history.order_by("started_at", "id")))


def cancel_job(call: Call) -> Reply:
    return _cancel(call, _job(call))


def cancel_job_by_key(call: Call) -> Reply:
    key = call.body["key"]
    holder = DelayedJob.objects.active().filter(key=key).first()
    if holder is None:
        raise JobNotFound(f"No scheduled or running job holds key {key!r}.")
    return _cancel(call, holder)


def reschedule_job(call: Call) -> Reply:
    was = _locked_field(call, "run_at")
    job = api.reschedule(_job_id(call), **call.body)
    message = gettext("Rescheduled through the HTTP API from %(old)s to %(new)s (%(actor)s).")
    audit(call, [(job, message % {"old": iso(was), "new": iso(job.run_at), "actor": call.actor})])
    return Reply(200, call.job_body(job))


def retry_job(call: Call) -> Reply:
    was = _locked_field(call, "status")
    job = api.retry(_job_id(call))
    message = gettext("Retried through the HTTP API (was %(status)s; %(actor)s).")
    audit(call, [(job, message % {"status": was, "actor": call.actor})])
    return Reply(200, call.job_body(job))


def _cancel(call: Call, job: DelayedJob) -> Reply:
    cancelled = api.cancel(job.pk)
    job.refresh_from_db()
    if not cancelled:
        raise InvalidTransition(
            f"Cannot cancel job {job.pk}: it is {job.status}; only a scheduled job can be "
            f"cancelled (a running job is not interrupted)."
        )
    message = gettext("Cancelled through the HTTP API (%(actor)s).")
    audit(call, [(job, message % {"actor": call.actor})])
    return Reply(200, call.job_body(job))


def _job_id(call: Call) -> int:
    job_id: int = call.path["job_id"]
    if job_id > MAX_ID:
        raise JobNotFound(f"Job {job_id} does not exist.")
    return job_id


def _locked_field(call: Call, name: str) -> Any:
    """One field of the job, its row locked until the operation's transaction ends: what
    it was before the change, for the audit log."""
    job_id = _job_id(call)
    jobs = DelayedJob.objects.using(jobs_database()).select_for_update().filter(pk=job_id)
    rows = jobs.values_list(name, flat=True)
    if not rows:
        raise JobNotFound(f"Job {job_id} does not exist.")
    return rows[0]


def _job(call: Call) -> DelayedJob:
    job_id = _job_id(call)
    job = DelayedJob.objects.select_related("content_type").filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(f"Job {job_id} does not exist.")
    return job


# Scheduling: job types open to the API, and replace -------------------------------------


def _prepare_schedule(
    call: Call, specs: Sequence[dict[str, Any]], *, bulk: bool
) -> tuple[list[dict[str, Any]], list[DelayedJob | None]]:
    """The specs to give schedule() and, for each, the job its replace will move (or None).

    Refuses (before anything is written) a job type that is not open to the API, a replace
    without the permission to move jobs, and a replace that would turn the job holding the
    key into another job type or move it to another queue.
    """
    if any(spec.get("replace") for spec in specs) and not call.user.has_perm(
        permissions.RESCHEDULE
    ):
        raise ApiError(
            "permission_denied",
            f"replace: true moves the job already holding the key: it needs the permission "
            f"{permissions.RESCHEDULE} as well.",
        )
    _refuse_closed_job_types(specs, allowed=_private_types_allowed(call), bulk=bulk)
    _refuse_repeated_keys(specs)
    prepared: list[dict[str, Any]] = []
    moved: list[DelayedJob | None] = []
    for index, spec in enumerate(specs):
        holder = _replaceable_holder(call, spec, f"jobs[{index}]." if bulk else "")
        # No holder now: a job that takes the key meanwhile is a 409, never moved unchecked.
        prepared.append({**spec, "replace": holder is not None} if "replace" in spec else spec)
        moved.append(holder)
    return prepared, moved


def _private_types_allowed(call: Call) -> frozenset[str]:
    """The private job types the request's key may schedule (none for a session)."""
    names = call.api_key.job_types if call.api_key is not None else []
    return (
        frozenset(name for name in names if isinstance(name, str))
        if isinstance(names, list)
        else frozenset()
    )


def _refuse_closed_job_types(
    specs: Sequence[dict[str, Any]], *, allowed: frozenset[str], bulk: bool
) -> None:
    """400 for a job type that is not registered, or neither ``public`` nor on the key's
    list, alike: the API must not tell which internal job types exist, nor list any."""
    errors: dict[str, str] = {}
    for index, spec in enumerate(specs):
        name = spec["job_type"]
        if name not in registry or not (registry.get(name).public or name in allowed):
            errors[f"jobs[{index}].job_type" if bulk else "job_type"] = (
                f"Unknown job type {name!r}."
            )
    if errors:
        path, message = next(iter(errors.items()))
        detail = f"{path.removesuffix('.job_type')}: {message}" if bulk else message
        raise ApiError("invalid", detail, fields=errors)


def _replaceable_holder(call: Call, spec: dict[str, Any], prefix: str) -> DelayedJob | None:
    """The scheduled job ``spec``'s replace may move, locked; None without one; 409 if the
    job holding the key may not be moved over HTTP."""
    if not spec.get("replace"):
        return None
    key = spec["key"]
    holder = (
        DelayedJob.objects.using(jobs_database())
        .select_for_update()
        .active()
        .filter(key=key)
        .first()
    )
    if holder is None:
        return None
    if holder.status != JobStatus.SCHEDULED:
        reason = f"it is {holder.status} and cannot be moved; schedule again once it ends."
    elif (holder.job_type, holder.queue) != (
        spec["job_type"],
        spec.get("queue") or registry.get(spec["job_type"]).queue,
    ):
        reason = (
            f"it is a {holder.job_type!r} job on queue {holder.queue!r}, and replace over HTTP "
            f"never changes a job's job type or queue. Cancel that job and schedule a new one."
        )
    else:
        return holder
    raise key_taken(key, holder.pk, field=f"{prefix}key", reason=reason, can_view=call.can_view)


def key_taken(
    key: str, holder_id: int | None, *, field: str, reason: str, can_view: bool
) -> ApiError:
    """The 409 for a key an active job holds. A caller who may view jobs learns which job
    and why; any other caller gets one answer whatever the job (of a job type it may not
    schedule, running, or plain taken): the key is not free, which any schedule with it
    would tell, and nothing more."""
    index = field.removesuffix("key").removesuffix(".")
    where = f"{index}: " if index else ""
    if can_view:
        held = f" (job {holder_id})" if holder_id is not None else ""
        detail = f"{where}An active job already holds key {key!r}{held}: {reason}"
        extra: dict[str, Any] = {"existing_id": holder_id}
    else:
        detail = f"{where}Key {key!r} is taken: an active job holds it."
        extra = {}
    return ApiError("duplicate_key", detail, fields={field: detail}, extra=extra)


def _refuse_repeated_keys(specs: Sequence[dict[str, Any]]) -> None:
    """409 for a key given to two jobs of one request: both cannot hold it."""
    seen: set[str] = set()
    for index, spec in enumerate(specs):
        key = spec.get("key")
        if key is None:
            continue
        if key in seen:
            detail = f"jobs[{index}]: key {key!r} is given to an earlier job of this request too."
            raise ApiError("duplicate_key", detail, fields={f"jobs[{index}].key": detail})
        seen.add(key)


def _due_times(*holders: DelayedJob | None) -> dict[int, Any]:
    """When each job a replace moves was due, before: for the audit log."""
    return {holder.pk: holder.run_at for holder in holders if holder is not None}


def _audit_scheduled(call: Call, jobs: Sequence[DelayedJob], moved: dict[int, Any]) -> None:
    scheduled = gettext("Scheduled through the HTTP API (%(actor)s).") % {"actor": call.actor}
    replaced = gettext(
        "Moved through the HTTP API by a schedule with replace, from %(old)s to %(new)s "
        "(%(actor)s)."
    )
    audit(
        call,
        [(job, scheduled) for job in jobs if job.pk not in moved],
        added=True,
    )
    audit(
        call,
        [
            (
                job,
                replaced % {"old": iso(moved[job.pk]), "new": iso(job.run_at), "actor": call.actor},
            )
            for job in jobs
            if job.pk in moved
        ],
    )


def audit(call: Call, entries: Sequence[tuple[DelayedJob, str]], *, added: bool = False) -> None:
    """An admin log entry per job, as the admin's actions write: the user, and a message
    naming the API and the key (or session) used. Nothing without django.contrib.admin."""
    if not entries or not apps.is_installed("django.contrib.admin"):
        return
    from django.contrib.admin.models import ADDITION, CHANGE, LogEntry

    content_type = ContentType.objects.get_for_model(DelayedJob, for_concrete_model=False)
    LogEntry.objects.bulk_create(
        [
            LogEntry(
                user_id=call.user.pk,
                content_type_id=content_type.pk,
                object_id=str(job.pk),
                object_repr=str(job)[:200],
                action_flag=ADDITION if added else CHANGE,
                change_message=message,
            )
            for job, message in entries
        ]
    )
