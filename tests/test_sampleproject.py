"""The sample project, driven like a user would: through its views, with the test client.

Its jobs are scheduled from model signals and views, by business key. The last test runs a
real consumer subprocess and checks that meetings start, end and remind, unpaid orders
close and unapproved room requests are rejected, while paid and approved ones are left alone.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import redis
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from delayjobs.models import DelayedJob, JobStatus
from delayjobs.redis_store import RedisStore
from sampleproject.meetings.models import Attendee, Meeting, Reminder, Room, RoomRequest
from sampleproject.orders.models import Order
from tests.conftest import ConsumerFactory, ConsumerProcess
from tests.utils import wait_for, wait_listening

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ("remind", "start", "end")


@pytest.fixture
def room() -> Room:
    return Room.objects.create(name="Ada")


def create_meeting(
    client: Client,
    room: Room,
    starts_at: datetime,
    ends_at: datetime,
    remind_minutes: float = 15,
    attendees: str = "Grace <grace@example.com>, alan@example.com",
    title: str = "Planning",
) -> Meeting:
    before = set(Meeting.objects.values_list("pk", flat=True))
    response = client.post(
        reverse("meetings:create"),
        {
            "title": title,
            "room": room.pk,
            "starts_at": starts_at.isoformat(),
            "ends_at": ends_at.isoformat(),
            "remind_minutes": remind_minutes,
            "attendees": attendees,
        },
    )
    assert response.status_code == 302, response.content.decode()
    (meeting,) = Meeting.objects.exclude(pk__in=before)
    return meeting


def meeting_jobs(meeting: Meeting) -> dict[str, DelayedJob]:
    """The meeting's jobs by kind (the latest job holding each key)."""
    jobs = {}
    for kind in KINDS:
        job = DelayedJob.objects.filter(key=meeting.job_key(kind)).order_by("-pk").first()
        if job is not None:
            jobs[kind] = job
    return jobs


def place_order(client: Client, customer: str, total: str = "12.50") -> Order:
    before = set(Order.objects.values_list("pk", flat=True))
    response = client.post(reverse("orders:place"), {"customer": customer, "total": total})
    assert response.status_code == 302, response.content.decode()
    (order,) = Order.objects.exclude(pk__in=before)
    return order


def close_job(order: Order) -> DelayedJob:
    return DelayedJob.objects.get(key=order.close_job_key)


def indexed(redis_client: redis.Redis, queue: str = "default") -> dict[int, float]:
    return RedisStore(redis_client).members(queue)


# Meetings ----------------------------------------------------------------------------------


def test_creating_a_meeting_schedules_its_three_jobs(client: Client, room: Room) -> None:
    starts_at = timezone.now().replace(microsecond=0) + timedelta(days=2)
    ends_at = starts_at + timedelta(hours=1)
    meeting = create_meeting(client, room, starts_at, ends_at, remind_minutes=15)

    assert meeting.starts_at == starts_at
    assert meeting.status == Meeting.Status.SCHEDULED
    assert set(meeting.attendees.values_list("email", flat=True)) == {
        "grace@example.com",
        "alan@example.com",
    }
    jobs = meeting_jobs(meeting)
    assert {kind: job.job_type for kind, job in jobs.items()} == {
        "remind": "meetings.remind",
        "start": "meetings.start",
        "end": "meetings.end",
    }
    assert jobs["remind"].run_at == starts_at - timedelta(minutes=15)
    assert jobs["start"].run_at == starts_at
    assert jobs["end"].run_at == ends_at
    for job in jobs.values():
        assert job.status == JobStatus.SCHEDULED
        assert job.payload["meeting_id"] == meeting.pk


def test_an_invalid_meeting_schedules_nothing(client: Client, room: Room) -> None:
    starts_at = timezone.now() + timedelta(days=1)
    response = client.post(
        reverse("meetings:create"),
        {
            "title": "Backwards",
            "room": room.pk,
            "starts_at": starts_at.isoformat(),
            "ends_at": (starts_at - timedelta(hours=1)).isoformat(),
            "remind_minutes": 15,
        },
    )
    assert response.status_code == 400
    assert not Meeting.objects.exists()
    assert not DelayedJob.objects.exists()


