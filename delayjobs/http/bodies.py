"""The request bodies of the API, declared once (``fields.Body``): each field's type,
bounds and description, and the rules across fields. Named as ``schedule()``'s
arguments, so that a parsed body is its keyword arguments."""

from __future__ import annotations

import dataclasses
from typing import Any

from delayjobs.core.db import max_length
from delayjobs.http.field_types import (
    BOOLEAN,
    DATETIME,
    DELAY,
    PAYLOAD,
    STRING,
    TEXT,
    Kind,
    Schema,
    integer_between,
    seconds_between,
)
from delayjobs.http.fields import Body, Field, ListOf
from delayjobs.jobtypes import registry
from delayjobs.models import DelayedJob
from delayjobs.validation import (
    KEY_MAX_LENGTH,
    MAX_ATTEMPTS_LIMIT,
    MAX_LATENESS,
    MIN_LATENESS,
    QUEUE_PATTERN,
)

#: Jobs one bulk request may schedule: one transaction holds them all.
MAX_BULK_JOBS = 1000


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
            schema_extra={"minLength": 1, "maxLength": KEY_MAX_LENGTH},
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
            integer_between(1, MAX_ATTEMPTS_LIMIT),
            "Executions before the job fails; null or absent: the job type's.",
            nullable=True,
        ),
        Field(
            "max_lateness",
            seconds_between(MIN_LATENESS, MAX_LATENESS),
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
