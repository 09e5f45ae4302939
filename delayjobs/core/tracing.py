"""OpenTelemetry spans of scheduling and running jobs, by the messaging semantic conventions.

The one module that knows OpenTelemetry: span names and kinds, attributes, and the W3C
Trace Context (``traceparent``, ``tracestate``) stored with a job so that its execution,
however much later and wherever it runs, joins the trace that scheduled it.

- ``send {queue}`` (PRODUCER): ``schedule()``, ``schedule_many()`` (one span for the
  batch), ``reschedule()``, ``retry()``, and everything built on them (the admin's
  actions, the HTTP API, the Django Tasks backend's ``enqueue``).
- ``process {queue}`` (CONSUMER): one per attempt, child of the stored context and linked
  to it; a recurring schedule's tick has no producer, its span is a root naming the schedule.
- ``delayjobs preload`` and ``delayjobs reap`` (INTERNAL): one per pass, not per job.

Only ``opentelemetry-api`` is used (the ``otel`` extra). delayjobs never configures an
SDK, an exporter or the global tracer provider: until the project does, every span is a
non-recording no-op, and the stored context is the caller's own (an incoming request's),
or nothing. ``DELAYJOBS["TRACING"] = False`` turns it all off.

Start-up cost: ``import opentelemetry.trace`` takes some 15-25 ms (it loads its context
implementation through package entry points, which reads every installed distribution's
metadata). A consumer must start its first job promptly after Django's set-up, so nothing
here imports OpenTelemetry when Django sets up: whether the API is installed is asked once
with ``importlib.util.find_spec`` (a directory lookup, microseconds), and the import
happens at the first use, which for a consumer is its first claimed job; ``warm_up`` lets
the consumer start that import in a thread of its own meanwhile (the first claim waits on
the network, so the import mostly overlaps it). Every later call finds the tracer cached.

Per-job cost with the API and no SDK: one ``start_span`` of the no-op tracer, a context
attach and detach, and no attribute built (they are set only on a recording span).
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from delayjobs.conf import settings

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from delayjobs.models import DelayedJob

#: messaging.system: the conventions' value for a system they do not list is its name.
SYSTEM = "delayjobs"
INSTRUMENTATION_NAME = "delayjobs"

#: The outcomes of an attempt, the values of ``delayjobs.outcome``.
OUTCOMES = ("succeeded", "retrying", "failed", "skipped", "expired", "timed_out")

_lock = threading.Lock()
#: None: not decided yet; False: off (setting, or the API not installed); else the API.
_api: Any = None
_tracer: Tracer | None = None


class _Api:
    """The OpenTelemetry names this module uses, imported once."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )

        from delayjobs.core.version import __version__

        self.context = context
        self.trace = trace
        self.Link = Link
        self.SpanKind = SpanKind
        self.error = Status(StatusCode.ERROR)
        self.propagator = TraceContextTextMapPropagator()
        self.tracer = trace.get_tracer(INSTRUMENTATION_NAME, __version__)


def installed() -> bool:
    """Whether opentelemetry-api can be imported (asked without importing it)."""
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):  # a namespace package without the trace module
        return False


def _load() -> Any:
    """The API, or False when tracing is off; imported at the first call only."""
    global _api
    api = _api
    if api is not None:
        return api
    with _lock:
        if _api is None:
            _api = _Api() if settings.TRACING and installed() else False
        return _api


def enabled() -> bool:
    """Whether spans are made (the setting, and the API installed); imports it if so."""
    return _load() is not False


def warm_up() -> None:
    """Import the API now, in a thread of its own, so the first job does not pay for it.

    Harmless to call more than once, or when tracing is off.
    """
    if _api is None:
        threading.Thread(target=_load, name="delayjobs-tracing-import", daemon=True).start()


def reset() -> None:
    """Forget what was decided (for tests that change ``DELAYJOBS["TRACING"]``)."""
    global _api
    with _lock:
        _api = None


# The stored context ---------------------------------------------------------------------


def _carrier_of(api: Any, span: Span) -> dict[str, str] | None:
    """``span``'s W3C Trace Context as a dict, or None if it has none worth storing."""
    if not span.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    api.propagator.inject(carrier, api.trace.set_span_in_context(span))
    return carrier or None


def _context_from(api: Any, carrier: Mapping[str, Any] | None) -> Any:
    """The OpenTelemetry context a stored (or received) carrier holds, or None."""
    if not carrier:
        return None
    context = api.propagator.extract({k: v for k, v in carrier.items() if isinstance(v, str)})
    span_context = api.trace.get_current_span(context).get_span_context()
    return context if span_context.is_valid else None


