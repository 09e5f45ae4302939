"""A name module: ``UnstorableResult`` is defined here because its class path is data.

``delayjobs.execution.UnstorableResult`` is written into task results
(``TaskError.exception_class_path``, docs/howto/django-tasks.md) and old rows hold it, so
the class never moves. The rest of what lived here is in ``delayjobs.engine.execution``;
its names are still served from this path for a while (compat, see ``__getattr__``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from delayjobs.engine.execution import (
        LOCKED_RETRY,
        Running,
        describe,
        due_ns,
        log_outcome,
        max_lateness_of,
        retry_at_after,
        run_claimed,
        signal_outcome,
        signal_outcome_apart,
        storable,
        time_to_run_of,
        wait_until,
    )


class UnstorableResult(TypeError):
    """``execute`` returned a value a JSON column cannot hold: the job fails, unretried."""


__all__ = [
    "LOCKED_RETRY",
    "Running",
    "UnstorableResult",
    "describe",
    "due_ns",
    "log_outcome",
    "max_lateness_of",
    "retry_at_after",
    "run_claimed",
    "signal_outcome",
    "signal_outcome_apart",
    "storable",
    "time_to_run_of",
    "wait_until",
]
#: Names that moved to ``delayjobs.engine.execution`` and are still served here.
_MOVED = frozenset(__all__) - {"UnstorableResult"}


def __getattr__(name: str) -> Any:
    # Compatibility path, resolved on first use: the engine module imports this one for
    # UnstorableResult, so importing it back at module level would be a cycle.
    if name in _MOVED:
        from delayjobs.engine import execution

        return getattr(execution, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
