"""What the consumer's mixins (``DatabaseMode``, ``TimeOuts``) read and call on it.

Declared for the type checker only: ``Consumer`` provides all of it, and at run time this
class is empty. It names, in one place, how far the mixins reach into the consumer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threading
    from datetime import datetime, timedelta

    from delayjobs.engine.execution import Running
    from delayjobs.engine.recorder import Recorder
    from delayjobs.engine.slots import Slots
    from delayjobs.models import DelayedJob
    from delayjobs.pauses import Paused
    from delayjobs.redis_store import RedisStore


class ConsumerState:
    if TYPE_CHECKING:
        queues: list[str]
        concurrency: int
        burst: bool
        preload: bool
        worker_id: str
        store: RedisStore
        _cond: threading.Condition
        _stop_event: threading.Event
        _redis_back: threading.Event
        _in_flight: dict[int, Running]
        _stuck: set[Running]
        _slots: Slots
        _paused: Paused
        _recorder: Recorder
        _leases: dict[str, timedelta]
        _lanes: list[str]
        _stopping: bool
        _next_reap: float
        _return_failed: bool

        def wake(self) -> None: ...
        def _claimable(self) -> int: ...
        def _open_types(self) -> list[str]: ...
        def _start(self, jobs: list[DelayedJob]) -> None: ...
        def _idle(self) -> bool: ...
        def _claim_time(self) -> datetime: ...
