"""The verbs a project calls: schedule, schedule_many, cancel, reschedule, retry (``verbs``);
pause and resume (``pauses``); the figures for dashboards (``stats``).

Layer 4: imports layers 0-3 (foundation, spec, transitions, index). Validation lives in
``delayjobs.spec``. This ``__init__`` re-exports the verbs, whose documented paths are here.
"""

from delayjobs.api.verbs import cancel, reschedule, retry, schedule, schedule_many

# transitional: callers move to delayjobs.spec at integration
from delayjobs.spec.jobtypes import MAX_LATENESS, MIN_LATENESS
from delayjobs.spec.payload import ESCAPED_NUL, nesting_depth, normalize_payload, storable_json
from delayjobs.spec.validation import (
    KEY_MAX_LENGTH,
    MAX_ATTEMPTS_LIMIT,
    OBJECT_ID_MAX_LENGTH,
    SPEC_FIELDS,
    JobSpec,
    build_spec,
    resolve_run_at,
)

__all__ = [
    "ESCAPED_NUL",
    "KEY_MAX_LENGTH",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_LATENESS",
    "MIN_LATENESS",
    "OBJECT_ID_MAX_LENGTH",
    "SPEC_FIELDS",
    "JobSpec",
    "build_spec",
    "cancel",
    "nesting_depth",
    "normalize_payload",
    "reschedule",
    "resolve_run_at",
    "retry",
    "schedule",
    "schedule_many",
    "storable_json",
]
