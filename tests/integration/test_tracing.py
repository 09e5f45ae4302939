"""OpenTelemetry tracing: every job in the trace of what scheduled it, by the messaging
semantic conventions, against real Redis and a real database.

In this process, spans go to an in-memory exporter (tests/support/tracing.py: the SDK a
project would set up; delayjobs sets up none). Consumers and Celery workers started as
processes write theirs to a file, read back here.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from asgiref.sync import SyncToAsync
from django.db import connections
from django.test import override_settings
from django.utils import timezone
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import delayjobs
from delayjobs.checks import check_settings
from delayjobs.contrib.celery.worker import run_dispatched, trace_headers
from delayjobs.core import tracing
from delayjobs.core.logfields import job_fields
from delayjobs.engine import preloader
from delayjobs.engine.consumer import Consumer
from delayjobs.engine.execution import run_claimed
from delayjobs.models import DelayedJob, JobStatus, Schedule
from delayjobs.recurring.ticks import materialise_schedules
from delayjobs.transitions import claim
from tests.conftest import REPO_ROOT, ConsumerFactory, ConsumerProcess, subprocess_env
from tests.consumers import wait_final
from tests.support.tracing import in_memory_exporter, read_spans
from tests.utils import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

TRACED = "tests.traced"
ASYNC_TRACED = "tests.async_traced"


@pytest.fixture
def spans(redis_client: redis.Redis) -> Iterator[InMemorySpanExporter]:
    """The in-memory exporter, empty; delayjobs decides afresh whether it traces."""
    exporter = in_memory_exporter()
    exporter.clear()
    tracing.reset()
    yield exporter
    exporter.clear()
    tracing.reset()


def one(spans: InMemorySpanExporter, name: str, **attributes: Any) -> ReadableSpan:
    """The one finished span called ``name`` with these attributes."""
    found = [
        span
        for span in spans.get_finished_spans()
        if span.name == name
        and all((span.attributes or {}).get(k) == v for k, v in attributes.items())
    ]
    names = [span.name for span in spans.get_finished_spans()]
    assert len(found) == 1, f"{len(found)} span(s) {name} {attributes}; all: {names}"
    return found[0]


def drain(queue: str = "default") -> None:
    """``run_delay_consumer --burst`` in this process: it runs what is due and returns."""
    Consumer(queues=[queue], burst=True, preload=False, concurrency=2, worker_id="tracer").run()


def traceparent_of(span: ReadableSpan) -> str:
    context = span.context
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def assert_processes(span: ReadableSpan, job: DelayedJob, producer: ReadableSpan) -> None:
    """``span`` is an attempt of ``job``, in ``producer``'s trace, its child and linked."""
    assert span.kind == SpanKind.CONSUMER
    assert span.context.trace_id == producer.context.trace_id
    assert span.parent is not None and span.parent.span_id == producer.context.span_id
    assert [link.context.span_id for link in span.links] == [producer.context.span_id]


# Producer and consumer ---------------------------------------------------------------------


def test_a_job_scheduled_in_a_request_span_runs_in_its_trace(
    spans: InMemorySpanExporter,
) -> None:
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("GET /orders", kind=SpanKind.SERVER) as request:
        job = delayjobs.schedule(TRACED, {})

    send = one(spans, "send default")
    assert send.kind == SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert dict(send.attributes or {}) == {
        "messaging.system": "delayjobs",
        "messaging.operation.type": "send",
        "messaging.operation.name": "schedule",
        "messaging.destination.name": "default",
        "messaging.message.id": str(job.pk),
        "delayjobs.job_type": TRACED,
    }
    stored = DelayedJob.objects.get(pk=job.pk)
    trace_hex = f"{send.context.trace_id:032x}"
    assert stored.trace_context == {"traceparent": traceparent_of(send)}
    # One trace id: the row's (what log lines name) is the trace's.
    assert stored.trace_id == trace_hex

    drain()

    process = one(spans, "process default")
    assert_processes(process, job, send)
    attributes = dict(process.attributes or {})
    lateness = attributes.pop("delayjobs.lateness_ms")
    assert isinstance(lateness, float) and lateness >= 0
    assert attributes == {
        "messaging.system": "delayjobs",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": str(job.pk),
        "delayjobs.job_type": TRACED,
        "delayjobs.attempt": 1,
        "delayjobs.consumer": "tracer",
        "delayjobs.outcome": "succeeded",
    }
    assert process.status.status_code == StatusCode.UNSET
    # The body's own span (an instrumented library's, say) is a child of the attempt's.
    inside = one(spans, "tests.inside")
    assert inside.parent is not None and inside.parent.span_id == process.context.span_id


