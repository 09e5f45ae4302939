"""What each endpoint does, once the request is authenticated, permitted and parsed.

Handlers call the public API (``delayjobs.api``), which keeps every rule of a valid job
and of each transition; its exceptions become error responses in ``views``.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.http import HttpRequest
from django.urls import reverse

from delayjobs import api
from delayjobs.exceptions import InvalidTransition, JobNotFound
from delayjobs.http.errors import ApiError
from delayjobs.http.fields import (
    ANY_JSON,
    BOOLEAN,
    DATETIME,
    INTEGER,
    SECONDS,
    STRING,
    TEXT,
    Body,
    Field,
    FieldError,
    Param,
    list_of,
)
from delayjobs.http.serialize import job_json
from delayjobs.models import DelayedJob, JobStatus

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

    def url(self, name: str, **kwargs: Any) -> str:
        """The absolute URL of one of this API's endpoints, wherever it is mounted."""
        namespace = self.request.resolver_match.namespace if self.request.resolver_match else ""
        route = f"{namespace}:{name}" if namespace else name
        return self.request.build_absolute_uri(reverse(route, kwargs=kwargs))


@dataclass(frozen=True)
class Reply:
    status: int
    data: Any
    headers: dict[str, str] = field(default_factory=dict)


# Request bodies ------------------------------------------------------------------------

RUN_AT = Field(
    "run_at",
    DATETIME,
    "When the job is due: ISO 8601 with a UTC offset. A time without one is refused.",
    nullable=True,
    schema_extra={"examples": ["2030-01-15T14:30:00Z"]},
)
DELAY = Field("delay", SECONDS, "Seconds from now until the job is due.", nullable=True)

