"""The list of jobs: its query parameters, and its pages (newest first, by id, a keyset
cursor)."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.contenttypes.models import ContentType

from delayjobs.http.call import MAX_ID, Call, Reply
from delayjobs.http.field_types import TEXT_SCHEMA, FieldError
from delayjobs.http.fields import Param
from delayjobs.http.serialize import job_json
from delayjobs.models import DelayedJob, JobStatus

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


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
