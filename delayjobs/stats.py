"""Compatibility path: the code lives in delayjobs.api.stats."""

from typing import TYPE_CHECKING, Any

from delayjobs.api import stats as _home

if TYPE_CHECKING:
    from delayjobs.api.stats import *  # noqa: F403 (what the path offers, for type checkers)


def __getattr__(name: str) -> Any:
    # Looked up at each use rather than copied at import: a test that patches
    # delayjobs.api.stats (collect, LATENESS_SAMPLE) is seen by callers of this path too.
    return getattr(_home, name)
