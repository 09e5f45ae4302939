"""The control rows: pauses, the consumers' presence and the HTTP API's keys.

They steer the engine but are not jobs; ``delayjobs.models.jobs`` holds the job rows.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from delayjobs.models.jobs import WriteDatabaseManager


class PauseKind(models.TextChoices):
    QUEUE = "queue", _("queue")
    JOB_TYPE = "job_type", _("job type")


class Pause(models.Model):
    """A queue or a job type whose jobs no consumer claims until it is resumed.

    Paused jobs stay scheduled (and visibly paused in the admin); consumers learn of a
    pause or a resume within moments, without a restart (``delayjobs.pauses``).
    """

    kind = models.CharField(_("kind"), max_length=16, choices=PauseKind.choices)
    name = models.CharField(_("name"), max_length=200)
    paused_at = models.DateTimeField(_("paused at"), default=timezone.now)
    paused_by = models.CharField(_("paused by"), max_length=150, blank=True, default="")

    objects = WriteDatabaseManager()

    class Meta:
        verbose_name = _("pause")
        verbose_name_plural = _("pauses")
        ordering = ["kind", "name"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "name"], name="delayjobs_one_pause_per_target")
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.name} (paused)"


class Consumer(models.Model):
    """A running consumer process, as its heartbeat last reported it.

    Written when it starts, on every heartbeat, and deleted when it stops cleanly; a
    consumer whose heartbeat is old has died (its running jobs come back after their
    lease).
    """

    worker_id = models.CharField(_("worker"), max_length=255, unique=True)
    hostname = models.CharField(_("host"), max_length=255)
    pid = models.PositiveIntegerField(_("process id"))
    queues = models.JSONField(_("queues"), default=list)
    concurrency = models.PositiveIntegerField(_("concurrency"))
    started_at = models.DateTimeField(_("started at"), default=timezone.now)
    last_seen = models.DateTimeField(_("last heartbeat"), default=timezone.now)
    processed = models.PositiveBigIntegerField(_("jobs processed"), default=0)
    database_mode = models.BooleanField(
        _("Redis-down mode"), default=False, help_text=_("Claiming from the database.")
    )
    clock_offset = models.FloatField(
        _("clock offset (s)"),
        null=True,
        blank=True,
        help_text=_(
            "How far the host's clock is behind the database server's, in seconds "
            "(negative: ahead). Due times and leases use the server's clock either way."
        ),
    )

    objects = WriteDatabaseManager()

    class Meta:
        verbose_name = _("consumer")
        verbose_name_plural = _("consumers")
        ordering = ["worker_id"]

    def __str__(self) -> str:
        return self.worker_id


class ApiKey(models.Model):
    """A key another service sends to the HTTP API (``delayjobs.http``) as its user.

    Only a SHA-256 digest of the secret is stored; the key itself is shown once, when
    it is created. Requests made with it have exactly the permissions of ``user``.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name=_("user"),
    )
    name = models.CharField(_("name"), max_length=100, help_text=_("Who uses it, for what."))
    prefix = models.CharField(
        _("prefix"), max_length=16, unique=True, help_text=_("Public part that finds the key.")
    )
    digest = models.CharField(_("digest"), max_length=64)
    is_active = models.BooleanField(_("active"), default=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    last_used_at = models.DateTimeField(_("last used at"), null=True, blank=True)
    job_types = models.JSONField(
        _("job types"),
        default=list,
        blank=True,
        help_text=_(
            "Names of job types this key may schedule besides the public ones, "
            'as a JSON list: ["reminders.send"].'
        ),
    )

    class Meta:
        verbose_name = _("API key")
        verbose_name_plural = _("API keys")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
