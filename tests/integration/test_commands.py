"""The operator's commands: delayjobs_status, prune_delay_jobs, pause/resume_delay_jobs."""

from __future__ import annotations

import io
import json
import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

import delayjobs
from delayjobs.api import stats
from delayjobs.core import display
from delayjobs.management.commands import prune_delay_jobs
from delayjobs.models import (
    AttemptOutcome,
    Consumer,
    DelayedJob,
    JobAttempt,
    JobStatus,
    Pause,
    Schedule,
)
from delayjobs.recurring.definitions import tick_key
from tests.integration.test_stats import attempt, build_known, make_job, pinned  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def run(command: str, *args: str, stderr: io.StringIO | None = None, **options: Any) -> str:
    """``manage.py command *args``; what it wrote to stdout."""
    out = io.StringIO()
    call_command(command, *args, stdout=out, stderr=stderr or io.StringIO(), **options)
    return out.getvalue()


# delayjobs_status -------------------------------------------------------------------------


def consumer_rows() -> list[tuple[str, str, int, datetime]]:
    return list(Consumer.objects.values_list("worker_id", "hostname", "pid", "last_seen"))


def test_status_reports_the_figures_for_people(pinned):  # noqa: F811
    known = build_known(pinned)

    lines = run("delayjobs_status").splitlines()

    assert (
        "Jobs: 11 scheduled · 3 running · 2 succeeded · 1 failed · 1 cancelled · 0 skipped"
        " · 0 expired" in lines
    )
    assert (
        "  job type        scheduled  running  succeeded  failed  cancelled  skipped  expired"
        in lines
    )
    assert (
        "  tests.noop              1        0          1       0          0        0        0"
        in lines
    )
    assert any(line.startswith("Paused: queue paused-q (since ") for line in lines)
    overdue = known.overdue
    assert (
        f"Oldest overdue job: #{overdue.pk} tests.scripted (queue default), due "
        f"{display.format_time(overdue.run_at)}, 10 min late"
    ) in lines
    busiest = stats.format_clock(pinned.replace(second=0, microsecond=0) + timedelta(minutes=59))
    assert f"Due in the next hour: 7 jobs; busiest minute {busiest} with 3" in lines
    assert (
        "Failed attempts in the last 24 h: 4 (failed 1 · retrying 1 · timed_out 1 · "
        "lease_expired 1)"
    ) in lines
    assert any(line.endswith("failed at " + _at(pinned, 70) + ": Boom failed") for line in lines)
    assert (
        "Lateness, last hour (100 attempts): p50 50 ms · p95 95 ms · p99 99 ms · max 100 ms"
    ) in lines
    # A row no test of this one's wrote (a consumer another test left running) is named.
    assert "Live consumers: 2" in lines, consumer_rows()
    assert any(line.startswith("  w-live on host-a (pid 1234), queues default") for line in lines)
    running = known.running_live[0]
    assert (
        f"    #{running.pk} tests.scripted since {display.format_time(running.claimed_at)}" in lines
    )
    assert f"  #{known.running_dead.pk} tests.scripted on w-dead" in lines


def _at(now: datetime, minutes_ago: int) -> str:
    """When build_known's failed attempt started ``minutes_ago`` minutes ago finished."""
    return display.format_time(now - timedelta(minutes=minutes_ago, microseconds=-5000))


def test_status_json_has_the_same_figures(pinned):  # noqa: F811
    build_known(pinned)

    data = json.loads(run("delayjobs_status", "--json"))

    assert data == json.loads(json.dumps(stats.collect(pinned).as_dict()))
    assert data["by_status"]["scheduled"] == 11
    assert data["due_next_hour"] == 7


def test_status_of_an_empty_database():
    lines = run("delayjobs_status").splitlines()
    assert (
        "Jobs: 0 scheduled · 0 running · 0 succeeded · 0 failed · 0 cancelled · 0 skipped"
        " · 0 expired" in lines
    )
    assert "Oldest overdue job: none" in lines
    assert "Paused: nothing" in lines
    assert "Due in the next hour: 0 jobs" in lines
    assert "Live consumers: 0" in lines, consumer_rows()
    assert json.loads(run("delayjobs_status", json=True))["oldest_overdue"] is None


