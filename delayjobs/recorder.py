"""Compatibility path: the code lives in delayjobs.engine.recorder."""

from delayjobs.engine.recorder import Recorder

__all__ = ["Recorder"]
