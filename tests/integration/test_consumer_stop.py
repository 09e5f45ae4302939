"""A graceful stop keeps what the consumer's log says of it.

"SIGTERM: finishing N running job(s), claiming no more" is what an operator, a deploy
script and the e2e tests wait for before they go on. A signal handler runs between two
steps of the main loop, perhaps halfway through a turn that is about to pop and claim;
so the line must only be written once that turn is over. Here the stop request arrives
at the start of a turn (the first thing a turn does is look at the pauses), as a
SIGTERM would on a busy host, and a job scheduled once the line is out must stay
scheduled.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import redis

import delayjobs
from delayjobs.engine.consumer import Consumer
from delayjobs.models import DelayedJob, JobStatus
from tests.delay_jobs import Scripted
from tests.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

STOP_LINE = "SIGTERM: finishing"


class OnRecord(logging.Handler):
    """Calls ``react`` in the logging thread when a record contains ``text``."""

    def __init__(self, text: str, react: Callable[[], None]) -> None:
        super().__init__()
        self.text = text
        self.react = react
        self.seen = 0

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen += 1
            self.react()


@contextmanager
def on_log_line(text: str, react: Callable[[], None]) -> Iterator[OnRecord]:
    handler = OnRecord(text, react)
    logger = logging.getLogger("delayjobs.consumer")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def test_claiming_no_more_is_logged_only_once_the_interrupted_turn_is_over(
    redis_client: redis.Redis,
) -> None:
    due = delayjobs.schedule(Scripted)  # due now, handed to Redis
    consumer = Consumer(queues=[Scripted.queue], preload=False, concurrency=2)
    refresh = consumer.pauses.refresh

    def refresh_after_a_sigterm() -> None:
        if not consumer._stopping:
            consumer.request_stop(signal.SIGTERM)
        refresh()

    consumer.pauses.refresh = refresh_after_a_sigterm  # type: ignore[method-assign]
    late: list[DelayedJob] = []
    seen_due: list[str] = []

    def as_the_operator_would() -> None:
        seen_due.append(DelayedJob.objects.get(pk=due.pk).status)
        late.append(delayjobs.schedule(Scripted))  # due now, handed to Redis, published

    with on_log_line(STOP_LINE, as_the_operator_would) as line:
        assert consumer.run() == 0

    assert line.seen == 1
    # The turn the stop interrupted went on and claimed the job due before it...
    assert seen_due[0] != JobStatus.SCHEDULED
    due.refresh_from_db()
    assert (due.status, due.attempts) == (JobStatus.SUCCEEDED, 1)
    assert Execution.objects.filter(job_id=due.pk).count() == 1
    # ... and nothing scheduled after the line was claimed.
    (after,) = late
    after.refresh_from_db()
    assert (after.status, after.attempts) == (JobStatus.SCHEDULED, 0)
    assert not Execution.objects.filter(job_id=after.pk).exists()
