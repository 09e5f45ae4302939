"""The ledger of executions that tests compare against the jobs they scheduled."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Execution(models.Model):
    """Written by the ``tests.scripted`` job type each time it starts running a job."""

    job_id = models.BigIntegerField(db_index=True)
    attempt = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=255)
    started_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} on {self.worker_id}"