def test_an_async_job_type_runs_in_the_trace_and_its_body_under_the_span(
    spans: InMemorySpanExporter,
) -> None:
    with trace.get_tracer("tests").start_as_current_span("request"):
        job = delayjobs.schedule(ASYNC_TRACED, {})

    drain()
    # The async ORM ran the body's query in asgiref's one shared thread: its connection
    # would outlive the test (and hold the test database open at teardown).
    SyncToAsync.single_thread_executor.submit(connections.close_all).result()

    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED
    process = one(spans, "process default", **{"delayjobs.outcome": "succeeded"})
    assert_processes(process, job, one(spans, "send default"))
    inside = one(spans, "tests.inside")
    assert inside.parent is not None and inside.parent.span_id == process.context.span_id


def test_a_failing_attempt_is_an_error_span_with_its_exception(
    spans: InMemorySpanExporter,
) -> None:
    with trace.get_tracer("tests").start_as_current_span("request"):
        retried = delayjobs.schedule(TRACED, {"fail_attempts": [1]})
        doomed = delayjobs.schedule(TRACED, {"fail_attempts": [1]}, max_attempts=1)

    drain()

    for job, outcome in ((retried, "retrying"), (doomed, "failed")):
        span = one(
            spans,
            "process default",
            **{"messaging.message.id": str(job.pk), "delayjobs.attempt": 1},
        )
        assert span.status.status_code == StatusCode.ERROR
        assert span.attributes is not None and span.attributes["delayjobs.outcome"] == outcome
        assert span.attributes["error.type"] == "tests.delay_jobs.ScriptedFailure"
        [event] = span.events
        assert event.name == "exception"
        assert event.attributes is not None
        assert event.attributes["exception.type"] == "tests.delay_jobs.ScriptedFailure"
        assert f"job {job.pk} on attempt 1" in str(event.attributes["exception.message"])


@pytest.mark.parametrize(
    "stored",
    [
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ["traceparent"],
        {"traceparent": 17},
        {"traceparent": "00-zz-yy-01"},
        {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},
    ],
    ids=["a string", "a list", "not text", "not hex", "zero trace id"],
)
def test_a_stored_context_that_is_not_one_runs_the_job_in_a_trace_of_its_own(
    spans: InMemorySpanExporter, stored: Any
) -> None:
    """A row edited by hand: the job runs all the same, its span a root."""
    job = delayjobs.schedule(TRACED, {})
    DelayedJob.objects.filter(pk=job.pk).update(trace_context=stored)
    spans.clear()

    drain()

    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED
    process = one(spans, "process default")
    assert process.parent is None and list(process.links) == []


