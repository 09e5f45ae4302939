"""Compatibility path: the code lives in delayjobs.engine.consumer."""

from delayjobs.engine.consumer import PREFETCH, PREFETCH_BUDGET, Consumer, default_worker_id
from delayjobs.engine.timeouts import EXIT_STUCK

__all__ = ["EXIT_STUCK", "PREFETCH", "PREFETCH_BUDGET", "Consumer", "default_worker_id"]
