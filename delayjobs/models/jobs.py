"""The job row (the truth about a job) and its attempt history.

State changes are not made here: ``delayjobs.transitions`` owns every one of them.
"""

from __future__ import annotations

import functools
import os
from datetime import datetime, timedelta
from typing import Any

from django.contrib.contenttypes.fields import GenericForeignKey
from django.contrib.contenttypes.models import ContentType
from django.db import models, router
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from delayjobs.names import NAME_MAX_LENGTH, QUEUE_MAX_LENGTH

#: The longest stored limit key (group, "/", key); ``delayjobs.limits`` refuses longer.
LIMIT_KEY_MAX_LENGTH = 255


class JobStatus(models.TextChoices):
    SCHEDULED = "scheduled", _("scheduled")
    RUNNING = "running", _("running")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")
    #: ``JobType.should_run(job)`` said no just before execution (an order already paid).
    SKIPPED = "skipped", _("skipped")
    #: It could only have started later than its ``max_lateness`` allows, so it did not run.
    EXPIRED = "expired", _("expired")


#: Statuses a job never leaves by itself (``retry()`` aside).
FINAL_STATUSES = (
    JobStatus.SUCCEEDED,
    JobStatus.FAILED,
    JobStatus.CANCELLED,
    JobStatus.SKIPPED,
    JobStatus.EXPIRED,
)
#: A job in one of these holds its key: at most one such job per key.
ACTIVE_STATUSES = (JobStatus.SCHEDULED, JobStatus.RUNNING)
#: Statuses from which ``retry()`` runs a job again.
RETRYABLE_STATUSES = FINAL_STATUSES
#: A job's priority (higher starts first among jobs due together): the bounds the job spec
#: checks (``delayjobs.validation.check_priority``) and the table's constraint holds.
PRIORITY_MIN = -100
PRIORITY_MAX = 100


def new_trace_id() -> str:
    """128 random bits as 32 hex digits: the shape of a W3C Trace Context trace-id."""
    return os.urandom(16).hex()


class WriteDatabaseManager(models.Manager[Any]):
    """Reads go to the database that takes the writes.

    Job state decides what runs and what is cancelled: read from a lagging replica, a
    claim would fail there and a cancel would miss a job scheduled a moment ago.
    """

    def get_queryset(self) -> models.QuerySet[Any]:
        return super().get_queryset().using(self._db or router.db_for_write(self.model))


def jobs_database() -> str:
    """The alias that holds delayjobs' tables (for transactions that span several queries)."""
    return router.db_for_write(DelayedJob)


class DelayedJobQuerySet(models.QuerySet["DelayedJob"]):
    def scheduled(self) -> DelayedJobQuerySet:
        return self.filter(status=JobStatus.SCHEDULED)

    def active(self) -> DelayedJobQuerySet:
        return self.filter(status__in=ACTIVE_STATUSES)

    def due_before(self, moment: datetime) -> DelayedJobQuerySet:
        """Scheduled jobs due before ``moment``: what the pre-loader loads (partial index)."""
        return self.scheduled().filter(run_at__lt=moment)

    def lease_expired(self, now: datetime) -> DelayedJobQuerySet:
        return self.filter(status=JobStatus.RUNNING, lease_expires_at__lt=now)

    def for_object(self, obj: models.Model) -> DelayedJobQuerySet:
        """Jobs linked to ``obj`` with ``schedule(..., obj=obj)``."""
        content_type = ContentType.objects.db_manager(self.db).get_for_model(obj)
        return self.filter(content_type=content_type, object_id=str(obj.pk))

    def next_run_at(self) -> datetime | None:
        """When the earliest scheduled job among these is due (scheduled_due index)."""
        return self.scheduled().order_by("run_at").values_list("run_at", flat=True).first()