def test_moving_a_meeting_moves_its_jobs(client: Client, room: Room) -> None:
    starts_at = timezone.now().replace(microsecond=0) + timedelta(days=2)
    meeting = create_meeting(client, room, starts_at, starts_at + timedelta(hours=1))
    before = meeting_jobs(meeting)

    response = client.post(reverse("meetings:move", args=[meeting.pk]), {"minutes": 90})
    assert response.status_code == 302

    after = meeting_jobs(meeting)
    # The same rows, at new times: moved by key, not cancelled and scheduled again.
    assert {kind: job.pk for kind, job in after.items()} == {
        kind: job.pk for kind, job in before.items()
    }
    assert DelayedJob.objects.count() == 3
    new_start = starts_at + timedelta(minutes=90)
    assert after["remind"].run_at == new_start - timedelta(minutes=15)
    assert after["start"].run_at == new_start
    assert after["end"].run_at == new_start + timedelta(hours=1)
    assert after["start"].payload["starts_at"] == new_start.isoformat()
    assert {job.status for job in after.values()} == {JobStatus.SCHEDULED}


def test_moving_a_meeting_due_soon_moves_its_redis_entries(
    client: Client, room: Room, redis_client: redis.Redis
) -> None:
    # Inside the pre-load window (5 s in tests): the jobs are handed to Redis on commit.
    starts_at = timezone.now() + timedelta(seconds=4)
    meeting = create_meeting(client, room, starts_at, starts_at + timedelta(seconds=0.5), 1 / 60)
    jobs = meeting_jobs(meeting)
    assert indexed(redis_client) == {
        job.pk: pytest.approx(job.run_at.timestamp(), abs=1e-5) for job in jobs.values()
    }

    response = client.post(reverse("meetings:move", args=[meeting.pk]), {"minutes": 60})
    assert response.status_code == 302
    # Now due beyond the window: out of Redis until a pre-loader pass brings them back.
    assert indexed(redis_client) == {}
    assert {job.pk for job in meeting_jobs(meeting).values()} == {job.pk for job in jobs.values()}


def test_a_meeting_moved_while_its_job_runs_gets_its_job_from_the_planner(
    client: Client, room: Room
) -> None:
    """A running job cannot be moved: the save succeeds anyway, and once that job is done,
    the pre-loader's plan() hook schedules the job for the meeting's new time."""
    from delayjobs.preloader import preload

    starts_at = timezone.now() + timedelta(seconds=20)
    meeting = create_meeting(client, room, starts_at, starts_at + timedelta(minutes=30))
    start_job = meeting_jobs(meeting)["start"]
    DelayedJob.objects.filter(pk=start_job.pk).update(status=JobStatus.RUNNING)

    response = client.post(reverse("meetings:move", args=[meeting.pk]), {"minutes": 1})
    assert response.status_code == 302
    meeting.refresh_from_db()
    new_start = meeting.starts_at
    assert DelayedJob.objects.get(pk=start_job.pk).run_at == starts_at  # still the old time

    # The running job sees the meeting moved, skips, and ends.
    DelayedJob.objects.filter(pk=start_job.pk).update(status=JobStatus.SUCCEEDED)
    pass_time = new_start - timedelta(seconds=1)  # the new start is inside this pass's window
    result = preload(now=pass_time)
    assert result.ran and not result.errors
    replacement = DelayedJob.objects.get(key=meeting.job_key("start"), status=JobStatus.SCHEDULED)
    assert replacement.pk != start_job.pk
    assert replacement.run_at == new_start
    assert preload(now=pass_time).planned == 0  # planning again adds nothing


