"""What ``run_delay_consumer`` checks before it claims anything, run as operators run it:
with its system checks (the other end-to-end tests pass ``--skip-checks``).

It runs delayjobs' own checks of what a consumer reads, the settings and the job types, and
not Django's whole set, which would import the project's URLconf (here the sample project's:
the admin's URLs, the HTTP API, every view) into a process that serves none of it.
"""

from __future__ import annotations

import json

import pytest

import delayjobs
from delayjobs.models import DelayedJob, JobStatus
from tests.conftest import ConsumerFactory
from tests.delay_jobs import Scripted
from tests.models import Execution

pytestmark = [pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

CHECKED = ("manage.py", "run_delay_consumer")
#: Modules only the URLconf of tests.settings (the sample project's) imports.
URLCONF_MODULES = ("sampleproject.urls", "delayjobs.http.urls", "ninja")
#: The command as manage.py runs it, in burst mode, then which of URLCONF_MODULES it loaded.
BURST_THEN_MODULES = f"""
import sys
from django.core.management import execute_from_command_line
execute_from_command_line(["manage.py", "run_delay_consumer", "--burst"])
print("loaded:", sorted(name for name in {URLCONF_MODULES!r} if name in sys.modules))
"""


def test_a_bad_setting_stops_the_consumer_before_any_job_runs(
    consumer_process: ConsumerFactory,
) -> None:
    job = delayjobs.schedule(Scripted)  # due now, in Redis
    consumer = consumer_process(
        env={"DELAYJOBS_TEST_OVERRIDES": json.dumps({"CONCURRENCY": 0})}, command=CHECKED
    )

    assert consumer.wait() == 1
    output = consumer.output()
    assert "SystemCheckError" in output
    assert "delayjobs.E007" in output
    assert "CONCURRENCY" in output
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SCHEDULED
    assert not Execution.objects.filter(job_id=job.pk).exists()


def test_the_checks_pass_without_importing_the_urlconf(consumer_process: ConsumerFactory) -> None:
    job = delayjobs.schedule(Scripted)  # due now, in Redis
    consumer = consumer_process(command=("-c", BURST_THEN_MODULES))

    assert consumer.wait() == 0, consumer.output()
    assert "loaded: []" in consumer.output()
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED
