"""Compatibility path: the code lives in delayjobs.engine.preloader (and index.window)."""

from delayjobs.engine.preloader import PassResult, preload, run_forever
from delayjobs.index.window import load_window

__all__ = ["PassResult", "load_window", "preload", "run_forever"]
