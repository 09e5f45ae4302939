"""The schedule row: one recurring source of jobs, defined in code or by an operator.

A job type with a ``recurrence`` gets a row of its own (``source = code``), kept in step
with the code by the pre-loader: its definition is the code's, and only ``enabled`` (pause
and resume from the admin, no deploy) is the row's. An operator's schedule
(``source = database``) is defined here entirely. Either way the pre-loader turns each
tick into an ordinary ``DelayedJob`` and moves ``materialised_until`` past it in the same
transaction: that cursor is what makes one job per tick, however many pre-loaders run.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.timezone import now
from django.utils.translation import gettext_lazy as _

from delayjobs.models.jobs import WriteDatabaseManager


class ScheduleSource(models.TextChoices):
    CODE = "code", _("code")
    DATABASE = "database", _("database")


class MisfirePolicy(models.TextChoices):
    SKIP = "skip", _("skip missed ticks")
    ONCE = "once", _("run the latest missed tick once")
    ALL = "all", _("run every missed tick")


class Schedule(models.Model):
    name = models.CharField(
        _("name"),
        max_length=200,
        unique=True,
        help_text=_("Unique; a code schedule is named after its job type."),
    )
    source = models.CharField(
        _("defined in"), max_length=16, choices=ScheduleSource.choices, default="database"
    )
    job_type = models.CharField(_("job type"), max_length=200)
    payload = models.JSONField(_("payload"), default=dict, blank=True)
    cron = models.CharField(
        _("cron expression"),
        max_length=200,
        blank=True,
        default="",
        help_text=_("minute hour day month weekday, e.g. 0 8 * * MON-FRI. Or an interval."),
    )
    interval = models.DurationField(
        _("interval"),
        null=True,
        blank=True,
        help_text=_("Ticks aligned to the epoch (every 5 minutes: :00, :05 ...). Or a cron."),
    )
    timezone = models.CharField(
        _("time zone"),
        max_length=64,
        default="UTC",
        help_text=_("The wall clock a cron expression reads, e.g. Europe/Berlin."),
    )
    misfire = models.CharField(
        _("misfire"),
        max_length=8,
        choices=MisfirePolicy.choices,
        default="once",
        help_text=_("What runs of the ticks missed by more than the grace period."),
    )
    misfire_grace = models.DurationField(
        _("misfire grace"),
        null=True,
        blank=True,
        help_text=_("A tick later than this is missed. Empty: the MISFIRE_GRACE setting."),
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    materialised_until = models.DateTimeField(
        _("materialised until"),
        null=True,
        blank=True,
        help_text=_("The latest tick turned into a job (or skipped): the next is after it."),
    )
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True)
    paused_by = models.CharField(_("paused by"), max_length=150, blank=True, default="")
    created_at = models.DateTimeField(_("created at"), default=now)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    objects = WriteDatabaseManager()

    class Meta:
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")
        ordering = ["name"]
        permissions = [("pause_schedule", _("Can pause and resume schedules"))]
        constraints = [
            models.CheckConstraint(
                condition=(Q(cron="") & Q(interval__isnull=False))
                | (~Q(cron="") & Q(interval__isnull=True)),
                name="delayjobs_schedule_cron_or_interval",
                violation_error_message=_("Give either a cron expression or an interval."),
            ),
        ]

    def __str__(self) -> str:
        return self.name
