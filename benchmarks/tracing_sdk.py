"""The OpenTelemetry SDK of ``DELAYJOBS_BENCH_TRACING=sdk`` (benchmarks/settings.py): a
tracer provider with a batch span processor, as a project sets one up, whose exporter
drops the spans. What is measured is tracing's cost in the process (spans recorded,
attributes set, queued, batched and handed over), not a collector's network."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class DroppingExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def set_up_sdk() -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "delayjobs-bench"}))
    provider.add_span_processor(BatchSpanProcessor(DroppingExporter()))
    trace.set_tracer_provider(provider)
