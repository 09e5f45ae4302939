"""Compatibility path: the code lives in delayjobs.spec.jobtypes."""

from delayjobs.spec.jobtypes import (  # noqa: F401 (re-exports)
    MAX_LATENESS,
    MAX_RETRY_DELAY,
    MAX_TIME_TO_RUN,
    MIN_LATENESS,
    MIN_TIME_TO_RUN,
    NAME_PATTERN,
    QUEUE_PATTERN,
    JobType,
    JobTypeClass,
    Registry,
    register,
    registry,
    show_duration,
    validate_job_type_class,
)
