"""Prometheus metrics, scraped as Prometheus scrapes them: from a real consumer's
``--metrics-port``, and from ``metrics_view`` in prometheus_client's multiprocess mode,
where the view sums what the consumer processes wrote. And the structured fields of each
job's log lines."""

from __future__ import annotations

import json
import logging
import re
import signal
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.http import HttpResponse
from django.test import RequestFactory
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

import delayjobs
from delayjobs.core import metrics
from delayjobs.engine.consumer import Consumer
from tests.conftest import REPO_ROOT, ConsumerFactory, ConsumerProcess
from tests.consumers import wait_final
from tests.support.processes import free_port
from tests.utils import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPTED = "tests.scripted"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample by name and labels (the ``pid`` of multiprocess gauges left out)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = frozenset((k, v) for k, v in sample.labels.items() if k != "pid")
            key = (sample.name, labels)
            samples[key] = samples.get(key, 0.0) + sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return parse(response.read().decode())


def scrape_when(port: int, consumer: ConsumerProcess) -> Samples | None:
    """A scrape, or None while the consumer's server is not listening yet."""
    assert consumer.returncode is None, consumer.output()
    try:
        return scrape(port)
    except OSError:
        return None


def run_mixed_jobs(consumer: ConsumerProcess) -> list[int]:
    """Four jobs that succeed, one that fails once then succeeds, one that fails for good
    (3 attempts), one skipped."""
    jobs = [delayjobs.schedule(SCRIPTED, {"n": n}) for n in range(4)]
    jobs.append(delayjobs.schedule(SCRIPTED, {"fail_attempts": [1]}))
    jobs.append(delayjobs.schedule(SCRIPTED, {"fail_attempts": [1, 2, 3]}))
    jobs.append(delayjobs.schedule("tests.conditional", {"run": False}))
    ids = [job.pk for job in jobs]
    wait_final(ids, [consumer])
    return ids


@pytest.mark.subprocess
def test_a_consumer_serves_its_metrics_on_its_port(
    consumer_process: ConsumerFactory, tmp_path: Path
) -> None:
    port = free_port()
    consumer = consumer_process("--metrics-port", str(port), "--metrics-address", "127.0.0.1")
    release = tmp_path / "release"
    held = delayjobs.schedule(SCRIPTED, {"hold_attempts": [1], "release_file": str(release)})
    later = delayjobs.schedule(SCRIPTED, {"n": 99}, delay=timedelta(minutes=1))

    # In flight: the held job, once a heartbeat has counted it.
    wait_for(
        lambda: (
            (s := scrape_when(port, consumer)) is not None
            and value(s, "delayjobs_jobs_in_flight") == 1
        ),
        timeout=30,
        message="the consumer never reported the held job in flight",
    )
    release.touch()
    run_mixed_jobs(consumer)
    wait_final([held.pk], [consumer])
    samples = scrape(port)

    started = value(samples, "delayjobs_jobs_started_total", job_type=SCRIPTED)
    assert started == 1 + 4 + 2 + 3  # held, four, flaky twice, doomed three times
    finished = {
        outcome: value(samples, "delayjobs_jobs_finished_total", job_type=SCRIPTED, outcome=outcome)
        for outcome in ("succeeded", "retrying", "failed")
    }
    assert finished == {"succeeded": 6, "retrying": 3, "failed": 1}
    assert (
        value(
            samples,
            "delayjobs_jobs_finished_total",
            job_type="tests.conditional",
            outcome="skipped",
        )
        == 1
    )
    assert value(samples, "delayjobs_job_lateness_seconds_count", job_type=SCRIPTED) == started
    assert value(samples, "delayjobs_job_duration_seconds_count", job_type=SCRIPTED) == 10
    # Lateness by bucket: every start within a minute, none before its run_at.
    assert (
        value(samples, "delayjobs_job_lateness_seconds_bucket", job_type=SCRIPTED, le="60.0") == 10
    )
    assert value(samples, "delayjobs_consumers") == 1
    assert value(samples, "delayjobs_consumer_heartbeat_timestamp_seconds") > 0
    assert value(samples, "delayjobs_preload_pass_seconds_count") >= 1
    # From the database at the scrape: the job due in a minute is in no window yet.
    assert value(samples, "delayjobs_jobs_due", queue="default") == 0
    assert value(samples, "delayjobs_jobs_due_in_window", queue="default") == 0
    assert later.pk  # scheduled, not due: counted nowhere above


@pytest.fixture
def multiprocess_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    monkeypatch.setenv(metrics.MULTIPROCESS_ENV, str(directory))
    yield directory


@pytest.mark.subprocess
def test_the_view_sums_the_metrics_consumers_wrote_in_multiprocess_mode(
    consumer_process: ConsumerFactory, multiprocess_dir: Path
) -> None:
    env = {metrics.MULTIPROCESS_ENV: str(multiprocess_dir)}
    consumers = [consumer_process("--concurrency", "2", env=env) for _ in range(2)]
    jobs = delayjobs.schedule_many([{"job_type": SCRIPTED, "payload": {"n": n}} for n in range(30)])
    wait_final([job.pk for job in jobs], consumers)
    # Both running: one may have run every job while the other was still starting.
    wait_for(
        lambda: value(parse(view().content.decode()), "delayjobs_consumers") == 2,
        message="the view never counted both consumers",
    )

    response = view()

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = parse(response.content.decode())
    succeeded = {"job_type": SCRIPTED, "outcome": "succeeded"}
    assert value(samples, "delayjobs_jobs_finished_total", **succeeded) == 30  # both, summed
    assert value(samples, "delayjobs_consumers") == 2

    for consumer in consumers:
        consumer.send_signal(signal.SIGTERM)
        assert consumer.wait() == 0, consumer.output()
    now = timezone.now()
    delayjobs.schedule(SCRIPTED, run_at=now - timedelta(seconds=1))  # due, nobody to run it
    delayjobs.schedule(SCRIPTED, run_at=now + timedelta(seconds=2))  # in the window
    delayjobs.schedule(SCRIPTED, run_at=now + timedelta(hours=1))  # beyond it

    samples = parse(view().content.decode())
    # Stopped consumers leave the live gauges; their counts stay.
    assert value(samples, "delayjobs_consumers") == 0
    assert value(samples, "delayjobs_jobs_finished_total", **succeeded) == 30
    assert value(samples, "delayjobs_jobs_due", queue="default") == 1
    assert value(samples, "delayjobs_jobs_due_in_window", queue="default") == 2


