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

Start-up cost: ``import opentelemetry.trace`` measured 7-12 ms after Django's set-up
(``python -X importtime``: 30-50 ms in a bare interpreter, most of it modules Django has
already loaded; it reads installed distributions' entry points to pick its context
implementation). A consumer must start its first job within 100 ms of Django's set-up, so
nothing here imports OpenTelemetry when Django sets up: whether the API is installed is
asked once with ``importlib.util.find_spec`` (a directory lookup, well under a
millisecond), and the import happens at the first use, which for a consumer is its first
job; the consumer starts that import in a thread of its own just before the first claim,
whose round trips (network waits, the GIL released) it overlaps. That is the cheapest
correct choice: importing lazily inside the first job would add the whole import to its
start, and tracing in a thread after the first claim would leave the first jobs
untraced. Every later call finds the tracer cached.

Per-job cost with the API and no SDK (``recording_possible`` is false): no span is made
for an attempt unless the job stores a context (then its remote span context is made
current around the body, for instrumented clients to pass on); a ``send`` span is the
no-op tracer's (the current span itself), made current only if it records. Attributes,
links and hex ids are built only for recording spans.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from delayjobs.conf import settings

logger = logging.getLogger("delayjobs.tracing")

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from delayjobs.models import DelayedJob

#: messaging.system: the conventions' value for a system they do not list is its name.
SYSTEM = "delayjobs"
INSTRUMENTATION_NAME = "delayjobs"

#: The attributes of delayjobs' own namespace its spans carry (docs/reference/tracing.md):
#: names, not import paths.
OWN_ATTRIBUTES = (
    "delayjobs.job_type",
    "delayjobs.attempt",
    "delayjobs.lateness_ms",
    "delayjobs.limit_wait_ms",
    "delayjobs.consumer",
    "delayjobs.schedule.name",
    "delayjobs.outcome",
    "delayjobs.reaped",
    "delayjobs.planned",
    "delayjobs.ticks",
    "delayjobs.loaded",
)

#: The outcomes of an attempt, the values of ``delayjobs.outcome``.
OUTCOMES = ("succeeded", "retrying", "failed", "skipped", "expired", "timed_out")

_lock = threading.Lock()
#: None: not decided yet; False: off (setting, or the API not installed); else the API.
_api: Any = None


class _Api:
    """The OpenTelemetry names this module uses, imported once."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import (
            Link,
            NonRecordingSpan,
            ProxyTracerProvider,
            SpanContext,
            SpanKind,
            Status,
            StatusCode,
            TraceFlags,
            TraceState,
        )
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )

        from delayjobs.core.version import __version__

        self.context = context
        self.trace = trace
        self.Link = Link
        self.NonRecordingSpan = NonRecordingSpan
        self.ProxyTracerProvider = ProxyTracerProvider
        self.SpanContext = SpanContext
        self.TraceFlags = TraceFlags
        self.TraceState = TraceState
        self.SpanKind = SpanKind
        self.error = Status(StatusCode.ERROR)
        self.propagator = TraceContextTextMapPropagator()
        self.tracer = trace.get_tracer(INSTRUMENTATION_NAME, __version__)
        self._provider_set = False

    def recording_possible(self) -> bool:
        """Whether a tracer provider is set (an SDK): without one, no span ever records,
        and no span, link or attribute need be built. Once set, the global provider
        cannot be replaced, so a yes is kept."""
        if not self._provider_set:
            provider = self.trace.get_tracer_provider()
            self._provider_set = not isinstance(provider, self.ProxyTracerProvider)
        return self._provider_set


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
            _api = _import() if settings.TRACING and installed() else False
        return _api


def _import() -> Any:
    try:
        return _Api()
    except Exception:  # a broken install must not fail jobs: no tracing, said once
        logger.exception("OpenTelemetry could not be imported: delayjobs traces nothing.")
        return False


def enabled() -> bool:
    """Whether spans are made (the setting, and the API installed); imports it if so."""
    return _load() is not False


def decided() -> bool:
    """Whether tracing is decided (and the API imported, if it is on). While not, a
    consumer runs ``decide`` in a thread of its own before its first claim, so that its
    first job does not pay for the import."""
    return _api is not None


def decide() -> None:
    """Decide now whether to trace, importing the API if so."""
    _load()


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


def _span_context_from(api: Any, carrier: Mapping[str, Any] | None) -> Any:
    """The remote span context a stored (or received) carrier holds, or None.

    A ``traceparent`` of version 00, as delayjobs stores them, is read here directly: the
    propagator's regular expression and getters cost more than the rest of an attempt's
    span. Anything else (another version, odd spacing) goes through the propagator.
    """
    if not carrier or not isinstance(carrier, Mapping):  # a row edited by hand: no parent
        return None
    traceparent = carrier.get("traceparent")
    if not isinstance(traceparent, str):
        return None
    parts = traceparent.split("-")
    if (
        len(parts) == 4
        and parts[0] == "00"
        and len(parts[1]) == 32
        and len(parts[2]) == 16
        and len(parts[3]) == 2
    ):
        try:
            trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
            flags = int(parts[3], 16)
        except ValueError:
            return None
        if not trace_id or not span_id:
            return None
        state = carrier.get("tracestate")
        return api.SpanContext(
            trace_id,
            span_id,
            is_remote=True,
            trace_flags=api.TraceFlags(flags),
            trace_state=api.TraceState.from_header([state]) if isinstance(state, str) else None,
        )
    strings = {k: v for k, v in carrier.items() if isinstance(v, str)}
    span_context = api.trace.get_current_span(api.propagator.extract(strings)).get_span_context()
    return span_context if span_context.is_valid else None


def _context_from(api: Any, carrier: Mapping[str, Any] | None) -> Any:
    """The OpenTelemetry context whose span is the carrier's remote one, or None."""
    span_context = _span_context_from(api, carrier)
    if span_context is None:
        return None
    return api.trace.set_span_in_context(api.NonRecordingSpan(span_context))