#: Named as schedule()'s arguments, so that a parsed body is its keyword arguments.
SCHEDULE = Body(
    "schedule request",
    (
        Field("job_type", STRING, "A registered job type's name.", required=True),
        Field("payload", ANY_JSON, "Any JSON value the job receives (default {})."),
        RUN_AT,
        DELAY,
        Field(
            "key",
            STRING,
            "Business key: at most one scheduled or running job holds it.",
            nullable=True,
            schema_extra={"minLength": 1, "maxLength": api.KEY_MAX_LENGTH},
        ),
        Field(
            "replace",
            BOOLEAN,
            "With a key held by a scheduled job, move that job instead of refusing (409).",
        ),
        Field("queue", STRING, "The queue (default: the job type's).", nullable=True),
        Field(
            "max_attempts",
            INTEGER,
            "Executions before the job fails (default: the job type's).",
            nullable=True,
            schema_extra={"minimum": 1, "maximum": api.MAX_ATTEMPTS_LIMIT},
        ),
        Field(
            "max_lateness",
            SECONDS,
            "Seconds after run_at past which the job expires instead of starting "
            "(default: the job type's).",
            nullable=True,
        ),
        Field(
            "priority",
            INTEGER,
            "Among jobs due together, higher runs first (default 0).",
            schema_extra={"minimum": -100, "maximum": 100},
        ),
    ),
    description="Either run_at or delay, or neither for now.",
)
BULK_SCHEDULE = Body(
    "bulk schedule request",
    (
        Field(
            "jobs",
            list_of(SCHEDULE, MAX_BULK_JOBS),
            "Jobs to schedule, all or none, in one transaction.",
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
    (dataclasses.replace(RUN_AT, nullable=False), dataclasses.replace(DELAY, nullable=False)),
    description="Exactly one of run_at and delay.",
    one_of=("run_at", "delay"),
)


# Query parameters of the list ----------------------------------------------------------


def _status(text: str) -> str:
    if text not in JobStatus.values:
        raise FieldError(f"must be one of {', '.join(JobStatus.values)}; got {text!r}.")
    return text


def _limit(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise FieldError(f"must be a whole number from 1 to {MAX_LIMIT}, got {text!r}.")
    return int(text)


def _content_type(text: str) -> ContentType:
    app_label, dot, model = TEXT.convert(text).partition(".")
    try:
        if not dot:
            raise ContentType.DoesNotExist
        return ContentType.objects.get_by_natural_key(app_label, model.lower())
    except ContentType.DoesNotExist:
        raise FieldError(f"must be a model as app_label.model, got {text!r}.") from None


def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"before:{last_id}".encode()).decode().rstrip("=")


def _cursor(text: str) -> int:
    """The id a page ends before, from the opaque cursor of the previous page."""
    try:
        decoded = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("ascii")
        label, _colon, number = decoded.partition(":")
        if label == "before" and number.isdigit() and int(number) <= MAX_ID:
            return int(number)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise FieldError("is not a cursor this API gave out; start again without one.")


LIST_PARAMS = (
    Param(
        "status",
        {"type": "string", "enum": list(JobStatus.values)},
        "Only jobs in this status; repeat for several.",
        _status,
        repeated=True,
    ),
    Param("job_type", {"type": "string"}, "Only jobs of this job type."),
    Param("queue", {"type": "string"}, "Only jobs in this queue."),
    Param("key", {"type": "string"}, "Only jobs with this business key."),
    Param(
        "object_type",
        {"type": "string", "examples": ["meetings.meeting"]},
        "Only jobs about objects of this model (app_label.model).",
        _content_type,
    ),
    Param(
        "object_id",
        {"type": "string"},
        "With object_type: only jobs about the object with this primary key.",
    ),
    Param(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
        "Jobs per page.",
        _limit,
    ),
    Param(
        "cursor",
        {"type": "string"},
        "Where the page starts: next_cursor of the previous page.",
        _cursor,
    ),
)


# Handlers ---------------------------------------------------------------------------


def schedule_job(call: Call) -> Reply:
    job = api.schedule(**call.body)
    return Reply(201, job_json(job), {"Location": call.url("job", job_id=job.pk)})


def schedule_jobs(call: Call) -> Reply:
    jobs = api.schedule_many(call.body["jobs"])
    return Reply(201, {"jobs": [job_json(job) for job in jobs]})


def list_jobs(call: Call) -> Reply:
    """Newest first, by id: a stable order, and a keyset page needs no OFFSET scan."""
    query = call.query
    if "object_id" in query and "object_type" not in query:
        raise ApiError(
            "invalid", "object_id needs object_type.", fields={"object_id": "needs object_type."}
        )
    filters: dict[str, Any] = {
        name: query[name] for name in ("job_type", "queue", "key", "object_id") if name in query
    }
    if "status" in query:
        filters["status__in"] = query["status"]
    if "object_type" in query:
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
    return _cancel(_job(call))


def cancel_job_by_key(call: Call) -> Reply:
    key = call.body["key"]
    holder = DelayedJob.objects.active().filter(key=key).first()
    if holder is None:
        raise JobNotFound(f"No scheduled or running job holds key {key!r}.")
    return _cancel(holder)


def reschedule_job(call: Call) -> Reply:
    job = api.reschedule(_job_id(call), **call.body)
    return Reply(200, job_json(job))


def retry_job(call: Call) -> Reply:
    job = api.retry(_job_id(call))
    return Reply(200, job_json(job))


def _cancel(job: DelayedJob) -> Reply:
    cancelled = api.cancel(job.pk)
    job.refresh_from_db()
    if not cancelled:
        raise InvalidTransition(
            f"Cannot cancel job {job.pk}: it is {job.status}; only a scheduled job can be "
            f"cancelled (a running job is not interrupted)."
        )
    return Reply(200, job_json(job))


def _job_id(call: Call) -> int:
    job_id: int = call.path["job_id"]
    if job_id > MAX_ID:
        raise JobNotFound(f"Job {job_id} does not exist.")
    return job_id


def _job(call: Call) -> DelayedJob:
    job_id = _job_id(call)
    job = DelayedJob.objects.select_related("content_type").filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(f"Job {job_id} does not exist.")
    return job
