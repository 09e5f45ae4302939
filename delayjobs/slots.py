"""Compatibility path: the code lives in delayjobs.engine.slots."""

from delayjobs.engine.slots import Budget, Candidate, Slots

__all__ = ["Budget", "Candidate", "Slots"]
