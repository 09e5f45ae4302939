"""End to end: ``run_delay_consumer --processes 2``, a supervisor and the two consumer
processes it forks, on the test database and real Redis.

The consumer processes run at ``--concurrency 1`` where a test needs a job in each: one
running a held job claims nothing more, so the next job goes to the other, whichever
started first. Every wait is for an event (a row, a log line), never for a fixed time.
"""

from __future__ import annotations

import os
import signal
import socket
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse

import delayjobs
from delayjobs.conf import MAX_PROCESSES
from delayjobs.core import metrics
from delayjobs.engine.supervisor import usable_cpus
from delayjobs.management.commands.run_delay_consumer import how_many
from delayjobs.models import AttemptOutcome, Consumer, DelayedJob, JobStatus
from tests.conftest import ConsumerFactory, ConsumerProcess
from tests.consumers import (
    check_alive,
    executions_per_job,
    history,
    statuses,
    wait_executed,
    wait_final,
    wait_output,
)
from tests.models import Execution
from tests.support.processes import free_port
from tests.utils import wait_for

pytestmark = [pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

#: A short lease (2 s): a killed process's job comes back within seconds.
SCRIPTED = "tests.scripted"
#: A lease no loaded machine outlasts: for jobs held while the test signals.
COUNTED = "tests.counted"


def supervise(consumer_process: ConsumerFactory, *args: str, **env: str) -> ConsumerProcess:
    """``run_delay_consumer --processes 2 *args``: the supervisor's process."""
    return consumer_process("--processes", "2", *args, env=env or None)


def wait_children(supervisor: ConsumerProcess, names: list[str]) -> dict[str, int]:
    """Until a consumer process announced itself under each name; each one's pid."""

    def announced() -> dict[str, int] | None:
        check_alive([supervisor])
        rows = dict(Consumer.objects.filter(worker_id__in=names).values_list("worker_id", "pid"))
        return rows if len(rows) == len(names) else None

    pids = wait_for(announced, message=f"{names} never all announced:\n{supervisor.output()}")
    assert len(set(pids.values())) == len(names)
    assert supervisor.pid not in pids.values()
    return pids


def hold_one_in_each(supervisor: ConsumerProcess, release: Path, count: int) -> list[DelayedJob]:
    """A held job running in each of ``count`` processes (each at --concurrency 1)."""
    held = []
    for _ in range(count):
        job = delayjobs.schedule(COUNTED, {"hold_attempts": [1], "release_file": str(release)})
        wait_executed(job, [supervisor])
        held.append(job)
    return held


def wait_all_finishing(supervisor: ConsumerProcess, count: int) -> None:
    """Until ``count`` consumer processes said they finish their running job, claiming
    no more."""
    wait_for(
        lambda: supervisor.output().count("SIGTERM: finishing 1 running job(s)") == count,
        message=f"not every process is finishing its job:\n{supervisor.output()}",
    )


def test_auto_is_one_process_per_cpu_and_one_on_sqlite() -> None:
    expected = 1 if connection.vendor == "sqlite" else min(usable_cpus(), MAX_PROCESSES)
    assert how_many("auto", "local") == expected


def test_a_burst_with_auto_runs_in_the_callers_own_process() -> None:
    # What a project's test does to drain what is due: no fork of the test's process.
    job = delayjobs.schedule(COUNTED)
    call_command("run_delay_consumer", "--burst")
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    [worker] = Execution.objects.values_list("worker_id", flat=True)
    assert f":{os.getpid()}:" in worker


def test_each_process_runs_jobs_shows_in_status_and_the_admin_and_finishes_on_sigterm(
    consumer_process: ConsumerFactory, admin_client: Client, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    supervisor = supervise(consumer_process, "--concurrency", "1", "--worker-id", "pair")
    names = ["pair-1", "pair-2"]
    pids = wait_children(supervisor, names)

    held = hold_one_in_each(supervisor, release, 2)
    assert sorted(Execution.objects.values_list("worker_id", flat=True)) == names

    out = StringIO()
    call_command("delayjobs_status", stdout=out)
    for name, pid in pids.items():
        assert f"  {name} on {socket.gethostname()} (pid {pid}), queues" in out.getvalue()
    page = admin_client.get(reverse("admin:delayjobs_consumer_changelist")).content.decode()
    assert all(name in page for name in names)

    supervisor.send_signal(signal.SIGTERM)
    wait_output(supervisor, "SIGTERM: stopping 2 consumer process(es)")
    wait_all_finishing(supervisor, 2)
    late = delayjobs.schedule(SCRIPTED)  # due now: nobody claims it any more
    release.touch()
    assert supervisor.wait(timeout=60) == 0, supervisor.output()

    assert statuses(job.pk for job in held) == {JobStatus.SUCCEEDED: 2}
    # One attempt each, by the process that ran it when SIGTERM came: no lease expired.
    assert sorted(history(job) for job in held) == [
        [(1, name, AttemptOutcome.SUCCEEDED)] for name in names
    ]
    late.refresh_from_db()
    assert (late.status, late.attempts) == (JobStatus.SCHEDULED, 0)
    assert not Consumer.objects.filter(worker_id__in=names).exists()  # each withdrew


def test_ctrl_c_in_a_terminal_reaches_every_process_and_each_finishes_its_job_once(
    consumer_process: ConsumerFactory, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    supervisor = supervise(consumer_process, "--concurrency", "1", "--worker-id", "tty")
    pids = wait_children(supervisor, ["tty-1", "tty-2"])
    held = hold_one_in_each(supervisor, release, 2)

    # A terminal sends SIGINT to every process of its foreground group: the consumer
    # processes ignore theirs and act on the supervisor's SIGTERM, once.
    for pid in [supervisor.pid, *pids.values()]:
        os.kill(pid, signal.SIGINT)
    wait_all_finishing(supervisor, 2)
    release.touch()
    assert supervisor.wait(timeout=60) == 0, supervisor.output()

    output = supervisor.output()
    assert "SIGINT again" not in output
    assert "SIGTERM again" not in output
    assert statuses(job.pk for job in held) == {JobStatus.SUCCEEDED: 2}


def test_a_second_signal_makes_every_process_exit_at_once(
    consumer_process: ConsumerFactory, tmp_path: Path
) -> None:
    never = tmp_path / "never-created"
    supervisor = supervise(consumer_process, "--concurrency", "1", "--worker-id", "hasty")
    wait_children(supervisor, ["hasty-1", "hasty-2"])
    held = hold_one_in_each(supervisor, never, 2)

    supervisor.send_signal(signal.SIGTERM)
    wait_all_finishing(supervisor, 2)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) != 0

    output = supervisor.output()
    assert "SIGTERM again: the consumer processes exit at once" in output
    assert output.count("SIGTERM again: exiting now") == 2
    # They come back after their lease, as any job of a consumer that died.
    assert statuses(job.pk for job in held) == {JobStatus.RUNNING: 2}


def test_a_killed_process_is_started_again_and_no_job_is_lost(
    consumer_process: ConsumerFactory, tmp_path: Path
) -> None:
    supervisor = supervise(consumer_process, "--concurrency", "1", "--worker-id", "phoenix")
    pids = wait_children(supervisor, ["phoenix-1", "phoenix-2"])
    # Held on its first attempt only (the file never appears): the second runs through.
    job = delayjobs.schedule(
        SCRIPTED, {"hold_attempts": [1], "release_file": str(tmp_path / "never")}
    )
    wait_executed(job, [supervisor])
    victim = DelayedJob.objects.get(pk=job.pk).worker_id
    slot = victim.rsplit("-", 1)[1]

    os.kill(pids[victim], signal.SIGKILL)
    wait_output(
        supervisor,
        f"Consumer process {slot} of 2 (pid {pids[victim]}) exited (killed by SIGKILL); "
        f"starting it again now.",
    )
    # Its successor announces itself under the same name.
    wait_for(
        lambda: Consumer.objects.filter(worker_id=victim).exclude(pid=pids[victim]).exists(),
        message=f"no process took the place of {victim}:\n{supervisor.output()}",
    )
    more = delayjobs.schedule_many([{"job_type": COUNTED, "payload": {"n": n}} for n in range(20)])
    ids = [job.pk for job in more]
    wait_final([job.pk, *ids], [supervisor])

    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.SUCCEEDED, 2)
    [first, second] = history(job)
    assert first == (1, victim, AttemptOutcome.LEASE_EXPIRED)
    assert second[2] == AttemptOutcome.SUCCEEDED
    assert statuses(ids) == {JobStatus.SUCCEEDED: len(ids)}
    assert {pk: n for pk, n in executions_per_job().items() if pk in ids} == dict.fromkeys(ids, 1)

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=60) == 0, supervisor.output()


