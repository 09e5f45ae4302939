"""An OpenTelemetry SDK for the tests, set up as a project would (delayjobs never does):
in memory in the test process, or, in a subprocess (a consumer, a Celery worker), spans
written as JSON lines to the file ``DELAYJOBS_TEST_TRACES`` names (tests/settings.py).

The SDK sets the global tracer provider once per process, so the in-memory one is made
once and shared by every test of the process; each test clears it first.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_lock = threading.Lock()
_in_memory: InMemorySpanExporter | None = None


def _provider(service: str) -> TracerProvider:
    return TracerProvider(resource=Resource.create({"service.name": service}))


def in_memory_exporter() -> InMemorySpanExporter:
    """The process's in-memory exporter, installed with the global provider at first call."""
    global _in_memory
    with _lock:
        if _in_memory is None:
            exporter = InMemorySpanExporter()
            provider = _provider("delayjobs-tests")
            # Simple (not batch): each span is there as soon as it ends, for the test to read.
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            _in_memory = exporter
        return _in_memory


class JsonLinesExporter(SpanExporter):
    """Each span as one line of the SDK's own JSON (``ReadableSpan.to_json``)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(json.loads(span.to_json())) + "\n" for span in spans)
        with self._lock, self._path.open("a") as file:
            file.write(lines)
        return SpanExportResult.SUCCESS


def export_to_file(path: str, service: str) -> None:
    """Install a provider whose spans are appended to ``path`` as they end."""
    provider = _provider(service)
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(Path(path))))
    trace.set_tracer_provider(provider)


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The spans a subprocess wrote to ``path`` (none if it wrote nothing yet)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
