"""Jobs and attempts as JSON, and the JSON Schema of each, side by side.

Times are ISO 8601 in UTC (``2030-01-15T14:30:00.123456Z``), durations are seconds (a
number), and the linked object is its content type (``app_label.model``) and its id.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus

Schema = dict[str, Any]


def iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def seconds(duration: timedelta | None) -> float | None:
    return None if duration is None else duration.total_seconds()


def job_json(job: DelayedJob, history: Iterable[JobAttempt] | None = None) -> dict[str, Any]:
    """Every public field of ``job``; with ``history``, its attempts too."""
    data: dict[str, Any] = {
        "id": job.pk,
        "job_type": job.job_type,
        "queue": job.queue,
        "status": job.status,
        "payload": job.payload,
        "run_at": iso(job.run_at),
        "key": job.key,
        "priority": job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "max_lateness": seconds(job.max_lateness),
        "result": job.result,
        "last_error": job.last_error,
        "worker_id": job.worker_id,
        "lease_expires_at": iso(job.lease_expires_at),
        "created_at": iso(job.created_at),
        "claimed_at": iso(job.claimed_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "trace_id": job.trace_id,
        "object": object_json(job),
    }
    if history is not None:
        data["history"] = [attempt_json(attempt) for attempt in history]
    return data


def object_json(job: DelayedJob) -> dict[str, str | None] | None:
    if job.content_type_id is None:
        return None
    # content_type is cached per id by ContentType's manager: no query per job.
    content_type = job.content_type
    label = f"{content_type.app_label}.{content_type.model}" if content_type else None
    return {"type": label, "id": job.object_id}


def attempt_json(attempt: JobAttempt) -> dict[str, Any]:
    return {
        "number": attempt.number,
        "outcome": attempt.outcome,
        "worker_id": attempt.worker_id,
        "started_at": iso(attempt.started_at),
        "finished_at": iso(attempt.finished_at),
        "lateness": seconds(attempt.lateness),
        "error": attempt.error,
        "traceback": attempt.traceback,
    }


def _nullable(schema: Schema) -> Schema:
    return {**schema, "type": [schema["type"], "null"]}


TIME: Schema = {"type": "string", "format": "date-time"}
SECONDS: Schema = {"type": "number", "description": "Seconds."}

ATTEMPT_SCHEMA: Schema = {
    "type": "object",
    "description": "One execution of a job.",
    "properties": {
        "number": {"type": "integer", "minimum": 1},
        "outcome": {"type": "string", "enum": list(AttemptOutcome.values)},
        "worker_id": {"type": "string"},
        "started_at": TIME,
        "finished_at": _nullable(TIME),
        "lateness": {
            **SECONDS,
            "description": "When the attempt began to execute minus the job's run_at.",
        },
        "error": {"type": "string"},
        "traceback": {"type": "string"},
    },
}
ATTEMPT_SCHEMA["required"] = list(ATTEMPT_SCHEMA["properties"])

OBJECT_SCHEMA: Schema = {
    "type": ["object", "null"],
    "description": "The object the job is about (schedule(obj=...)), or null.",
    "properties": {
        "type": {
            "type": ["string", "null"],
            "description": "Its content type, app_label.model (null if the model is gone).",
        },
        "id": {"type": "string", "description": "Its primary key, as text."},
    },
    "required": ["type", "id"],
}

JOB_SCHEMA: Schema = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "job_type": {"type": "string"},
        "queue": {"type": "string"},
        "status": {"type": "string", "enum": list(JobStatus.values)},
        "payload": {"description": "The JSON payload the job receives."},
        "run_at": {**TIME, "description": "When the job is (or was) due."},
        "key": {"type": ["string", "null"], "description": "Business key, if any."},
        "priority": {"type": "integer", "minimum": -100, "maximum": 100},
        "attempts": {"type": "integer", "minimum": 0},
        "max_attempts": {
            "type": ["integer", "null"],
            "minimum": 1,
            "description": "Executions before the job fails; null: no limit, it is retried "
            "until it succeeds.",
        },
        "max_lateness": {
            **_nullable(SECONDS),
            "description": "Seconds after run_at past which it expires instead of starting; "
            "null: its job type's max_lateness applies (which may be no limit).",
        },
        "result": {"description": "What the job's execute() returned, or null."},
        "last_error": {"type": "string"},
        "worker_id": {"type": "string"},
        "lease_expires_at": _nullable(TIME),
        "created_at": TIME,
        "claimed_at": {
            **_nullable(TIME),
            "description": "When a consumer claimed the current or latest run (up to "
            "CLAIM_AHEAD before run_at).",
        },
        "started_at": {
            **_nullable(TIME),
            "description": "When the latest attempt began to execute, written with its "
            "outcome (null while the first attempt runs).",
        },
        "finished_at": _nullable(TIME),
        "trace_id": {"type": "string"},
        "object": {"$ref": "#/components/schemas/JobObject"},
    },
}
JOB_SCHEMA["required"] = list(JOB_SCHEMA["properties"])

JOB_DETAIL_SCHEMA: Schema = {
    "allOf": [
        {"$ref": "#/components/schemas/Job"},
        {
            "type": "object",
            "properties": {
                "history": {
                    "type": "array",
                    "description": "Every attempt, oldest first.",
                    "items": {"$ref": "#/components/schemas/Attempt"},
                }
            },
            "required": ["history"],
        },
    ]
}