def trace_id_of(carrier: Mapping[str, Any] | None) -> str | None:
    """The trace id (32 hex digits) of a stored context, or None."""
    traceparent = (carrier or {}).get("traceparent")
    if not isinstance(traceparent, str):
        return None
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


# Producer spans -------------------------------------------------------------------------


class Sent:
    """What a producer span gives the jobs it sends: the context to store with them."""

    def __init__(self, api: Any, span: Span | None) -> None:
        self._span = span
        #: The W3C context to store in ``DelayedJob.trace_context`` (None: nothing to join).
        self.carrier = None if span is None else _carrier_of(api, span)
        #: Its trace id, for ``DelayedJob.trace_id``: the logs' and the trace's are one.
        self.trace_id = trace_id_of(self.carrier)

    def mark(self, job: DelayedJob) -> None:
        """Give ``job`` (new or about to be moved) this span's context."""
        if self.carrier is not None:
            job.trace_context = self.carrier
            if self.trace_id:
                job.trace_id = self.trace_id

    def changes(self) -> dict[str, Any]:
        """The fields to write on a job this span moves (reschedule, retry)."""
        if self.carrier is None:
            return {}
        return {"trace_context": self.carrier, "trace_id": self.trace_id}

    def sent(self, jobs: list[DelayedJob]) -> None:
        """Name the jobs sent, once their ids are known."""
        span = self._span
        if span is None or not span.is_recording() or not jobs:
            return
        if len(jobs) == 1:
            span.set_attribute("messaging.message.id", str(jobs[0].pk))


_NOT_SENT = Sent(None, None)


@contextlib.contextmanager
def producer(
    action: str, queue: str | None, job_type: str | None, *, count: int | None = None
) -> Iterator[Sent]:
    """A PRODUCER span ``send {queue}`` around sending jobs (``action``: schedule,
    reschedule, retry). ``queue``/``job_type`` None: the batch's are not all the same.
    ``count``: a batch's size (``messaging.batch.message_count``)."""
    api = _load()
    if api is False:
        yield _NOT_SENT
        return
    span = api.tracer.start_span(f"send {queue}" if queue else "send", kind=api.SpanKind.PRODUCER)
    if span.is_recording():
        span.set_attributes(
            {
                "messaging.system": SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": action,
            }
        )
        if queue:
            span.set_attribute("messaging.destination.name", queue)
        if job_type:
            span.set_attribute("delayjobs.job_type", job_type)
        if count is not None:
            span.set_attribute("messaging.batch.message_count", count)
    with api.trace.use_span(span, end_on_exit=True, record_exception=True):
        yield Sent(api, span)


@contextlib.contextmanager
def continued(headers: Mapping[str, str]) -> Iterator[None]:
    """Continue the trace of an incoming request's ``traceparent`` (``headers``: Django's
    ``request.headers``), unless a span is already current (the project's own HTTP
    instrumentation made the request's span: that one is the parent)."""
    api = _load()
    if api is False or "traceparent" not in headers:
        yield
        return
    if api.trace.get_current_span().get_span_context().is_valid:
        yield
        return
    carrier = {"traceparent": headers["traceparent"]}
    if "tracestate" in headers:
        carrier["tracestate"] = headers["tracestate"]
    context = _context_from(api, carrier)
    if context is None:  # malformed: the W3C rules say to start a new trace
        yield
        return
    token = api.context.attach(context)
    try:
        yield
    finally:
        api.context.detach(token)


# Consumer spans -------------------------------------------------------------------------


class Processing:
    """The CONSUMER span of one attempt: made when it opens, current while its body runs
    (``current``), ended with its outcome (``finish``, once: a time-out ends it from
    another thread while the body runs on)."""

    def __init__(self, api: Any, span: Span) -> None:
        self._api = api
        self.span = span
        self.ended = False

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """The span is the current one in here: the body's own spans are its children."""
        token = self._api.context.attach(self._api.trace.set_span_in_context(self.span))
        try:
            yield
        finally:
            self._api.context.detach(token)

    def finish(self, outcome: str | None, error: BaseException | None = None) -> None:
        """End the span with the attempt's outcome (one of ``OUTCOMES``; None: it has none
        here) and the exception it raised, if any. Only the first call counts."""
        if self.ended:
            return
        self.ended = True
        span = self.span
        if span.is_recording():
            if outcome is not None:
                span.set_attribute("delayjobs.outcome", outcome)
            if error is not None:
                # error.type: the conventions' attribute of a failed operation.
                kind = type(error)
                span.set_attribute("error.type", f"{kind.__module__}.{kind.__qualname__}")
                span.record_exception(error)
                span.set_status(self._api.error)
        span.end()

    def ids(self) -> tuple[str, str] | None:
        span_context = self.span.get_span_context()
        if not span_context.is_valid:
            return None
        return f"{span_context.trace_id:032x}", f"{span_context.span_id:016x}"


