"""Jobs bound to model fields: ``bind()`` (``declare``, whose docstring gives the rules),
``Binding`` and the declared bindings (``binding``), the model signals' receivers and the
system check (``receivers``).

Part of the public API's layer: imports ``delayjobs.api`` (the verbs schedule and cancel)
and the layers below it.
"""

from delayjobs.bindings.binding import Binding, Offset, State, bindings_for
from delayjobs.bindings.declare import bind
from delayjobs.bindings.receivers import BEFORE_ATTR, SIGNALS, check_bindings

__all__ = [
    "BEFORE_ATTR",
    "SIGNALS",
    "Binding",
    "Offset",
    "State",
    "bind",
    "bindings_for",
    "check_bindings",
]
