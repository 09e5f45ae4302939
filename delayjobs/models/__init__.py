"""The app's models (foundation): the job rows in ``jobs``, the control rows
(pauses, consumers, API keys) in ``control``, recurring schedules in ``schedules``. Django
loads them from this package; the documented paths are ``delayjobs.models.<Name>``, and
migration 0001 names ``delayjobs.models.new_trace_id``.
"""

from delayjobs.models.control import ApiKey, Consumer, Pause, PauseKind
from delayjobs.models.jobs import (
    ACTIVE_STATUSES,
    FINAL_STATUSES,
    PRIORITY_MAX,
    PRIORITY_MIN,
    RETRYABLE_STATUSES,
    AttemptOutcome,
    DelayedJob,
    DelayedJobQuerySet,
    JobAttempt,
    JobStatus,
    LimitReservation,
    LimitStart,
    WriteDatabaseManager,
    jobs_database,
    new_trace_id,
)
from delayjobs.models.schedules import MisfirePolicy, Schedule, ScheduleSource

__all__ = [
    "ACTIVE_STATUSES",
    "FINAL_STATUSES",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "RETRYABLE_STATUSES",
    "ApiKey",
    "AttemptOutcome",
    "Consumer",
    "DelayedJob",
    "DelayedJobQuerySet",
    "JobAttempt",
    "JobStatus",
    "LimitReservation",
    "LimitStart",
    "MisfirePolicy",
    "Pause",
    "PauseKind",
    "Schedule",
    "ScheduleSource",
    "WriteDatabaseManager",
    "jobs_database",
    "new_trace_id",
]