def test_moving_a_meeting_that_is_not_scheduled_is_refused(client: Client, room: Room) -> None:
    starts_at = timezone.now() + timedelta(days=2)
    meeting = create_meeting(client, room, starts_at, starts_at + timedelta(hours=1))
    Meeting.objects.filter(pk=meeting.pk).update(status=Meeting.Status.IN_PROGRESS)
    run_ats = {kind: job.run_at for kind, job in meeting_jobs(meeting).items()}

    response = client.post(reverse("meetings:move", args=[meeting.pk]), {"minutes": 30})
    assert response.status_code == 302
    assert {kind: job.run_at for kind, job in meeting_jobs(meeting).items()} == run_ats


def test_cancelling_a_meeting_cancels_its_jobs(
    client: Client, room: Room, redis_client: redis.Redis
) -> None:
    starts_at = timezone.now() + timedelta(seconds=4)
    meeting = create_meeting(client, room, starts_at, starts_at + timedelta(seconds=0.5), 1 / 60)
    assert len(indexed(redis_client)) == 3

    meeting.status = Meeting.Status.CANCELLED
    meeting.save()

    assert {job.status for job in meeting_jobs(meeting).values()} == {JobStatus.CANCELLED}
    assert len(meeting_jobs(meeting)) == 3
    assert indexed(redis_client) == {}


def test_deleting_a_meeting_in_the_admin_cancels_its_jobs(admin_client: Client, room: Room) -> None:
    starts_at = timezone.now() + timedelta(days=2)
    meeting = create_meeting(admin_client, room, starts_at, starts_at + timedelta(hours=1))
    jobs = meeting_jobs(meeting)

    response = admin_client.post(
        reverse("admin:meetings_meeting_delete", args=[meeting.pk]), {"post": "yes"}
    )
    assert response.status_code == 302
    assert not Meeting.objects.filter(pk=meeting.pk).exists()
    assert set(
        DelayedJob.objects.filter(pk__in=[job.pk for job in jobs.values()]).values_list(
            "status", flat=True
        )
    ) == {JobStatus.CANCELLED}


# Orders ------------------------------------------------------------------------------------


def test_placing_an_order_schedules_its_close_job(client: Client, settings: Any) -> None:
    settings.ORDER_PAYMENT_TIMEOUT = timedelta(minutes=30)
    before = timezone.now()
    order = place_order(client, "Ada")
    after = timezone.now()

    assert (order.status, order.total) == (Order.Status.UNPAID, Decimal("12.50"))
    job = close_job(order)
    assert job.job_type == "orders.close_unpaid"
    assert job.status == JobStatus.SCHEDULED
    assert job.payload == {"order_id": order.pk}
    assert before + timedelta(minutes=30) <= job.run_at <= after + timedelta(minutes=30)


def test_paying_an_order_cancels_its_close_job(client: Client) -> None:
    order = place_order(client, "Ada")

    response = client.post(reverse("orders:pay", args=[order.pk]))
    assert response.status_code == 302
    order.refresh_from_db()
    assert order.status == Order.Status.PAID
    assert order.paid_at is not None
    assert close_job(order).status == JobStatus.CANCELLED

    # Paying twice changes nothing.
    response = client.post(reverse("orders:pay", args=[order.pk]), follow=True)
    assert "cannot be paid" in response.content.decode()
    assert close_job(order).status == JobStatus.CANCELLED


# Room requests -----------------------------------------------------------------------------


def request_room(client: Client, room: Room, requested_by: str = "Grace") -> RoomRequest:
    starts_at = timezone.now() + timedelta(days=3)
    before = set(RoomRequest.objects.values_list("pk", flat=True))
    response = client.post(
        reverse("meetings:request_create"),
        {
            "room": room.pk,
            "requested_by": requested_by,
            "starts_at": starts_at.isoformat(),
            "ends_at": (starts_at + timedelta(hours=1)).isoformat(),
        },
    )
    assert response.status_code == 302, response.content.decode()
    (room_request,) = RoomRequest.objects.exclude(pk__in=before)
    return room_request


