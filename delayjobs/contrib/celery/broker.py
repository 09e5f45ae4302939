"""The Celery executor's broker: finding the app, checking its broker at start, and the
back-off after a publish it did not take.

Nothing here imports Celery at module level (only ``prepare`` does, once the Celery
executor is chosen).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

from delayjobs.engine.execution import describe

if TYPE_CHECKING:
    from celery import Celery


class BrokerUnavailable(Exception):
    """The Celery broker did not take a job's task: a fault of the infrastructure, not of
    the job, so the job goes back unspent (``transitions.give_back``)."""


#: At start, the broker is asked this many times, BROKER_CHECK_INTERVAL apart, before the
#: consumer gives up: seconds, not the minutes Celery itself would keep retrying.
BROKER_CHECK_RETRIES = 2
BROKER_CHECK_INTERVAL = 0.5
BROKER_CHECK_TIMEOUT = 3
#: After a failed publish, no task is published for this long, doubling with each
#: further failure up to PUBLISH_BACKOFF_MAX; a publish that works resets it.
PUBLISH_BACKOFF_FIRST = 0.5
PUBLISH_BACKOFF_MAX = 30.0


def prepare(app_spec: str | None = None) -> Celery:
    """Load the Celery app jobs are published with and check that its broker answers.

    ``app_spec`` is what ``celery -A`` takes (``proj``, ``proj.celery``,
    ``proj.celery:app``); without it, the app the project loaded (Celery's Django guide
    loads it from the project package's ``__init__``). Raises ImproperlyConfigured, naming
    the fix, when there is no app or its broker does not answer: then the consumer stops
    before it claims a job, instead of spending every job's attempts on a broker that is
    not there.
    """
    app = _find_app(app_spec) if app_spec else _loaded_app()
    # Jobs are published from worker threads, where Celery's current app is thread-local:
    # without a default app they would find Celery's fallback app and its default broker.
    app.set_default()
    app.set_current()
    _check_broker(app)
    return app


def _find_app(app_spec: str) -> Celery:
    from celery import Celery
    from celery.app.utils import find_app

    try:
        app = find_app(app_spec)
    except Exception as exc:  # ImportError, AttributeError, or the module's own error
        raise ImproperlyConfigured(
            f"--celery-app {app_spec!r}: no Celery app found there ({describe(exc)}). Give "
            f"what you give `celery -A`: a module (proj, proj.celery) or module:attribute."
        ) from None
    if not isinstance(app, Celery):
        raise ImproperlyConfigured(
            f"--celery-app {app_spec!r} is {type(app).__name__}, not a Celery app."
        )
    return app


def _loaded_app() -> Celery:
    from celery import _state

    # Private to Celery, but the one way to tell an app the project created from the
    # fallback Celery makes up on first use, which publishes to amqp://localhost.
    app = _state._tls.current_app or _state.default_app  # type: ignore[attr-defined]
    if app is None or (app.main == "default" and not app.set_as_current):
        raise ImproperlyConfigured(
            "The Celery executor found no Celery app in this process, so every job would be "
            "published to Celery's default broker. Pass --celery-app with what you give "
            "`celery -A` (e.g. --celery-app proj), or load the app when Django starts, as "
            "Celery's Django guide does: `from .celery import app as celery_app` in your "
            "project package's __init__.py."
        )
    return app


def _check_broker(app: Celery) -> None:
    connection = app.connection_for_write()
    try:
        connection.ensure_connection(
            max_retries=BROKER_CHECK_RETRIES,
            # kombu's stubs say int; kombu takes any number of seconds.
            interval_start=BROKER_CHECK_INTERVAL,  # type: ignore[arg-type]
            interval_step=BROKER_CHECK_INTERVAL,  # type: ignore[arg-type]
            timeout=BROKER_CHECK_TIMEOUT,
        )
    except Exception as exc:  # kombu's errors vary by transport; all mean "no broker"
        raise ImproperlyConfigured(
            f"The broker of Celery app {app.main!r} at {connection.as_uri()} does not answer "
            f"({describe(exc)}). Start it, or set the app's broker_url (CELERY_BROKER_URL "
            f"with Celery's Django setup) to one that runs."
        ) from None
    finally:
        connection.release()


class PublishBackoff:
    """How long to leave the broker alone after failed publishes: PUBLISH_BACKOFF_FIRST,
    doubling with each failure in a row up to PUBLISH_BACKOFF_MAX. Thread-safe: the
    worker threads publish, the main loop asks before it claims."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._delay = 0.0
        self._until = 0.0

    def failed(self) -> float:
        """Note a failed publish; seconds until the next may be tried."""
        with self._lock:
            now = time.monotonic()
            if now >= self._until:  # one step per streak of failures, not per job
                self._delay = min(max(self._delay * 2, PUBLISH_BACKOFF_FIRST), PUBLISH_BACKOFF_MAX)
                self._until = now + self._delay
            return self._until - now

    def succeeded(self) -> bool:
        """Note a publish that worked; whether that ends a streak of failures."""
        with self._lock:
            ended = self._delay > 0
            self._delay = 0.0
            self._until = 0.0
            return ended

    def remaining(self) -> float:
        """Seconds to wait before publishing again (0: go ahead)."""
        with self._lock:
            return max(self._until - time.monotonic(), 0.0)
