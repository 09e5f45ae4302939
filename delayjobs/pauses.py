"""Compatibility path: the code lives in delayjobs.api.pauses (reading: delayjobs.core.paused)."""

from delayjobs.api.pauses import check_target, pause, resume  # noqa: F401 (re-exports)
from delayjobs.core.paused import Paused, paused  # noqa: F401 (re-exports)