def test_status_refuses_a_json_option_that_is_not_a_flag():
    with pytest.raises(CommandError, match=r"--json is a flag"):
        run("delayjobs_status", json="yes")


# prune_delay_jobs -------------------------------------------------------------------------


def finished(status: str, age: timedelta, attempts: int = 1) -> DelayedJob:
    """A job that finished ``age`` ago, with ``attempts`` attempt rows."""
    now = timezone.now()
    job = make_job(status, run_at=now - age, finished_at=now - age)
    for _ in range(attempts):
        attempt(job, AttemptOutcome.SUCCEEDED, started_at=now - age)
    return job


OLD = timedelta(days=15)


def remaining() -> set[int]:
    return set(DelayedJob.objects.values_list("pk", flat=True))


def test_prune_deletes_only_old_finished_jobs_and_their_attempts():
    old = {
        finished(JobStatus.SUCCEEDED, OLD, attempts=2).pk,
        finished(JobStatus.FAILED, OLD, attempts=3).pk,
        finished(JobStatus.CANCELLED, OLD, attempts=0).pk,
    }
    recent = finished(JobStatus.SUCCEEDED, timedelta(days=13)).pk
    # Active jobs whose finished_at is old (a job retried after it finished): never pruned.
    running = finished(JobStatus.RUNNING, OLD).pk
    scheduled = finished(JobStatus.SCHEDULED, OLD).pk

    out = run("prune_delay_jobs", "--older-than", "14d")

    assert remaining() == {recent, running, scheduled}
    assert not JobAttempt.objects.filter(job_id__in=old).exists()
    assert JobAttempt.objects.count() == 3
    assert out.startswith("Deleted 3 jobs and their 5 attempts, finished before ")
    assert out.rstrip().endswith("(cancelled, expired, failed, skipped, succeeded), in 1 batches.")


def test_prune_deletes_only_the_given_statuses():
    succeeded = finished(JobStatus.SUCCEEDED, OLD).pk
    failed = finished(JobStatus.FAILED, OLD).pk
    cancelled = finished(JobStatus.CANCELLED, OLD).pk

    run("prune_delay_jobs", "--older-than", "14d", "--status", "succeeded", "--status", "failed")
    assert remaining() == {cancelled}
    assert succeeded not in remaining() and failed not in remaining()


@pytest.mark.parametrize(("older_than", "kept"), [("90s", 1), ("30m", 2), ("12h", 3), ("3d", 4)])
def test_prune_reads_each_unit(older_than, kept):
    ages = [timedelta(seconds=30), timedelta(minutes=10), timedelta(hours=1), timedelta(days=1)]
    ages.append(timedelta(days=10))
    jobs = [finished(JobStatus.SUCCEEDED, age).pk for age in ages]  # youngest first
    run("prune_delay_jobs", "--older-than", older_than)
    assert remaining() == set(jobs[:kept])


def test_dry_run_counts_and_deletes_nothing():
    for status in (JobStatus.SUCCEEDED, JobStatus.SUCCEEDED, JobStatus.FAILED):
        finished(status, OLD, attempts=2)
    finished(JobStatus.SUCCEEDED, timedelta(days=1))
    before = remaining()

    out = run("prune_delay_jobs", "--older-than", "14d", "--dry-run")

    assert remaining() == before
    assert JobAttempt.objects.count() == 7
    assert out.startswith(
        "Would delete 3 jobs (cancelled 0, expired 0, failed 1, skipped 0, succeeded 2) "
        "finished before "
    )
    assert out.rstrip().endswith("and their 6 attempts. Nothing was deleted (--dry-run).")


def test_prune_deletes_in_batches_with_a_progress_line():
    for _ in range(5):
        finished(JobStatus.SUCCEEDED, OLD)
    keep = finished(JobStatus.SUCCEEDED, timedelta(days=1)).pk
    progress = io.StringIO()

    out = run("prune_delay_jobs", "--older-than", "14d", "--batch-size", "2", stderr=progress)

    assert remaining() == {keep}
    assert "in 3 batches." in out
    assert progress.getvalue().splitlines() == [
        "Deleted 2/5 jobs (40%).",
        "Deleted 4/5 jobs (80%).",
        "Deleted 5/5 jobs (100%).",
    ]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_prune_draws_a_progress_bar_on_a_terminal():
    for _ in range(4):
        finished(JobStatus.CANCELLED, OLD)
    terminal = Terminal()

    run("prune_delay_jobs", "--older-than", "14d", "--batch-size", "3", stderr=terminal)

    redraws = terminal.getvalue().split("\r")
    assert redraws[0] == ""
    assert redraws[1] == f"[{'#' * 22}{'-' * 8}]  75% 3/4"
    assert redraws[2] == f"[{'#' * 30}] 100% 4/4\n"


