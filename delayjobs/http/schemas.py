"""The API's request and response schemas: pydantic models, which ninja validates with and
makes the OpenAPI document from.

Request schemas hold each field's type and bounds (imported from where the rules live);
what only ``schedule()`` can check (an unknown job type, a taken key, MAX_SCHEDULE_AHEAD,
a payload's size and depth) stays there, and reaches the client as ``InvalidJob`` naming
its field. Bounds that depend on settings or on the date are documented as they are when
the document is built.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from django.utils import timezone
from ninja import Schema
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict
from pydantic.config import JsonDict

from delayjobs.conf import settings as conf
from delayjobs.http.errors import ERRORS
from delayjobs.jobtypes import registry
from delayjobs.models import DelayedJob, JobAttempt, JobStatus
from delayjobs.validation import (
    KEY_MAX_LENGTH,
    MAX_ATTEMPTS_LIMIT,
    MAX_LATENESS,
    MIN_LATENESS,
    NAME_MAX_LENGTH,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_PATTERN,
)

#: Ids above this cannot exist (a 64-bit primary key); looking one up could overflow.
MAX_ID = 2**63 - 1
#: Jobs one bulk request may schedule: one transaction holds them all.
MAX_BULK_JOBS = 1000
MAX_LIMIT = 500
#: Text the database can compare: PostgreSQL refuses NUL in a query. (Lone surrogates,
#: which it refuses too, are no valid string to pydantic.)
NO_NUL = r"^[^\x00]*$"
Text = Annotated[str, Field(pattern=NO_NUL)]
#: RFC 3339's date-time (JSON Schema's "date-time"): seconds and an offset required.
RFC3339 = (
    r"^{year}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])[Tt](?:[01][0-9]|2[0-3]):[0-5][0-9]"
    r":[0-5][0-9](?:\.[0-9]+)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$"
)


def digits_between(low: int | str, high: int | str, width: int = 0) -> str:
    """A regular expression matching the numbers from ``low`` to ``high`` (digit strings keep
    their width) written with ``width`` digits: 0002 to 2125 for the years a job may be due in."""
    low, high = str(low).zfill(width), str(high).zfill(width)
    if not low:
        return ""
    if low[0] == high[0]:
        return low[0] + digits_between(low[1:], high[1:])
    rest = len(low) - 1
    any_rest = f"[0-9]{{{rest}}}" if rest else ""
    if low[1:] == "0" * rest and high[1:] == "9" * rest:
        return f"[{low[0]}-{high[0]}]{any_rest}"
    parts = [low[0] + digits_between(low[1:], "9" * rest)]
    if int(high[0]) - int(low[0]) > 1:
        parts.append(f"[{int(low[0]) + 1}-{int(high[0]) - 1}]{any_rest}")
    parts.append(high[0] + digits_between("0" * rest, high[1:]))
    return f"(?:{'|'.join(parts)})"


def _run_at_years(schema: dict[str, Any]) -> None:
    # From 0002 (0001 at an offset east of UTC is no time in UTC) to the last whole year
    # within MAX_SCHEDULE_AHEAD, which schedule() refuses beyond.
    last_year = (timezone.now() + conf.MAX_SCHEDULE_AHEAD).year - 1
    schema.update(format="date-time", pattern=RFC3339.format(year=digits_between(2, last_year, 4)))


def _seconds(value: float) -> timedelta:
    try:
        return timedelta(seconds=value)
    except OverflowError:
        raise ValueError("too many seconds") from None


def _schedule_ahead(schema: dict[str, Any]) -> None:
    schema["maximum"] = conf.MAX_SCHEDULE_AHEAD.total_seconds()  # schedule() refuses more


def _json_number(value: Any) -> Any:
    # JSON has no integer type: 47.0 is 47 (pydantic's int takes it, not 47.5). But true
    # and "47", which pydantic's int would take too, are no numbers.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    return value


MaxAttempts = Annotated[int, Field(ge=1, le=MAX_ATTEMPTS_LIMIT), BeforeValidator(_json_number)]
Priority = Annotated[int, Field(ge=PRIORITY_MIN, le=PRIORITY_MAX), BeforeValidator(_json_number)]
RunAt = Annotated[
    str,
    Field(pattern=RFC3339.format(year="[0-9]{4}"), json_schema_extra=_run_at_years),
    # ValueError for a day the month lacks.
    AfterValidator(lambda text: datetime.fromisoformat(text.upper())),
]
#: Seconds, as a number (JSON has no durations): a timedelta once valid.
Delay = Annotated[
    float, Strict(), Field(ge=0, json_schema_extra=_schedule_ahead), AfterValidator(_seconds)
]
Lateness = Annotated[
    float,
    Strict(),
    Field(ge=MIN_LATENESS.total_seconds(), le=MAX_LATENESS.total_seconds()),
    AfterValidator(_seconds),
]


def _public_job_types(schema: dict[str, Any]) -> None:
    # The job types every key may schedule. A key may also list private ones, which this
    # public document does not name (nor does any error).
    if public := sorted(jobtype.name for jobtype in registry if jobtype.public):
        schema["enum"] = public


class Body(BaseModel):
    """A request body: unknown fields are refused, not ignored (a typo must not pass). Not
    ninja's Schema, which wraps every object it validates to read a Django model's
    attributes: bodies are JSON, and bulk ones large."""

    model_config = ConfigDict(extra="forbid")


#: What schedule() and reschedule() refuse across fields, for clients that read the document.
ONE_TIME_AT_MOST: JsonDict = {
    "not": {
        "required": ["run_at", "delay"],
        "properties": {"run_at": {"type": "string"}, "delay": {"type": "number"}},
    }
}


class ScheduleIn(Body):
    """One job, named as ``schedule()``'s arguments. At most one of run_at and delay
    (neither: due now); replace needs a key."""

    model_config = ConfigDict(
        json_schema_extra={
            **ONE_TIME_AT_MOST,
            "if": {"properties": {"replace": {"const": True}}, "required": ["replace"]},
            "then": {"properties": {"key": {"type": "string"}}, "required": ["key"]},
        }
    )

    job_type: str = Field(
        min_length=1,
        max_length=NAME_MAX_LENGTH,
        json_schema_extra=_public_job_types,
        description="A public job type, or a private one on the API key's list; any other "
        "name is refused as unknown.",
    )
    payload: Any = Field(None, description="The JSON value the job receives (default {}).")
    run_at: RunAt | None = Field(
        None, description="When the job is due: RFC 3339 with seconds and an offset."
    )
    delay: Delay | None = Field(None, description="Seconds from now until the job is due.")
    key: Annotated[Text, Field(min_length=1, max_length=KEY_MAX_LENGTH)] | None = Field(
        None, description="Business key: at most one scheduled or running job holds it."
    )
    replace: Annotated[bool, Strict()] = Field(
        False,
        description="Move the scheduled job holding the key (same job type and queue) "
        "instead of refusing: needs delayjobs.reschedule_delayedjob too.",
    )
    queue: Annotated[str, Field(pattern=QUEUE_PATTERN.pattern)] | None = Field(
        None, description="The queue (default: the job type's)."
    )
    max_attempts: MaxAttempts | None = Field(
        None, description="Executions before the job fails (default: the job type's)."
    )
    max_lateness: Lateness | None = Field(
        None, description="Seconds after run_at past which the job expires instead of starting."
    )
    priority: Priority = Field(0, description="Among jobs due together, higher first.")


class BulkScheduleIn(Body):
    jobs: list[ScheduleIn] = Field(
        min_length=1,
        max_length=MAX_BULK_JOBS,
        description="Scheduled all or none, in one transaction; two jobs with one key are "
        "a conflict (409).",
    )


class CancelByKeyIn(Body):
    key: Text = Field(description="The business key of the job to cancel.")


class RescheduleIn(Body):
    """At most one of run_at and delay; neither: now."""

    model_config = ConfigDict(json_schema_extra=ONE_TIME_AT_MOST)
    run_at: RunAt | None = None
    delay: Delay | None = None


class ListQuery(Schema):
    status: list[JobStatus] | None = Field(
        None, description="Only jobs in this status; repeat for several."
    )
    job_type: Text | None = Field(None, description="Only jobs of this job type.")
    queue: Text | None = Field(None, description="Only jobs in this queue.")
    key: Text | None = Field(None, description="Only the jobs with this business key.")
    object_type: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$",
        description="Only jobs about objects of this model (app_label.model); a model "
        "that does not exist has no jobs.",
    )
    object_id: Text | None = Field(
        None, description="Only jobs about the object with this primary key (of object_type)."
    )
    limit: int = Field(50, ge=1, le=MAX_LIMIT, description="Jobs per page.")
    cursor: str | None = Field(
        None,
        pattern=r"^[0-9]{1,19}$",
        description="next_cursor of the previous page: the jobs with a smaller id.",
    )


# Responses -------------------------------------------------------------------------------


class JobObject(BaseModel):
    """The object the job is about: its content type (app_label.model; null if the model
    is gone) and its primary key, as text."""

    type: str | None
    id: str


class Job(BaseModel):
    """Every public field of a job. Times are UTC, durations seconds."""

    model_config = ConfigDict(ser_json_timedelta="float")

    id: int
    job_type: str
    queue: str
    status: JobStatus
    payload: Any
    run_at: datetime
    key: str | None
    priority: int
    attempts: int
    max_attempts: int | None = Field(description="null: retried until it succeeds.")
    max_lateness: timedelta | None = Field(description="null: the job type's limit applies.")
    result: Any
    last_error: str
    worker_id: str
    lease_expires_at: datetime | None
    created_at: datetime
    claimed_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    trace_id: str
    object: JobObject | None


class JobId(BaseModel):
    """A job shown to a caller without delayjobs.view_delayedjob: its id only."""

    model_config = ConfigDict(extra="forbid")
    id: int


JobOrId = Annotated[Job | JobId, Field(union_mode="left_to_right")]


class Attempt(BaseModel):
    model_config = ConfigDict(ser_json_timedelta="float")

    number: int
    outcome: str
    worker_id: str
    started_at: datetime
    finished_at: datetime | None
    lateness: timedelta | None = Field(description="Seconds from run_at to the start.")
    error: str
    traceback: str


class JobDetail(Job):
    history: list[Attempt] = Field(description="Every attempt, oldest first.")


class JobList(BaseModel):
    jobs: list[Job]
    next_cursor: str | None = Field(description="The next page's cursor; null on the last.")
    next: str | None = Field(description="The next page's URL; null on the last.")


class Scheduled(BaseModel):
    jobs: list[JobOrId]


class Error(BaseModel):
    error: str = Field(json_schema_extra={"enum": list(ERRORS)})
    detail: str = Field(description="What went wrong, for people: its wording may change.")
    fields: dict[str, str] = Field(description="Each request field at fault (jobs.3.run_at).")
    id: str | None = Field(None, description="server_error: the error's id in the log.")
    existing_id: int | None = Field(
        None, description="duplicate_key: the job holding the key, to callers who may view it."
    )


def job_json(job: DelayedJob, history: list[JobAttempt] | None = None) -> dict[str, Any]:
    """Every public field of ``job`` (``Job``); with ``history``, its attempts too."""
    data = {name: getattr(job, name) for name in Job.model_fields if name != "object"}
    data["object"] = None
    if job.content_type_id is not None:
        # content_type is cached per id by ContentType's manager: no query per job.
        model = job.content_type
        label = f"{model.app_label}.{model.model}" if model else None
        data["object"] = {"type": label, "id": job.object_id}
    if history is not None:
        data["history"] = [
            {name: getattr(row, name) for name in Attempt.model_fields} for row in history
        ]
    return data
