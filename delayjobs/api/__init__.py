"""The verbs a project calls: schedule, schedule_many, cancel, reschedule, retry (``verbs``);
pause and resume (``pauses``); the figures for dashboards (``stats``).

Layer 4: imports layers 0-3 (foundation, spec, transitions, index). Validation lives in
``delayjobs.spec``. This ``__init__`` re-exports the verbs, whose documented paths are here.
"""

from delayjobs.api.verbs import cancel, reschedule, retry, schedule, schedule_many

__all__ = ["cancel", "reschedule", "retry", "schedule", "schedule_many"]