def test_prune_is_quiet_at_verbosity_0():
    finished(JobStatus.SUCCEEDED, OLD)
    progress = io.StringIO()
    assert run("prune_delay_jobs", "--older-than", "14d", verbosity=0, stderr=progress) == ""
    assert progress.getvalue() == ""
    assert remaining() == set()


def test_a_job_retried_while_the_prune_runs_is_kept(monkeypatch):
    jobs = [finished(JobStatus.FAILED, OLD, attempts=2) for _ in range(3)]
    real_delete_batch = prune_delay_jobs.delete_batch

    def retry_first(doomed: Any) -> tuple[int, int]:
        # Someone retries a job after the command read its page of ids, before the
        # batch is deleted: the delete's own conditions must keep it, with its history.
        delayjobs.retry(DelayedJob.objects.get(pk=jobs[0].pk))
        return real_delete_batch(doomed)

    monkeypatch.setattr(prune_delay_jobs, "delete_batch", retry_first)
    out = run("prune_delay_jobs", "--older-than", "14d")

    assert remaining() == {jobs[0].pk}
    assert DelayedJob.objects.get(pk=jobs[0].pk).status == JobStatus.SCHEDULED
    assert JobAttempt.objects.filter(job=jobs[0]).count() == 2
    assert out.startswith("Deleted 2 jobs and their 4 attempts")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "the following arguments are required: --older-than"),
        (["--older-than", "14"], "use a whole number and a unit (s, m, h or d)"),
        (["--older-than", "14w"], "use a whole number and a unit"),
        (["--older-than", "1.5d"], "use a whole number and a unit"),
        (["--older-than=-1d"], "use a whole number and a unit"),
        (["--older-than", "14 d"], "use a whole number and a unit"),
        (["--older-than", "0s"], "must be more than 0 and at most 36500d, got '0s'"),
        (["--older-than", "36501d"], "must be more than 0 and at most 36500d"),
        (["--older-than", "1d", "--status", "running"], "running jobs are active"),
        (["--older-than", "1d", "--status", "scheduled"], "scheduled jobs are active"),
        (
            ["--older-than", "1d", "--status", "done"],
            "use succeeded, failed, cancelled, skipped, expired, got 'done'",
        ),
        (["--older-than", "1d", "--batch-size", "0"], "must be 1 to 100000, got 0"),
        (["--older-than", "1d", "--batch-size", "many"], "must be a whole number"),
    ],
)
def test_prune_refuses_bad_options(args, says):
    job = finished(JobStatus.SUCCEEDED, OLD)
    with pytest.raises(CommandError, match=re.escape(says)):
        run("prune_delay_jobs", *args)
    assert remaining() == {job.pk}


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"statuses": ["succeeded", "running"]}, "--status: running jobs are active"),
        ({"statuses": "failed"}, "--status: give a list of statuses"),
        ({"statuses": []}, "--status: give a list of statuses"),
        ({"batch_size": 0}, "--batch-size: must be 1 to 100000"),
        ({"batch_size": True}, "--batch-size: must be a whole number"),
        ({"dry_run": "no"}, "--dry-run is a flag"),
    ],
)
def test_prune_refuses_bad_options_from_call_command(options, says):
    job = finished(JobStatus.SUCCEEDED, OLD)
    with pytest.raises(CommandError, match=re.escape(says)):
        run("prune_delay_jobs", older_than="1d", **options)
    assert remaining() == {job.pk}


@pytest.mark.parametrize("older_than", ["1d", "24h"])
def test_prune_from_call_command_takes_its_age_as_text(older_than):
    # call_command checks a required option but hands it to handle() as given, unparsed.
    finished(JobStatus.SUCCEEDED, OLD)  # pruned
    recent = finished(JobStatus.SUCCEEDED, timedelta(minutes=5))
    run("prune_delay_jobs", older_than=older_than)
    assert remaining() == {recent.pk}