@pytest.mark.subprocess
def test_several_processes_serve_every_process_metrics_from_the_first(
    consumer_process: ConsumerFactory, multiprocess_dir: Path
) -> None:
    port = free_port()
    env = {metrics.MULTIPROCESS_ENV: str(multiprocess_dir)}
    supervisor = consumer_process("--processes", "2", "--metrics-port", str(port), env=env)
    wait_for(
        lambda: (
            (s := scrape_when(port, supervisor)) is not None
            and value(s, "delayjobs_consumers") == 2
        ),
        message=f"the first process never counted both:\n{supervisor.output()}",
    )
    jobs = delayjobs.schedule_many([{"job_type": SCRIPTED, "payload": {"n": n}} for n in range(20)])
    wait_final([job.pk for job in jobs], [supervisor])

    succeeded = {"job_type": SCRIPTED, "outcome": "succeeded"}
    assert value(scrape(port), "delayjobs_jobs_finished_total", **succeeded) == 20
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait() == 0, supervisor.output()


def test_several_processes_on_one_metrics_port_need_multiprocess_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(metrics.MULTIPROCESS_ENV, raising=False)
    with pytest.raises(CommandError, match="--metrics-port with 2 processes needs prometheus"):
        call_command("run_delay_consumer", processes=2, metrics_port=free_port())


def view() -> HttpResponse:
    return metrics.metrics_view(RequestFactory().get("/metrics"))


def test_the_view_counts_jobs_scheduled_in_this_process() -> None:
    before = parse(view().content.decode())
    delayjobs.schedule(SCRIPTED, delay=timedelta(hours=1))
    delayjobs.schedule_many([{"job_type": SCRIPTED, "delay": timedelta(hours=1)} for _ in range(2)])
    job = delayjobs.schedule(SCRIPTED, delay=timedelta(hours=1))
    delayjobs.reschedule(job, delay=timedelta(hours=2))  # a move, not a new job

    after = parse(view().content.decode())
    scheduled = "delayjobs_jobs_scheduled_total"
    assert (
        value(after, scheduled, job_type=SCRIPTED) - value(before, scheduled, job_type=SCRIPTED)
        == 4
    )


def test_metrics_options_are_checked() -> None:
    with pytest.raises(CommandError, match=r"--metrics-port: must be a TCP port, 1 to 65535"):
        call_command("run_delay_consumer", metrics_port=70000)
    with pytest.raises(CommandError, match=r"--metrics-address: use an IP address"):
        call_command("run_delay_consumer", metrics_port=9999, metrics_address="localhost; rm")


def test_every_job_event_is_logged_with_structured_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="delayjobs"):
        ok = delayjobs.schedule(SCRIPTED)
        flaky = delayjobs.schedule(SCRIPTED, {"fail_attempts": [1]})
        skipped = delayjobs.schedule("tests.conditional", {"run": False})
        assert Consumer(burst=True, concurrency=2, preload=False).run() == 0

    # (job, event, attempt) -> (job type, lateness): a quick retry may run in the same burst.
    events = {
        (r.job_id, r.event, r.attempt): (r.job_type, r.lateness_ms)
        for r in caplog.records
        if hasattr(r, "event")
    }
    for job in (ok, flaky):
        assert events[job.pk, "scheduled", 0] == (SCRIPTED, None)
        assert events[job.pk, "started", 1][0] == SCRIPTED
    assert events[ok.pk, "succeeded", 1][0] == SCRIPTED
    assert events[flaky.pk, "retrying", 1][0] == SCRIPTED
    assert events[skipped.pk, "skipped", 1][0] == "tests.conditional"
    measured = [lateness for (_, event, _), (_, lateness) in events.items() if event != "scheduled"]
    assert len(measured) >= 5 and all(lateness >= 0 for lateness in measured)


def test_the_grafana_dashboard_queries_only_metrics_delayjobs_exports() -> None:
    dashboard = json.loads((REPO_ROOT / "docs" / "howto" / "grafana-dashboard.json").read_text())
    queried = {
        re.sub(r"_(bucket|count|sum|total)$", "", name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"delayjobs_[a-z_]+", target["expr"])
    }
    collectors = [
        *(metrics.SCHEDULED, metrics.STARTED, metrics.FINISHED, metrics.LATENESS),
        *(metrics.DURATION, metrics.IN_FLIGHT, metrics.PRELOAD_PASS, metrics.CONSUMERS),
        *(metrics.HEARTBEAT, metrics.CLOCK_OFFSET, metrics.LIMIT_WAIT),
        metrics.BacklogCollector(),
    ]
    exported = {family.name for collector in collectors for family in collector.collect()}
    assert queried <= exported, queried - exported
    assert len(queried) == len(exported)  # and it shows every one of them