def test_burst_runs_each_due_job_once_in_every_process_then_exits(
    consumer_process: ConsumerFactory,
) -> None:
    jobs = delayjobs.schedule_many([{"job_type": COUNTED, "payload": {"n": n}} for n in range(100)])
    ids = [job.pk for job in jobs]

    supervisor = supervise(
        consumer_process, "--burst", "--worker-id", "bursty", DELAYJOBS_TEST_LOG_LEVEL="INFO"
    )
    assert supervisor.wait(timeout=60) == 0, supervisor.output()

    assert statuses(ids) == {JobStatus.SUCCEEDED: len(ids)}
    assert executions_per_job() == dict.fromkeys(ids, 1)
    assert supervisor.output().count("exited (exit code 0)") == 2


def test_a_process_that_cannot_start_stops_the_supervisor_rather_than_a_restart_loop(
    consumer_process: ConsumerFactory, tmp_path: Path
) -> None:
    multiprocess_dir = tmp_path / "prometheus"
    multiprocess_dir.mkdir()
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):  # taken: the first process cannot serve
        supervisor = supervise(
            consumer_process,
            "--metrics-port",
            str(port),
            **{metrics.MULTIPROCESS_ENV: str(multiprocess_dir)},
        )
        assert supervisor.wait(timeout=60) == 1, supervisor.output()

    output = supervisor.output()
    assert f"CommandError: --metrics-port {port}: cannot listen on 127.0.0.1" in output
    assert "Consumer process 1 of 2" in output
    assert "could not start as configured" in output
    assert "starting it again" not in output
