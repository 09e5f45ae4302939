"""The benchmark job bodies: chosen by name, unknown names refused, one report table each.

Pure Python: the bodies themselves run against real servers in ``benchmarks/run.sh``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from benchmarks import bodies, suite
from benchmarks.environment import BODY_ENV
from benchmarks.http_server import RESPONSE, Responder


def test_the_suite_runs_the_noop_body_unless_told():
    assert suite.parse_args([]).bodies == ["noop"]


def test_one_body_or_several_can_be_chosen():
    assert suite.parse_args(["--body", "orm"]).bodies == ["orm"]
    assert suite.parse_args(["--bodies", "redis", "http", "sleep10"]).bodies == [
        "redis",
        "http",
        "sleep10",
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["--body", "nothing"],
        ["--bodies", "redis", "nothing"],
        ["--body", "orm", "--bodies", "http"],
    ],
)
def test_an_unknown_body_or_both_options_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        suite.parse_args(argv)
    assert exited.value.code == 2
    assert "--bod" in capsys.readouterr().err


def test_consumers_read_the_body_from_the_environment(monkeypatch):
    monkeypatch.delenv(BODY_ENV, raising=False)
    assert bodies.selected() == "noop"
    monkeypatch.setenv(BODY_ENV, "http")
    assert bodies.selected() == "http"
    monkeypatch.setenv(BODY_ENV, "nothing")
    with pytest.raises(ValueError, match="nothing"):
        bodies.selected()


def test_select_refuses_an_unknown_body(monkeypatch):
    monkeypatch.delenv(BODY_ENV, raising=False)
    with pytest.raises(ValueError, match="nothing"):
        bodies.select("nothing")
    bodies.select("sleep10")
    assert bodies.selected() == "sleep10"


def test_every_body_is_described_for_the_report():
    assert set(bodies.DESCRIBE) == set(bodies.BODIES)


class Transport(asyncio.Transport):
    """What the responder wrote, as a socket would have sent it."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = b""

    def write(self, data: Any) -> None:
        self.sent += bytes(data)


def test_the_http_server_answers_each_request_even_split_or_pipelined():
    transport = Transport()
    responder = Responder()
    responder.connection_made(transport)
    request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    responder.data_received(request[:10])
    assert transport.sent == b""
    responder.data_received(request[10:] + request + request[:5])
    assert transport.sent == RESPONSE * 2
    responder.data_received(request[5:])
    assert transport.sent == RESPONSE * 3


def _entry(system: str, rate: float) -> dict[str, Any]:
    median = {"jobs_per_second": rate, "drain_seconds": 1.0, "missing": 0, "duplicates": 0}
    return {
        "system": system,
        "config": "c",
        "describe": "d",
        "versions": {},
        "errors": [],
        "workloads": {"W2": {"median": median, "runs": [median]}},
    }


def _report(**results: Any) -> dict[str, Any]:
    machine = {
        "date": "today",
        "commit": "abc",
        "nproc": 2,
        "cpu_model": "cpu",
        "memory_gb": 1.0,
        "python": "3.11",
        "postgresql": "15",
        "redis": "7",
        "load_average_at_start": [0.0],
        "load_average_at_end": [0.0],
    }
    return {"quick": True, "runs": 1, "seconds": 60.0, "machine": machine, **results}


def test_a_report_from_before_bodies_renders_as_the_noop_body():
    text = suite.render_markdown(_report(systems=[_entry("delayjobs", 300), _entry("rq", 100)]))
    assert "## Body `noop`" in text
    assert "| rq | n/a | 3.00x |" in text


def test_a_report_has_a_table_and_ratios_for_each_body():
    report = _report(
        bodies=[
            {"body": "redis", "systems": [_entry("delayjobs", 200), _entry("celery", 100)]},
            {"body": "http", "systems": [_entry("delayjobs", 100), _entry("celery", 400)]},
        ]
    )
    assert [body for body, _ in suite.by_body(report)] == ["redis", "http"]
    text = suite.render_markdown(report)
    redis_part, http_part = text.split("## Body `redis`")[1].split("## Body `http`")
    assert "| celery | n/a | 2.00x |" in redis_part
    assert "| celery | n/a | 0.25x |" in http_part


def test_a_start_without_an_end_is_an_unfinished_execution(tmp_path, monkeypatch):
    from benchmarks import records
    from benchmarks.workloads import outcome

    monkeypatch.setenv(records.RECORD_DIR_ENV, str(tmp_path))
    records.record(1, 0.0)
    records.record_end(1)
    records.record(2, 0.0)  # its body raised: no end
    reader = records.RecordReader(tmp_path)
    assert reader.poll() == 2
    assert reader.ends.keys() == {1}
    monkeypatch.setenv(BODY_ENV, "redis")
    assert outcome(reader, range(3))["unfinished"] == 1
    monkeypatch.setenv(BODY_ENV, "noop")  # writes no ends: as before bodies existed
    assert outcome(reader, range(3))["unfinished"] == 0