def processing(
    job: DelayedJob,
    consumer: str,
    *,
    lateness_ms: float,
    schedule: str | None = None,
    carrier: Mapping[str, Any] | None = None,
    limit_wait_ms: float | None = None,
) -> Processing | None:
    """Start the CONSUMER span ``process {queue}`` of one attempt of ``job``, or None when
    tracing is off. Its parent is the context stored with the job (or ``carrier``, the
    one a Celery task's headers carried); a tick of the recurring schedule ``schedule``
    is a root span. ``limit_wait_ms``: how long the job waited for a concurrency limit."""
    api = _load()
    if api is False:
        return None
    tracer = api.tracer
    links = None
    parent = None
    if schedule is None:
        parent = _context_from(api, carrier if carrier is not None else job.trace_context)
        if parent is not None:
            links = [api.Link(api.trace.get_current_span(parent).get_span_context())]
    else:
        parent = api.context.Context()  # a root, whatever is current
    span = tracer.start_span(
        f"process {job.queue}", context=parent, kind=api.SpanKind.CONSUMER, links=links
    )
    if span.is_recording():
        span.set_attributes(
            {
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.pk),
                "delayjobs.job_type": job.job_type,
                "delayjobs.attempt": job.attempts,
                "delayjobs.lateness_ms": lateness_ms,
                "delayjobs.consumer": consumer,
            }
        )
        if schedule is not None:
            span.set_attribute("delayjobs.schedule", schedule)
        if limit_wait_ms is not None:
            span.set_attribute("delayjobs.limit_wait_ms", limit_wait_ms)
    return Processing(api, span)


#: Where a job being run keeps its attempt's span: its log lines (written by other threads,
#: after the span ended) and a time-out (decided by the main loop) find it there.
_SPAN_ATTRIBUTE = "_delayjobs_span"


def attach(job: DelayedJob, span: Processing) -> None:
    """Keep ``span`` with ``job`` for this attempt. Its log lines then name the span's trace
    (in memory only: the row keeps the trace of what scheduled it, the same one unless
    the job is a tick or was scheduled untraced)."""
    job.__dict__[_SPAN_ATTRIBUTE] = span
    ids = span.ids()
    if ids is not None:
        job.trace_id = ids[0]


def timed_out(job: DelayedJob, error: BaseException) -> None:
    """End the span of ``job``'s attempt as timed out (its body may still run, unheeded)."""
    span: Processing | None = job.__dict__.get(_SPAN_ATTRIBUTE)
    if span is not None:
        span.finish("timed_out", error)


def celery_headers(job: DelayedJob) -> dict[str, str]:
    """The headers a Celery task carries the job's trace context in (empty: none)."""
    if not job.trace_context or _load() is False:
        return {}
    return {k: v for k, v in job.trace_context.items() if k in ("traceparent", "tracestate")}


# Internal spans -------------------------------------------------------------------------


class Pass:
    """An internal span's handle: counts to set on it, if it records."""

    def __init__(self, span: Span | None) -> None:
        self._span = span

    def count(self, **counts: int) -> None:
        span = self._span
        if span is not None and span.is_recording():
            for name, value in counts.items():
                span.set_attribute(f"delayjobs.{name}", value)


@contextlib.contextmanager
def internal(name: str, *, root: bool = True) -> Iterator[Pass]:
    """An INTERNAL span ``name`` around one pass of the pre-loader or the reaper (never one
    per job): a root of its own trace, or (``root=False``) a child of the current span."""
    api = _load()
    if api is False:
        yield Pass(None)
        return
    span = api.tracer.start_span(name, context=api.context.Context() if root else None)
    if span.is_recording():
        span.set_attribute("messaging.system", SYSTEM)
    with api.trace.use_span(span, end_on_exit=True, record_exception=True):
        yield Pass(span)


# Logs -----------------------------------------------------------------------------------


def log_ids(job: DelayedJob) -> tuple[str, str | None]:
    """The trace id and span id a log line about ``job`` carries: the current span's, else
    those of the job's attempt, else the job's stored trace id and no span."""
    ids = current_ids()
    if ids is None:
        span: Processing | None = job.__dict__.get(_SPAN_ATTRIBUTE)
        ids = None if span is None else span.ids()
    if ids is None:
        return job.trace_id, None
    return ids


def current_ids() -> tuple[str, str] | None:
    """The trace id and span id of the current span, as hex, or None (no valid span, or
    tracing off or not loaded yet: a log line never imports OpenTelemetry)."""
    api = _api
    if not api:
        return None
    span_context = api.trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    return f"{span_context.trace_id:032x}", f"{span_context.span_id:016x}"