@pytest.mark.parametrize("older_than", ["0d", "-1d", 5, timedelta(days=1)])
def test_prune_from_call_command_refuses_an_age_that_is_not_one(older_than):
    job = finished(JobStatus.SUCCEEDED, OLD)
    with pytest.raises(CommandError, match="older-than"):
        run("prune_delay_jobs", older_than=older_than)
    assert remaining() == {job.pk}


# pause_delay_jobs, resume_delay_jobs ------------------------------------------------------


def paused_targets() -> list[tuple[str, str, str]]:
    return list(Pause.objects.order_by("kind", "name").values_list("kind", "name", "paused_by"))


def test_pause_and_resume_a_queue():
    assert run("pause_delay_jobs", "--queue", "sms").startswith("Paused queue sms: ")
    assert paused_targets() == [("queue", "sms", "manage.py")]
    assert run("pause_delay_jobs", "--queue", "sms") == (
        "Queue sms was already paused: nothing changed.\n"
    )

    assert run("resume_delay_jobs", "--queue", "sms").startswith("Resumed queue sms: ")
    assert paused_targets() == []
    assert (
        run("resume_delay_jobs", "--queue", "sms") == "Queue sms was not paused: nothing changed.\n"
    )


def test_pause_and_resume_a_job_type():
    assert run("pause_delay_jobs", "--job-type", "tests.noop").startswith(
        "Paused job type tests.noop: "
    )
    assert paused_targets() == [("job_type", "tests.noop", "manage.py")]
    assert run("resume_delay_jobs", job_type="tests.noop").startswith("Resumed job type tests.noop")
    assert paused_targets() == []


@pytest.mark.parametrize("command", ["pause_delay_jobs", "resume_delay_jobs"])
@pytest.mark.parametrize(
    ("args", "options", "says"),
    [
        ([], {}, "one of the arguments --queue --job-type --schedule is required"),
        (["--queue", "a", "--job-type", "tests.noop"], {}, "not allowed with argument"),
        (["--queue", "a b"], {}, "use 1-100 characters of letters, digits and '_.-'"),
        ([], {"queue": "a", "job_type": "tests.noop"}, "not allowed with argument"),
        ([], {"job_type": 7}, "--job-type: give a job type's name, got 7"),
    ],
)
def test_pause_and_resume_refuse_bad_targets(command, args, options, says):
    Pause.objects.create(kind="queue", name="a", paused_by="someone")
    with pytest.raises(CommandError, match=re.escape(says)):
        run(command, *args, **options)
    assert paused_targets() == [("queue", "a", "someone")]


def test_pause_and_resume_a_schedule():
    start = timezone.now()
    Schedule.objects.create(
        name="reports", job_type="tests.noop", interval=timedelta(hours=1), materialised_until=start
    )
    coming = delayjobs.schedule(
        "tests.noop", run_at=start + timedelta(hours=1), key=tick_key("reports", start)
    )
    assert run("pause_delay_jobs", "--schedule", "reports").startswith("Paused schedule reports: ")
    paused = Schedule.objects.get(name="reports")
    assert (paused.enabled, paused.paused_by) == (False, "manage.py")
    coming.refresh_from_db()
    assert coming.status == JobStatus.CANCELLED
    assert run("pause_delay_jobs", "--schedule", "reports") == (
        "Schedule reports was already paused: nothing changed.\n"
    )
    assert run("resume_delay_jobs", schedule="reports").startswith("Resumed schedule reports: ")
    resumed = Schedule.objects.get(name="reports")
    assert resumed.enabled
    assert resumed.materialised_until is not None and resumed.materialised_until > start
    with pytest.raises(
        CommandError, match=re.escape("No schedule named 'nope'. Schedules: reports.")
    ):
        run("resume_delay_jobs", "--schedule", "nope")


def test_only_a_registered_job_type_can_be_paused_but_any_can_be_resumed():
    with pytest.raises(CommandError, match=re.escape("Unknown job type 'nope'")):
        run("pause_delay_jobs", "--job-type", "nope")
    # A job type removed by a deploy, paused before: its pause can still be lifted.
    Pause.objects.create(kind="job_type", name="gone.type", paused_by="someone")
    assert run("resume_delay_jobs", "--job-type", "gone.type").startswith(
        "Resumed job type gone.type"
    )
    assert paused_targets() == []