def test_a_room_request_schedules_its_rejection_and_approving_cancels_it(
    client: Client, room: Room, settings: Any
) -> None:
    settings.ROOM_REQUEST_TIMEOUT = timedelta(hours=24)
    room_request = request_room(client, room)

    assert room_request.status == RoomRequest.Status.PENDING
    assert room_request.expires_at == room_request.created_at + timedelta(hours=24)
    job = DelayedJob.objects.get(key=room_request.expire_job_key)
    assert (job.job_type, job.status) == ("meetings.expire_request", JobStatus.SCHEDULED)
    assert job.run_at == room_request.expires_at
    assert job.payload == {"room_request_id": room_request.pk}

    response = client.post(reverse("meetings:request_approve", args=[room_request.pk]))
    assert response.status_code == 302
    room_request.refresh_from_db()
    assert room_request.status == RoomRequest.Status.APPROVED
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED


# With a real consumer ----------------------------------------------------------------------


def wait_until(what: str, predicate: Any, consumer: ConsumerProcess) -> None:
    def check() -> bool:
        if consumer.returncode is not None:
            raise AssertionError(f"consumer exited: {consumer.returncode}\n{consumer.output()}")
        return bool(predicate())

    try:
        wait_for(check, timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}\n{consumer.output()}") from None


@pytest.mark.subprocess
def test_end_to_end_with_a_real_consumer(
    client: Client,
    room: Room,
    settings: Any,
    consumer_process: ConsumerFactory,
    redis_client: redis.Redis,
) -> None:
    consumer = consumer_process()
    wait_listening(redis_client, [consumer])

    # A meeting that starts in 2 s and ends 1 s later; its reminder is due 1.5 s before.
    starts_at = timezone.now() + timedelta(seconds=2)
    meeting = create_meeting(
        client, room, starts_at, starts_at + timedelta(seconds=1), 1.5 / 60, "grace@example.com"
    )
    attendee = Attendee.objects.get(meeting=meeting)
    assert len(meeting_jobs(meeting)) == 3

    # Orders and room requests time out after one second; the paid and the approved one are
    # due first, so their jobs would have run before the others if they had not been cancelled.
    settings.ORDER_PAYMENT_TIMEOUT = timedelta(seconds=1)
    settings.ROOM_REQUEST_TIMEOUT = timedelta(seconds=1)
    paid = place_order(client, "Paid")
    approved = request_room(client, room, "Approved")
    assert client.post(reverse("orders:pay", args=[paid.pk])).status_code == 302
    assert client.post(reverse("meetings:request_approve", args=[approved.pk])).status_code == 302
    unpaid = place_order(client, "Unpaid")
    unapproved = request_room(client, room, "Unapproved")

    keys = [
        *(meeting.job_key(kind) for kind in KINDS),
        unpaid.close_job_key,
        unapproved.expire_job_key,
    ]
    wait_until(
        "jobs not all succeeded",
        lambda: (
            DelayedJob.objects.filter(key__in=keys, status=JobStatus.SUCCEEDED).count() == len(keys)
        ),
        consumer,
    )

    meeting.refresh_from_db()
    assert meeting.status == Meeting.Status.ENDED
    reminder = Reminder.objects.get(meeting=meeting)
    assert (reminder.attendee, reminder.meeting_starts_at) == (attendee, meeting.starts_at)
    for kind, job in meeting_jobs(meeting).items():
        (attempt,) = job.history.all()
        assert attempt.started_at >= job.run_at, f"{kind} ran early"

    unpaid.refresh_from_db()
    assert unpaid.status == Order.Status.CLOSED
    assert unpaid.closed_at is not None
    paid.refresh_from_db()
    assert paid.status == Order.Status.PAID
    assert (close_job(paid).status, close_job(paid).attempts) == (JobStatus.CANCELLED, 0)

    unapproved.refresh_from_db()
    assert unapproved.status == RoomRequest.Status.REJECTED
    approved.refresh_from_db()
    assert approved.status == RoomRequest.Status.APPROVED
    approved_job = DelayedJob.objects.get(key=approved.expire_job_key)
    assert (approved_job.status, approved_job.attempts) == (JobStatus.CANCELLED, 0)