class DelayedJob(models.Model):
    job_type = models.CharField(_("job type"), max_length=NAME_MAX_LENGTH)
    queue = models.CharField(_("queue"), max_length=QUEUE_MAX_LENGTH, default="default")
    payload = models.JSONField(_("payload"), default=dict, blank=True)
    run_at = models.DateTimeField(_("run at"), help_text=_("When the job is due."))
    status = models.CharField(
        _("status"), max_length=16, choices=JobStatus.choices, default=JobStatus.SCHEDULED
    )
    attempts = models.PositiveIntegerField(
        _("attempts"), default=0, help_text=_("Executions started, counting the current one.")
    )
    max_attempts = models.PositiveIntegerField(
        _("max attempts"), null=True, blank=True, help_text=_("Empty means retry forever.")
    )
    max_lateness = models.DurationField(
        _("max lateness"),
        null=True,
        blank=True,
        help_text=_(
            "A job that could only start later than this after its run at ends expired "
            "instead of running. Empty: the job type's, or no limit."
        ),
    )
    priority = models.SmallIntegerField(
        _("priority"),
        default=0,
        help_text=_("Among jobs due together, higher runs first (-100 to 100)."),
    )
    result = models.JSONField(
        _("result"), null=True, blank=True, help_text=_("What the job's execute() returned.")
    )
    # NULL rather than "" for "no key": keyless jobs then never meet in the unique
    # constraint below, on every database.
    key = models.CharField(  # noqa: DJ001
        _("key"),
        max_length=255,
        null=True,
        blank=True,
        help_text=_("Business key: at most one scheduled or running job holds it."),
    )
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    worker_id = models.CharField(_("worker"), max_length=255, blank=True, default="")
    last_error = models.TextField(_("last error"), blank=True, default="")
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    # Two times, because a consumer claims a job up to CLAIM_AHEAD before its run_at and
    # starts it at run_at: the claim fences this run's outcome (a consumer whose claim was
    # taken over writes nothing), the start is what lateness is measured from.
    claimed_at = models.DateTimeField(
        _("claimed at"),
        null=True,
        blank=True,
        help_text=_("When a consumer claimed the current or latest run."),
    )
    started_at = models.DateTimeField(
        _("started at"),
        null=True,
        blank=True,
        help_text=_("When the latest attempt began to execute (written with its outcome)."),
    )
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    trace_id = models.CharField(_("trace id"), max_length=64, default=new_trace_id)
    # The fleet-wide limit the job counts against (its type's limit group, and the key its
    # limit_key() returned), written when it is scheduled; NULL for a type without limits,
    # whose claim then does no work for limits (delayjobs.transitions.limiter).
    limit_key = models.CharField(  # noqa: DJ001
        _("limit key"),
        max_length=LIMIT_KEY_MAX_LENGTH,
        null=True,
        blank=True,
        help_text=_("The fleet-wide limit this job counts against: its group, and its key."),
    )
    # The W3C Trace Context of the span that scheduled (or rescheduled, retried) the job:
    # {"traceparent": ..., "tracestate": ...}. An attempt days later continues that trace
    # (delayjobs.core.tracing). NULL: scheduled untraced, or by a release without tracing.
    trace_context = models.JSONField(
        _("trace context"),
        null=True,
        blank=True,
        help_text=_("The W3C trace context of the span that scheduled the job."),
    )
    # The domain object the job is about (schedule(..., obj=instance)), if any: shown on
    # that object's admin page. A generic relation, so any model can have jobs; the
    # object may be deleted later, and its jobs' history stays.
    content_type = models.ForeignKey(
        ContentType,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("object type"),
        # The composite index below (content_type, object_id) serves lookups by type too.
        db_index=False,
    )
    object_id = models.CharField(_("object id"), max_length=64, null=True, blank=True)  # noqa: DJ001
    obj = GenericForeignKey("content_type", "object_id")

    objects = WriteDatabaseManager.from_queryset(DelayedJobQuerySet)()

    #: Not a column: how long the claim found this job due but held by its fleet-wide limit
    #: (set by the limited claim; None for a type without limits). The attempt row records
    #: it (``JobAttempt.limit_wait``); tracing may read it from the job in flight.
    limit_wait: timedelta | None = None

    class Meta:
        verbose_name = _("delayed job")
        verbose_name_plural = _("delayed jobs")
        ordering = ["-run_at", "-id"]
        # Each action that changes jobs is a right of its own, not "change".
        permissions = [
            ("retry_delayedjob", _("Can retry delayed jobs")),
            ("run_now_delayedjob", _("Can run scheduled delayed jobs now")),
            ("cancel_delayedjob", _("Can cancel scheduled delayed jobs")),
            ("reschedule_delayedjob", _("Can reschedule delayed jobs")),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["key"],
                condition=Q(status__in=["scheduled", "running"]),
                name="delayjobs_one_active_job_per_key",
                violation_error_message=_("An active job already holds this key."),
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__isnull=True) | Q(max_attempts__gte=1),
                name="delayjobs_max_attempts_positive",
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                name="delayjobs_priority_range",
            ),
        ]
        indexes = [
            # The pre-loader's query: scheduled rows in (run_at, id) order. Partial, so its
            # cost follows the window, not the table.
            models.Index(
                fields=["run_at", "id"],
                condition=Q(status="scheduled"),
                name="delayjobs_scheduled_due",
            ),
            # The lease reaper's query.
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(status="running"),
                name="delayjobs_running_lease",
            ),
            # Plain indexes, not db_index=True: on PostgreSQL that adds a second, LIKE
            # (pattern) index per column, which nothing here uses and every write pays for.
            models.Index(fields=["job_type"], name="delayjobs_job_type"),
            models.Index(fields=["queue"], name="delayjobs_queue"),
            # varchar_pattern_ops (PostgreSQL; ignored elsewhere): serves key = ... and the
            # admin's prefix search, key LIKE 'order:4%', in any collation.
            models.Index(fields=["key"], name="delayjobs_key", opclasses=["varchar_pattern_ops"]),
            models.Index(fields=["status", "-finished_at"], name="delayjobs_status_finished"),
            models.Index(fields=["content_type", "object_id"], name="delayjobs_object"),
            # The admin's job list, newest run_at first: unfiltered (and by job type or
            # queue), and by status; without them each page sorts the whole table.
            models.Index(fields=["run_at", "id"], name="delayjobs_run_at"),
            models.Index(fields=["status", "run_at", "id"], name="delayjobs_status_run_at"),
            # The limited claim counts a key's running jobs, and the admin its waiting ones:
            # only rows with a limit are in it, so types without limits pay nothing for it.
            models.Index(
                fields=["limit_key", "status"],
                condition=Q(limit_key__isnull=False),
                name="delayjobs_limit_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_type} #{self.pk} ({self.status})"

    @classmethod
    def build(cls, **values: Any) -> DelayedJob:
        """A new, unsaved job: ``DelayedJob(**values)``, but faster, for bulk scheduling.

        Positional construction skips Model.__init__'s per-keyword work; every field not
        given takes its own default, exactly as with keywords.
        """
        # The stubs know keyword construction only; positional is Django's own fast path.
        return cls(
            *[  # type: ignore[misc]
                values[name] if name in values else (default() if call else default)
                for name, default, call in _defaults()
            ]
        )

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def due_timestamp(self) -> float:
        """``run_at`` as the Redis score (seconds since the epoch)."""
        return self.run_at.timestamp()


@functools.cache
def _defaults() -> list[tuple[str, Any, bool]]:
    """Each field's attname, default and whether that default is a callable to call for
    each row (a new trace id, now...); other defaults are what ``get_default()`` returns,
    computed once."""
    defaults = []
    for field in DelayedJob._meta.concrete_fields:
        if field.has_default() and callable(field.default):
            defaults.append((field.attname, field.default, True))
        else:
            defaults.append((field.attname, field.get_default(), False))
    return defaults


class AttemptOutcome(models.TextChoices):
    SUCCEEDED = "succeeded", _("succeeded")
    RETRYING = "retrying", _("failed, will retry")
    FAILED = "failed", _("failed")
    LEASE_EXPIRED = "lease_expired", _("lease expired")
    TIMED_OUT = "timed_out", _("timed out")
    SKIPPED = "skipped", _("skipped")
    EXPIRED = "expired", _("expired")


class JobAttempt(models.Model):
    """One execution of a job: written when it ends, or by the reaper when its lease expired."""

    job = models.ForeignKey(
        DelayedJob, on_delete=models.CASCADE, related_name="history", verbose_name=_("job")
    )
    number = models.PositiveIntegerField(_("attempt"))
    worker_id = models.CharField(_("worker"), max_length=255, blank=True, default="")
    started_at = models.DateTimeField(
        _("started at"), help_text=_("When this attempt began to execute.")
    )
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    outcome = models.CharField(_("outcome"), max_length=16, choices=AttemptOutcome.choices)
    error = models.TextField(_("error"), blank=True, default="")
    traceback = models.TextField(_("traceback"), blank=True, default="")
    lateness = models.DurationField(
        _("lateness"), help_text=_("Start of this attempt minus the job's run_at.")
    )
    limit_wait = models.DurationField(
        _("limit wait"),
        null=True,
        blank=True,
        help_text=_(
            "How long the job was due but held by its type's fleet-wide limit before this "
            "attempt was admitted (part of the lateness). Empty: the type has no limit."
        ),
    )

    objects = WriteDatabaseManager()

    class Meta:
        verbose_name = _("job attempt")
        verbose_name_plural = _("job attempts")
        ordering = ["-started_at", "-id"]
        indexes = [
            models.Index(fields=["job", "-started_at"], name="delayjobs_attempt_job"),
            # The dashboard's and delayjobs_status's windows: lateness of the last hour,
            # failures of the last day; without these they would scan the whole history.
            models.Index(fields=["started_at"], name="delayjobs_attempt_started"),
            models.Index(fields=["finished_at"], name="delayjobs_attempt_finished"),
            # The dashboard's failures of the last day (delayjobs.api.stats.FAILURE_OUTCOMES):
            # only failed attempts, and the outcome in it, so counting them reads no rows.
            models.Index(
                fields=["finished_at", "outcome"],
                condition=Q(outcome__in=["failed", "retrying", "timed_out", "lease_expired"]),
                name="delayjobs_attempt_failures",
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of job {self.job_id}: {self.outcome}"


class LimitStart(models.Model):
    """Starts of jobs under a rate limit, one row per key and moment of a claim: the
    limited claim sums a key's starts in the window, on the database's clock; the
    pre-loader's passes prune those every window has left. (A row per claim, not per job:
    a claim admitting a thousand jobs of a rate that has room writes one row, and the next
    claim sums a few.) Starts a consumer reserved are a row stamped with the end of the
    time it may spend them (delayjobs.transitions.reservations)."""

    limit_key = models.CharField(_("limit key"), max_length=LIMIT_KEY_MAX_LENGTH)
    #: Seconds since the epoch on the database server's clock, as the claim read it: a
    #: number, so every database compares it the same way, at microsecond precision.
    started = models.FloatField(_("started"))
    #: How many jobs of the key started at that moment.
    count = models.PositiveIntegerField(_("count"), default=1)

    objects = WriteDatabaseManager()

    class Meta:
        verbose_name = _("limit start")
        verbose_name_plural = _("limit starts")
        indexes = [models.Index(fields=["limit_key", "started"], name="delayjobs_limit_start")]

    def __str__(self) -> str:
        return f"{self.limit_key} at {self.started}"


class LimitReservation(models.Model):
    """Slots of a key's ``global_concurrency`` that one consumer process reserved for its
    next claims, so that it claims them without the limited claim's lock and count.

    The limited claim reserves only where the limit has several times as much room left,
    and counts a live reservation's slots as in use, on top of the key's running rows
    (those claimed in it among them): the count is never below what runs. A reservation
    lives until ``until``; its consumer stops using it long before, so it ends with no
    operator action when that consumer dies. (Starts a rate reserves are ``LimitStart``
    rows counted ahead: see delayjobs.transitions.reservations.)"""

    limit_key = models.CharField(_("limit key"), max_length=LIMIT_KEY_MAX_LENGTH)
    #: The consumer process that holds it: a random id of its own (two processes started
    #: with one worker id never share a reservation).
    holder = models.CharField(_("holder"), max_length=64)
    worker_id = models.CharField(_("worker"), max_length=255, blank=True, default="")
    slots = models.PositiveIntegerField(_("slots"))
    #: Seconds since the epoch on the database server's clock, as ``LimitStart.started``.
    until = models.FloatField(_("until"))

    objects = WriteDatabaseManager()

    class Meta:
        verbose_name = _("limit reservation")
        verbose_name_plural = _("limit reservations")
        constraints = [
            models.UniqueConstraint(
                fields=["limit_key", "holder"], name="delayjobs_limit_reservation_holder"
            )
        ]

    def __str__(self) -> str:
        return f"{self.slots} of {self.limit_key} for {self.worker_id or self.holder}"
