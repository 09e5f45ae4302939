"""Keep each meeting's and room request's delayed jobs in step with the row.

Every save re-derives the jobs from the row's current state: a job that is still wanted is
scheduled under its business key with ``replace=True`` (so moving a meeting moves its jobs,
and saving twice adds nothing), a job no longer wanted is cancelled by key. The writes
happen inside the model's save() transaction (see ``Meeting.save``).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone

import delayjobs
from sampleproject.meetings.delay_jobs import MEETING_JOB_TYPES, ExpireRoomRequest
from sampleproject.meetings.models import Meeting, RoomRequest

log = logging.getLogger(__name__)


@receiver(post_save, sender=Meeting, dispatch_uid="meetings.sync_meeting_jobs")
def sync_meeting_jobs(sender: type[Meeting], instance: Meeting, raw: bool, **kwargs: Any) -> None:
    if raw:  # loaddata writes rows as they are; jobs are not part of a fixture
        return
    now = timezone.now()
    for job_type in MEETING_JOB_TYPES:
        key = instance.job_key(job_type.kind)
        if not job_type.wanted(instance, now):
            delayjobs.cancel(key=key)
            continue
        try:
            delayjobs.schedule(
                job_type,
                job_type.payload(instance),
                run_at=job_type.run_at(instance),
                key=key,
                replace=True,
                obj=instance,  # shown on the meeting's admin page
            )
        except delayjobs.DuplicateJob:
            # The job is running right now and cannot be moved; it will see the meeting
            # moved and skip, and the job type's plan() schedules the new time.
            log.info(
                "Meeting %s: job %s is running; the planner takes the new time.", instance.pk, key
            )


@receiver(post_delete, sender=Meeting, dispatch_uid="meetings.cancel_meeting_jobs")
def cancel_meeting_jobs(sender: type[Meeting], instance: Meeting, **kwargs: Any) -> None:
    for job_type in MEETING_JOB_TYPES:
        delayjobs.cancel(key=instance.job_key(job_type.kind))


@receiver(post_save, sender=RoomRequest, dispatch_uid="meetings.sync_room_request_job")
def sync_room_request_job(
    sender: type[RoomRequest], instance: RoomRequest, raw: bool, **kwargs: Any
) -> None:
    if raw:
        return
    # Decided in the admin rather than by approve(): the expire job must go too.
    if instance.status != RoomRequest.Status.PENDING:
        delayjobs.cancel(key=instance.expire_job_key)
        return
    delayjobs.schedule(
        ExpireRoomRequest,
        {"room_request_id": instance.pk},
        run_at=instance.expires_at,
        key=instance.expire_job_key,
        replace=True,
        obj=instance,
    )


@receiver(post_delete, sender=RoomRequest, dispatch_uid="meetings.cancel_room_request_job")
def cancel_room_request_job(
    sender: type[RoomRequest], instance: RoomRequest, **kwargs: Any
) -> None:
    delayjobs.cancel(key=instance.expire_job_key)
