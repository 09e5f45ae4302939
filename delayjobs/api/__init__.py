"""The verbs a project calls: schedule, schedule_many, cancel, reschedule, retry (``verbs``);
the figures for dashboards (``stats``). Pausing is ``delayjobs.pauses``.

Part of the public API's layer: imports the index, the state machine, the definitions and
the foundation. Validation lives in ``delayjobs.validation``. This ``__init__`` re-exports
the verbs, whose documented paths are here.
"""

from delayjobs.api.verbs import cancel, reschedule, retry, schedule, schedule_many

__all__ = ["cancel", "reschedule", "retry", "schedule", "schedule_many"]