def trace_id_of(carrier: Mapping[str, Any] | None) -> str | None:
    """The trace id (32 hex digits) of a stored context, or None."""
    traceparent = (carrier or {}).get("traceparent")
    if not isinstance(traceparent, str):
        return None
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


# Producer spans -------------------------------------------------------------------------


class Sent:
    """A PRODUCER span ``send {queue}`` around sending jobs, and what it gives them: the
    context to store with each. Made by ``producer``."""

    def __init__(self, api: Any, span: Span | None) -> None:
        self._api = api
        self._span = span
        self._token: object = None
        #: The W3C context to store in ``DelayedJob.trace_context`` (None: nothing to join).
        self.carrier = None if span is None else _carrier_of(api, span)
        #: Its trace id, for ``DelayedJob.trace_id``: the logs' and the trace's are one.
        self.trace_id = trace_id_of(self.carrier)

    def __enter__(self) -> Sent:
        span = self._span
        # A span that does not record is the current one already (the API's no-op tracer
        # returns the current span), or one a sampler dropped: nothing to make current.
        if span is not None and span.is_recording():
            self._token = self._api.context.attach(self._api.trace.set_span_in_context(span))
        return self

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        span = self._span
        if self._token is not None:
            self._api.context.detach(self._token)
            self._token = None
        if span is not None and span.is_recording():
            if error is not None:
                span.record_exception(error)
                span.set_status(self._api.error)
            span.end()

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


def producer(
    action: str, queue: str | None, job_type: str | None, *, count: int | None = None
) -> Sent:
    """A PRODUCER span ``send {queue}`` around sending jobs (``action``: schedule,
    reschedule, retry), for a ``with`` block. ``queue``/``job_type`` None: the batch's are
    not all the same. ``count``: a batch's size (``messaging.batch.message_count``)."""
    api = _load()
    if api is False:
        return Sent(None, None)
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
    return Sent(api, span)


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
        self._tokens: list[object] = []

    def current(self) -> Processing:
        """``with span.current():`` the span is the current one in the block: the body's
        own spans are its children (a plain class, not a generator: cheaper per job)."""
        return self

    def __enter__(self) -> None:
        api = self._api
        self._tokens.append(api.context.attach(api.trace.set_span_in_context(self.span)))

    def __exit__(self, *exc_info: object) -> None:
        self._api.context.detach(self._tokens.pop())

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
    is a root span. ``limit_wait_ms``: how long a fleet-wide limit held the job."""
    api = _load()
    if api is False:
        return None
    remote = None
    if schedule is None:
        remote = _span_context_from(api, carrier if carrier is not None else job.trace_context)
    if not api.recording_possible():
        # No SDK: the API's no-op tracer would return the parent itself. Keep the stored
        # context current while the body runs (an instrumented client still passes it on),
        # and build nothing else.
        return None if remote is None else Processing(api, api.NonRecordingSpan(remote))
    links = None
    if remote is not None:
        parent = api.trace.set_span_in_context(api.NonRecordingSpan(remote))
        links = [api.Link(remote)]
    elif schedule is not None:
        parent = api.context.Context()  # a root, whatever is current
    else:
        parent = None  # scheduled untraced: the current span's child, if any
    span = api.tracer.start_span(
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
            span.set_attribute("delayjobs.schedule.name", schedule)
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
    if span.span.is_recording():  # else its trace, if any, is the stored one already
        ids = span.ids()
        if ids is not None:
            job.trace_id = ids[0]


def timed_out(job: DelayedJob, error: BaseException) -> None:
    """End the span of ``job``'s attempt as timed out (its body may still run, unheeded)."""
    span: Processing | None = job.__dict__.get(_SPAN_ATTRIBUTE)
    if span is not None:
        span.finish("timed_out", error)


#: The Celery message headers that carry a job's stored context, by W3C field. Names of
#: delayjobs' own: Celery's OpenTelemetry instrumentation writes ``traceparent`` itself
#: (the context of its publish span), which must not replace the job's.
CELERY_HEADERS = {"traceparent": "delayjobs_traceparent", "tracestate": "delayjobs_tracestate"}


def celery_headers(job: DelayedJob) -> dict[str, str]:
    """The headers a Celery task carries the job's trace context in (empty: none)."""
    stored = job.trace_context
    if not stored or not isinstance(stored, dict) or _load() is False:
        return {}
    return {
        header: stored[field]
        for field, header in CELERY_HEADERS.items()
        if isinstance(stored.get(field), str)
    }


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