def test_schedule_many_is_one_span_whose_context_every_job_stores(
    spans: InMemorySpanExporter,
) -> None:
    jobs = delayjobs.schedule_many(
        [{"job_type": TRACED, "delay": timedelta(hours=1)} for _ in range(3)]
    )

    send = one(spans, "send default")
    assert send.parent is None  # no request here: the batch starts its trace
    assert send.attributes is not None
    assert send.attributes["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in send.attributes
    traceparent = traceparent_of(send)
    stored = DelayedJob.objects.filter(pk__in=[job.pk for job in jobs])
    assert {str(job.trace_context) for job in stored} == {str({"traceparent": traceparent})}


def test_retry_and_reschedule_send_again_in_the_callers_trace(
    spans: InMemorySpanExporter,
) -> None:
    job = delayjobs.schedule(TRACED, {}, delay=timedelta(hours=1))
    delayjobs.cancel(job)
    spans.clear()
    with trace.get_tracer("tests").start_as_current_span("admin action") as action:
        delayjobs.retry(job)
    retry = one(spans, "send default", **{"messaging.operation.name": "retry"})
    assert retry.parent is not None and retry.parent.span_id == action.get_span_context().span_id
    assert DelayedJob.objects.get(pk=job.pk).trace_context == {"traceparent": traceparent_of(retry)}

    delayjobs.reschedule(job, delay=timedelta(hours=2))
    moved = one(spans, "send default", **{"messaging.operation.name": "reschedule"})
    assert moved.attributes is not None and moved.attributes["messaging.message.id"] == str(job.pk)
    assert DelayedJob.objects.get(pk=job.pk).trace_id == f"{moved.context.trace_id:032x}"


def test_the_admins_actions_send_in_a_span_of_their_own(
    spans: InMemorySpanExporter, admin_client: Any
) -> None:
    from tests.integration.test_admin import post_action

    job = delayjobs.schedule(TRACED, {}, delay=timedelta(hours=1))
    spans.clear()

    post_action(admin_client, "run_jobs_now", [job])

    send = one(spans, "send default", **{"messaging.operation.name": "reschedule"})
    assert send.attributes is not None and send.attributes["messaging.message.id"] == str(job.pk)
    assert DelayedJob.objects.get(pk=job.pk).trace_context == {"traceparent": traceparent_of(send)}


def test_skipped_expired_and_timed_out_attempts_say_so(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    skipped = delayjobs.schedule("tests.conditional", {"run": False})
    expired = delayjobs.schedule("tests.expiring", {}, run_at=timezone.now() - timedelta(minutes=2))
    # Held past its time_to_run (2 s) and never released: timed out, its thread left on.
    held = delayjobs.schedule(
        "tests.scripted",
        {"hold_attempts": [1], "release_file": str(tmp_path / "never"), "hold_seconds": 4},
        max_attempts=1,
    )

    drain()

    def outcome_of(job: DelayedJob) -> ReadableSpan:
        return one(spans, "process default", **{"messaging.message.id": str(job.pk)})

    assert outcome_of(skipped).attributes["delayjobs.outcome"] == "skipped"  # type: ignore[index]
    assert outcome_of(expired).attributes["delayjobs.outcome"] == "expired"  # type: ignore[index]
    timed_out = outcome_of(held)
    assert timed_out.attributes is not None
    assert timed_out.attributes["delayjobs.outcome"] == "timed_out"
    assert timed_out.status.status_code == StatusCode.ERROR
    assert [event.name for event in timed_out.events] == ["exception"]
    assert timed_out.attributes["error.type"] == "delayjobs.exceptions.JobTimeout"


def test_a_request_with_a_traceparent_continues_its_trace(
    spans: InMemorySpanExporter, api: Any
) -> None:
    trace_hex, parent_hex = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    response = api.post(
        "jobs/",
        {"job_type": "tests.scripted", "delay": 3600},
        headers={"traceparent": f"00-{trace_hex}-{parent_hex}-01", "tracestate": "vendor=1"},
    )

    assert response.status_code == 201, response.json()
    send = one(spans, "send default")
    assert f"{send.context.trace_id:032x}" == trace_hex
    assert send.parent is not None and f"{send.parent.span_id:016x}" == parent_hex
    stored = DelayedJob.objects.get(pk=response.json()["id"])
    assert stored.trace_context == {
        "traceparent": traceparent_of(send),
        "tracestate": "vendor=1",
    }


def test_a_request_span_already_current_is_the_parent_not_the_header(
    spans: InMemorySpanExporter, api: Any
) -> None:
    """With the project's HTTP instrumentation, the request's span continues the header
    itself: the send span is its child."""
    header = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with trace.get_tracer("tests").start_as_current_span("POST", kind=SpanKind.SERVER) as server:
        response = api.post(
            "jobs/", {"job_type": "tests.scripted"}, headers={"traceparent": header}
        )

    assert response.status_code == 201
    send = one(spans, "send default")
    assert send.parent is not None and send.parent.span_id == server.get_span_context().span_id


def test_a_malformed_traceparent_starts_a_trace_of_its_own(
    spans: InMemorySpanExporter, api: Any
) -> None:
    response = api.post(
        "jobs/", {"job_type": "tests.scripted"}, headers={"traceparent": "00-nonsense-01"}
    )

    assert response.status_code == 201
    assert one(spans, "send default").parent is None


def test_the_tasks_backend_keeps_the_trace(spans: InMemorySpanExporter) -> None:
    from tests.tasks import add

    with trace.get_tracer("tests").start_as_current_span("request") as request:
        result = add.enqueue(2, 3)

    send = one(spans, "send default")
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    drain()
    job = DelayedJob.objects.get(pk=int(result.id))
    assert job.status == JobStatus.SUCCEEDED
    process = one(spans, "process default")
    assert_processes(process, job, send)


def test_a_recurring_tick_is_a_root_span_naming_its_schedule(
    spans: InMemorySpanExporter,
) -> None:
    now = timezone.now()
    Schedule.objects.create(
        name="tracing.every-hour",
        source="database",
        job_type="tests.scripted",
        interval=timedelta(hours=1),
        materialised_until=now - timedelta(hours=1, milliseconds=1),
    )
    with trace.get_tracer("tests").start_as_current_span("unrelated"):
        errors: list[str] = []
        assert materialise_schedules(now, now + timedelta(seconds=1), errors) == 1
        assert errors == []

    drain()

    process = one(spans, "process default")
    assert process.parent is None and list(process.links) == []
    assert process.attributes is not None
    assert process.attributes["delayjobs.schedule.name"] == "tracing.every-hour"
    assert process.attributes["delayjobs.outcome"] == "succeeded"


def test_a_preloader_pass_is_one_span_with_its_reaper_inside(
    spans: InMemorySpanExporter,
) -> None:
    delayjobs.schedule_many([{"job_type": TRACED} for _ in range(3)])
    spans.clear()

    preloader.preload()

    preload = one(spans, "delayjobs preload")
    assert preload.parent is None and preload.kind == SpanKind.INTERNAL
    assert preload.attributes is not None and preload.attributes["delayjobs.loaded"] == 3
    reap = one(spans, "delayjobs reap")
    assert reap.parent is not None and reap.parent.span_id == preload.context.span_id
    assert reap.attributes is not None and reap.attributes["delayjobs.reaped"] == 0
    assert sorted(span.name for span in spans.get_finished_spans()) == [
        "delayjobs preload",
        "delayjobs reap",
    ]


def test_log_records_of_job_events_carry_the_attempts_trace_and_span(
    spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    job = delayjobs.schedule(TRACED, {"fail_attempts": [1]}, max_attempts=1)
    caplog.set_level("INFO", logger="delayjobs.consumer")

    drain()

    process = one(spans, "process default")
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "failed"]
    assert record.job_id == job.pk  # type: ignore[attr-defined]
    assert record.trace_id == f"{process.context.trace_id:032x}"  # type: ignore[attr-defined]
    assert record.span_id == f"{process.context.span_id:016x}"  # type: ignore[attr-defined]
    # Outside any span, a job's fields name the trace that scheduled it, and no span.
    fields = job_fields(DelayedJob.objects.get(pk=job.pk), "looked_at")
    assert (fields["trace_id"], fields["span_id"]) == (f"{process.context.trace_id:032x}", None)


# The Celery executor ---------------------------------------------------------------------


def test_a_celery_task_runs_the_job_in_the_trace_its_headers_carry(
    spans: InMemorySpanExporter,
) -> None:
    """The worker's side in this process: the headers, not the row, name the parent."""
    job = delayjobs.schedule(TRACED, {})
    [claimed] = claim(
        [job.pk],
        worker_id="consumer-1",
        now=timezone.now(),
        job_types=[TRACED],
        leases={},
        default_lease=timedelta(minutes=1),
    )
    assert claimed.claimed_at is not None
    carried = "00-11111111111111111111111111111111-2222222222222222-01"
    request = type("Request", (), {"delayjobs_traceparent": carried, "headers": None})()

    outcome = run_dispatched(
        job.pk,
        1,
        "consumer-1",
        claimed.claimed_at.isoformat(),
        "celery@x:1",
        trace_headers(request),
    )

    assert outcome == "succeeded"
    process = one(spans, "process default")
    assert f"{process.context.trace_id:032x}" == "1" * 32
    assert process.parent is not None and f"{process.parent.span_id:016x}" == "2" * 16
    assert process.attributes is not None
    assert process.attributes["delayjobs.consumer"] == "celery@x:1"


def test_the_time_a_job_waited_for_a_limit_is_on_its_span(spans: InMemorySpanExporter) -> None:
    """Absent when nothing made the job wait; what the limited claim measured when a
    fleet-wide limit held it (the job's ``limit_wait``)."""
    waited, free = delayjobs.schedule(TRACED, {}), delayjobs.schedule(TRACED, {})
    rows = claim(
        [waited.pk, free.pk],
        worker_id="consumer-1",
        now=timezone.now(),
        job_types=[TRACED],
        leases={},
        default_lease=timedelta(minutes=1),
    )
    by_id = {row.pk: row for row in rows}

    by_id[waited.pk].limit_wait = timedelta(milliseconds=12.5)
    run_claimed(by_id[waited.pk], "consumer-1")
    run_claimed(by_id[free.pk], "consumer-1")

    def attributes(job: DelayedJob) -> dict[str, Any]:
        span = one(spans, "process default", **{"messaging.message.id": str(job.pk)})
        return dict(span.attributes or {})

    assert attributes(waited)["delayjobs.limit_wait_ms"] == 12.5
    assert "delayjobs.limit_wait_ms" not in attributes(free)


def test_trace_headers_are_read_from_the_request_or_its_headers() -> None:
    carried = {"traceparent": "00-" + "3" * 32 + "-" + "4" * 16 + "-01", "tracestate": "a=b"}
    sent = {"delayjobs_traceparent": carried["traceparent"], "delayjobs_tracestate": "a=b"}
    as_attributes = type("Request", (), {**sent, "headers": None})()
    as_headers = type("Request", (), {"headers": sent})()
    # Celery's own instrumentation's header describes its publish span: not the job's.
    neither = type("Request", (), {"traceparent": carried["traceparent"], "headers": None})()
    assert trace_headers(as_attributes) == carried
    assert trace_headers(as_headers) == carried
    assert trace_headers(neither) is None


# Processes -------------------------------------------------------------------------------


@pytest.fixture
def traced_env(tmp_path: Path) -> Callable[[str], tuple[dict[str, str], Path]]:
    def make(service: str) -> tuple[dict[str, str], Path]:
        path = tmp_path / f"{service}-spans.jsonl"
        return {"DELAYJOBS_TEST_TRACES": str(path), "DELAYJOBS_TEST_SERVICE": service}, path

    return make


def spans_named(path: Path, name: str) -> list[dict[str, Any]]:
    return [span for span in read_spans(path) if span["name"] == name]


@pytest.mark.subprocess
def test_run_delay_consumer_runs_jobs_in_their_schedulers_traces(
    spans: InMemorySpanExporter,
    consumer_process: ConsumerFactory,
    traced_env: Callable[[str], tuple[dict[str, str], Path]],
) -> None:
    env, path = traced_env("consumer")
    with trace.get_tracer("tests").start_as_current_span("POST /orders"):
        ok = delayjobs.schedule(TRACED, {})
        retried = delayjobs.schedule(TRACED, {"fail_attempts": [1]})
    consumer = consumer_process("--concurrency", "2", env=env)

    wait_final([ok.pk, retried.pk], [consumer])
    wait_for(lambda: len(spans_named(path, "process default")) == 3)

    sends = {
        (span.attributes or {})["messaging.message.id"]: span
        for span in spans.get_finished_spans()
        if span.name == "send default"
    }
    processes = spans_named(path, "process default")
    for span in processes:
        job_id = span["attributes"]["messaging.message.id"]
        send = sends[job_id]
        assert span["kind"] == "SpanKind.CONSUMER"
        assert span["context"]["trace_id"] == f"0x{send.context.trace_id:032x}"
        assert span["parent_id"] == f"0x{send.context.span_id:016x}"
        assert span["resource"]["attributes"]["service.name"] == "consumer"
    outcomes = sorted(
        (
            span["attributes"]["messaging.message.id"],
            span["attributes"]["delayjobs.attempt"],
            span["attributes"]["delayjobs.outcome"],
            span["status"]["status_code"],
        )
        for span in processes
    )
    assert outcomes == sorted(
        [
            (str(ok.pk), 1, "succeeded", "UNSET"),
            (str(retried.pk), 1, "retrying", "ERROR"),
            (str(retried.pk), 2, "succeeded", "UNSET"),
        ]
    )


@pytest.mark.subprocess
def test_a_celery_worker_runs_the_job_in_the_schedulers_trace(
    spans: InMemorySpanExporter,
    consumer_process: ConsumerFactory,
    traced_env: Callable[[str], tuple[dict[str, str], Path]],
    tmp_path: Path,
) -> None:
    consumer_env, consumer_spans = traced_env("consumer")
    worker_env, worker_spans = traced_env("celery-worker")
    worker = ConsumerProcess(
        [
            "--pool=threads",
            "--concurrency=2",
            "--loglevel=INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--hostname=celery-tracing@localhost",
        ],
        tmp_path / "celery.log",
        subprocess_env(**worker_env),
        command=("-m", "celery", "-A", "sampleproject", "worker"),
    )
    try:
        wait_for(lambda: "ready." in worker.output() or worker.returncode is not None)
        assert worker.returncode is None, worker.output()
        consumer = consumer_process("--executor", "celery", env=consumer_env)
        with trace.get_tracer("tests").start_as_current_span("POST /orders"):
            job = delayjobs.schedule(TRACED, {"fail_attempts": [1]}, max_attempts=1)

        wait_final([job.pk], [consumer, worker])
        wait_for(lambda: spans_named(worker_spans, "process default") != [])
    finally:
        worker.kill()

    send = one(spans, "send default")
    [process] = spans_named(worker_spans, "process default")
    assert process["context"]["trace_id"] == f"0x{send.context.trace_id:032x}"
    assert process["parent_id"] == f"0x{send.context.span_id:016x}"
    assert process["attributes"]["delayjobs.consumer"].startswith("celery-tracing@localhost:")
    assert process["attributes"]["delayjobs.outcome"] == "failed"
    assert process["status"]["status_code"] == "ERROR"
    assert [event["name"] for event in process["events"]] == ["exception"]
    # The consumer that claimed it made no process span of its own: the worker's is the one.
    assert spans_named(consumer_spans, "process default") == []


# Off, or not installed ---------------------------------------------------------------------


def test_tracing_false_makes_no_span_and_stores_no_context(spans: InMemorySpanExporter) -> None:
    with override_settings(DELAYJOBS={"TRACING": False}):
        tracing.reset()
        with trace.get_tracer("tests").start_as_current_span("request"):
            job = delayjobs.schedule(TRACED, {})
        drain()
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED
    assert DelayedJob.objects.get(pk=job.pk).trace_context is None
    # The request's span and the body's own: none of delayjobs'.
    assert sorted(span.name for span in spans.get_finished_spans()) == ["request", "tests.inside"]


def test_a_burst_leaves_no_thread_behind_while_opentelemetry_is_imported(
    spans: InMemorySpanExporter,
) -> None:
    """The consumer imports OpenTelemetry in a thread of its own before its first claim,
    and joins it at shutdown like its other threads."""
    tracing.reset()
    assert not tracing.decided()

    drain()

    assert tracing.decided() and tracing.enabled()
    assert [t.name for t in threading.enumerate() if t.name.startswith("delayjobs-")] == []


def test_an_opentelemetry_that_fails_to_import_turns_tracing_off(
    spans: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broken install (an import that raises) must not fail jobs: it is logged once."""

    def broken() -> None:
        raise ImportError("a broken opentelemetry install")

    monkeypatch.setattr(tracing, "_Api", broken)
    tracing.reset()
    job = delayjobs.schedule(TRACED, {"fail_attempts": []})
    drain()

    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED
    assert not tracing.enabled()
    assert [r.message for r in caplog.records if r.name == "delayjobs.tracing"] == [
        "OpenTelemetry could not be imported: delayjobs traces nothing."
    ]


def test_tracing_must_be_a_bool() -> None:
    with override_settings(DELAYJOBS={"TRACING": "yes"}):
        [message] = [m for m in check_settings() if m.id == "delayjobs.E020"]
    assert "TRACING" in message.msg


def python_script(script: str) -> list[str]:
    """Run ``script`` in a fresh Python on the test's database; the lines it printed."""
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    return result.stdout.strip().splitlines()


#: The API installed and no SDK set up (a fresh process: this one has the tests' SDK).
API_ONLY = textwrap.dedent(
    """
    import django

    django.setup()
    from opentelemetry import context, trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    import delayjobs
    from delayjobs.engine.consumer import Consumer
    from delayjobs.models import DelayedJob

    seen = []

    class Sees(delayjobs.JobType):
        name = "tests.sees_context"

        def execute(self, job):
            seen.append(trace.get_current_span().get_span_context())

    delayjobs.register(Sees)
    remote = SpanContext(0xABC, 0x123, is_remote=True, trace_flags=TraceFlags(1))
    token = context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    joined = delayjobs.schedule("tests.sees_context")
    context.detach(token)
    alone = delayjobs.schedule("tests.sees_context")
    Consumer(queues=["default"], burst=True, preload=False, concurrency=1).run()
    for job in (joined, alone):
        print(DelayedJob.objects.get(pk=job.pk).trace_context)
    print(sorted((f"{c.trace_id:x}", f"{c.span_id:x}", c.is_valid) for c in seen))
    """
)


@pytest.mark.subprocess
def test_with_the_api_and_no_sdk_the_callers_context_is_kept_and_current_in_the_body(
    redis_client: redis.Redis,
) -> None:
    """No SDK: no span records, but a context that came in (a request's traceparent) is
    stored with the job and is the current one while its body runs, for instrumented
    clients to pass on."""
    joined, alone, seen = python_script(API_ONLY)[-3:]
    remote = "00-00000000000000000000000000000abc-0000000000000123-01"
    assert joined == str({"traceparent": remote})
    assert alone == "None"
    assert seen == str([("0", "0", False), ("abc", "123", True)])


#: Run with opentelemetry hidden: an import finder refuses it before Django sets up.
WITHOUT_OPENTELEMETRY = textwrap.dedent(
    """
    import sys

    class Hide:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Hide())
    import django

    django.setup()
    import delayjobs
    from delayjobs.core import tracing
    from delayjobs.engine.consumer import Consumer
    from delayjobs.models import DelayedJob

    assert not tracing.installed() and not tracing.enabled()
    job = delayjobs.schedule("tests.scripted", {})
    many = delayjobs.schedule_many([{"job_type": "tests.async_scripted"}])
    Consumer(queues=["default"], burst=True, preload=True, concurrency=1).run()
    rows = DelayedJob.objects.filter(pk__in=[job.pk, many[0].pk])
    print(sorted((row.status, row.trace_context) for row in rows))
    print(sorted(name for name in sys.modules if name.startswith("opentelemetry")))
    """
)


@pytest.mark.subprocess
def test_nothing_breaks_without_opentelemetry(redis_client: redis.Redis) -> None:
    statuses, modules = python_script(WITHOUT_OPENTELEMETRY)[-2:]
    assert statuses == "[('succeeded', None), ('succeeded', None)]"
    assert modules == "[]"


@pytest.mark.subprocess
def test_setting_up_django_decides_nothing_about_tracing() -> None:
    """Start-up: delayjobs asks for the API at the first span, not with the app. (Whether
    OpenTelemetry is imported then is not up to delayjobs alone: redis-py 8 imports its
    metrics API, and SDK if installed, when redis is imported.)"""
    script = (
        "import django; django.setup(); import delayjobs.api, delayjobs.engine.consumer; "
        "from delayjobs.core import tracing; print(tracing._api)"
    )
    assert python_script(script) == ["None"]
