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


class Appointment(models.Model):
    """A row that tests/integration/test_bindings.py binds jobs to (``delayjobs.bind``)."""

    at = models.DateTimeField(null=True, blank=True)
    lead_minutes = models.IntegerField(default=0)
    active = models.BooleanField(default=True)
    note = models.CharField(max_length=100, blank=True, default="")
    day = models.DateField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"appointment {self.pk} at {self.at}"


class AppointmentProxy(Appointment):
    """Saved through a proxy, an appointment keeps its bound jobs in step all the same."""

    class Meta:
        proxy = True


class RoomAppointment(Appointment):
    """A child model (multi-table inheritance) of a bound model: covered by its binding,
    with the same job key as the appointment it extends."""

    room = models.CharField(max_length=50, blank=True, default="")

    def __str__(self) -> str:
        return f"room appointment {self.pk} at {self.at} in {self.room!r}"


class Coded(models.Model):
    """A model whose primary key is long text: bound job keys must still fit."""

    code = models.CharField(primary_key=True, max_length=300)
    at = models.DateTimeField()

    def __str__(self) -> str:
        return self.code


class Span(models.Model):
    """Written by the job types of tests/limit_jobs.py: when a body ran (the host's real
    clock, which on one host is also the database server's), to check limits exactly."""

    job_id = models.BigIntegerField(db_index=True)
    attempt = models.PositiveIntegerField()
    limit_key = models.CharField(max_length=255, blank=True, default="")
    started = models.FloatField()
    ended = models.FloatField(null=True)

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt}: {self.started} to {self.ended}"
