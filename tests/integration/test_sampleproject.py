"""The sample project, driven like a user would: through its views, with the test client.

Its jobs are bound to model fields (``delayjobs.bind`` in the apps' ``delay_jobs.py``):
saving a meeting or an order schedules, moves or cancels them. The last tests run a real
consumer subprocess and check in the database that meetings remind, start and end at their
current times (never at times they were moved away from), unpaid orders close while paid
ones are left alone, and jobs whose object changed behind the bindings' back end skipped.
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

from delayjobs.index.store import RedisStore
from delayjobs.models import AttemptOutcome, DelayedJob, JobStatus
from sampleproject.meetings.delay_jobs import EndMeeting, MeetingJob, RemindAttendees, StartMeeting
from sampleproject.meetings.models import Meeting, Reminder, Room
from sampleproject.orders.delay_jobs import CloseUnpaidOrder
from sampleproject.orders.models import Order
from tests.conftest import ConsumerFactory, ConsumerProcess
from tests.utils import wait_for, wait_listening

pytestmark = pytest.mark.django_db(transaction=True)

JOB_TYPES: dict[str, type[MeetingJob]] = {
    "remind": RemindAttendees,
    "start": StartMeeting,
    "end": EndMeeting,
}
KINDS = tuple(JOB_TYPES)


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


def meeting_key(meeting: Meeting, kind: str) -> str:
    return JOB_TYPES[kind].binding.key_for(meeting)


def meeting_jobs(meeting: Meeting) -> dict[str, DelayedJob]:
    """The meeting's jobs by kind (the active job of each binding, else its latest)."""
    jobs = {}
    for kind, job_type in JOB_TYPES.items():
        job = job_type.binding.job_for(meeting)
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
    job = CloseUnpaidOrder.binding.job_for(order)
    assert job is not None, f"order {order.pk} has no close job"
    return job


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
    from delayjobs.engine.preloader import preload

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
    replacement = DelayedJob.objects.get(
        key=meeting_key(meeting, "start"), status=JobStatus.SCHEDULED
    )
    assert replacement.pk != start_job.pk
    assert replacement.run_at == new_start
    assert preload(now=pass_time).planned == 0  # planning again adds nothing


def test_renaming_a_meeting_after_its_reminder_ran_schedules_no_second_one(
    client: Client, room: Room
) -> None:
    starts_at = timezone.now() + timedelta(days=2)
    meeting = create_meeting(client, room, starts_at, starts_at + timedelta(hours=1))
    reminder = meeting_jobs(meeting)["remind"]
    DelayedJob.objects.filter(pk=reminder.pk).update(status=JobStatus.SUCCEEDED, attempts=1)

    meeting = Meeting.objects.get(pk=meeting.pk)
    meeting.title = "Planning, renamed"
    meeting.save()
    assert list(RemindAttendees.binding.jobs_for(meeting)) == [reminder]

    # Moved, though, it is reminded of its new time.
    move_meeting(client, meeting, 30)
    new_reminder = meeting_jobs(meeting)["remind"]
    assert new_reminder.pk != reminder.pk
    assert new_reminder.status == JobStatus.SCHEDULED
    assert new_reminder.run_at == meeting.starts_at - timedelta(minutes=15)


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


def move_meeting(client: Client, meeting: Meeting, minutes: int) -> None:
    response = client.post(reverse("meetings:move", args=[meeting.pk]), {"minutes": minutes})
    assert response.status_code == 302
    meeting.refresh_from_db()


def final_statuses(jobs: dict[str, DelayedJob]) -> dict[str, str]:
    return {kind: DelayedJob.objects.get(pk=job.pk).status for kind, job in jobs.items()}


def assert_ran_once_on_time(job: DelayedJob) -> None:
    """One attempt, which succeeded, and did not start before the job was due."""
    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.SUCCEEDED, 1), job
    (attempt,) = job.history.all()
    assert attempt.outcome == AttemptOutcome.SUCCEEDED
    assert attempt.started_at >= job.run_at, f"{job} ran early"


def assert_skipped(job: DelayedJob) -> None:
    """should_run() said no: the job ended skipped, its strategy never ran."""
    job.refresh_from_db()
    assert job.status == JobStatus.SKIPPED, job
    assert [attempt.outcome for attempt in job.history.all()] == [AttemptOutcome.SKIPPED]


@pytest.mark.subprocess
def test_meetings_end_to_end_with_a_real_consumer(
    client: Client, room: Room, consumer_process: ConsumerFactory, redis_client: redis.Redis
) -> None:
    """Meetings created and moved through the views: each job fires once, at the meeting's
    current time; the times a meeting was moved away from never fire."""
    consumer = consumer_process()
    wait_listening(redis_client, [consumer])
    now = timezone.now()
    lead = 1 / 60  # every reminder is due a second before its meeting starts

    # Due in 2-3.5 s, then moved an hour later: nothing may fire at the old times.
    moved_out = create_meeting(
        client,
        room,
        now + timedelta(seconds=3),
        now + timedelta(seconds=3.5),
        lead,
        title="Moved out",
    )
    move_meeting(client, moved_out, 60)

    # An hour away, then moved an hour earlier: reminded in 3 s, starts a second later
    # and ends after the old times of "Moved out" have all passed.
    moved_in = create_meeting(
        client,
        room,
        now + timedelta(hours=1, seconds=4),
        now + timedelta(hours=1, seconds=5),
        lead,
        "grace@example.com, alan@example.com",
        title="Moved in",
    )
    jobs_before = meeting_jobs(moved_in)
    move_meeting(client, moved_in, -60)
    moved_in_jobs = meeting_jobs(moved_in)
    assert {k: j.pk for k, j in moved_in_jobs.items()} == {k: j.pk for k, j in jobs_before.items()}

    # Cancelled behind the bindings' back (update() sends no signal): its jobs stay
    # scheduled, and their should_run() sees the meeting cancelled.
    cancelled = create_meeting(
        client,
        room,
        now + timedelta(seconds=3),
        now + timedelta(seconds=4),
        lead,
        title="Cancelled",
    )
    Meeting.objects.filter(pk=cancelled.pk).update(status=Meeting.Status.CANCELLED)

    cancelled_jobs = meeting_jobs(cancelled)
    watched = [*moved_in_jobs.values(), *cancelled_jobs.values()]
    wait_until(
        "meeting jobs not all finished",
        lambda: not DelayedJob.objects.filter(pk__in=[j.pk for j in watched]).active().exists(),
        consumer,
    )

    # Moved in: reminded of the new start, started, ended, each job once and on time.
    moved_in.refresh_from_db()
    assert moved_in.status == Meeting.Status.ENDED
    reminders = Reminder.objects.filter(meeting=moved_in)
    assert {r.attendee.email for r in reminders} == {"grace@example.com", "alan@example.com"}
    assert {r.meeting_starts_at for r in reminders} == {moved_in.starts_at}
    for job in moved_in_jobs.values():
        assert_ran_once_on_time(job)
    assert moved_in_jobs["start"].run_at == moved_in.starts_at

    # Cancelled: every job skipped, nothing done.
    for job in cancelled_jobs.values():
        assert_skipped(job)
    assert not Reminder.objects.filter(meeting=cancelled).exists()
    assert Meeting.objects.get(pk=cancelled.pk).status == Meeting.Status.CANCELLED

    # Moved out: its old times passed long before the moved-in meeting ended, and nothing
    # fired; its jobs wait for the new times.
    moved_out.refresh_from_db()
    assert moved_out.status == Meeting.Status.SCHEDULED
    assert not Reminder.objects.filter(meeting=moved_out).exists()
    out_jobs = meeting_jobs(moved_out)
    assert {job.status for job in out_jobs.values()} == {JobStatus.SCHEDULED}
    assert {job.attempts for job in out_jobs.values()} == {0}
    assert out_jobs["start"].run_at == moved_out.starts_at > timezone.now() + timedelta(minutes=50)
    assert consumer.returncode is None


@pytest.mark.subprocess
def test_orders_end_to_end_with_a_real_consumer(
    client: Client, settings: Any, consumer_process: ConsumerFactory, redis_client: redis.Redis
) -> None:
    """Paid orders keep their state; the others are closed by their jobs, on time."""
    consumer = consumer_process()
    wait_listening(redis_client, [consumer])
    # Orders time out after a second and a half; the paid one is placed first, so its job
    # would run first if it had not been cancelled.
    settings.ORDER_PAYMENT_TIMEOUT = timedelta(seconds=1.5)
    paid = place_order(client, "Paid")
    assert client.post(reverse("orders:pay", args=[paid.pk])).status_code == 302
    unpaid = place_order(client, "Unpaid")
    # Paid behind the binding's back (a payment provider's callback writing the row with
    # update(), say): the close job still comes due, and its should_run() says no.
    paid_elsewhere = place_order(client, "Paid elsewhere")
    Order.objects.filter(pk=paid_elsewhere.pk).update(
        status=Order.Status.PAID, paid_at=timezone.now()
    )

    watched = [close_job(unpaid), close_job(paid_elsewhere)]
    wait_until(
        "order jobs not all finished",
        lambda: not DelayedJob.objects.filter(pk__in=[j.pk for j in watched]).active().exists(),
        consumer,
    )

    unpaid.refresh_from_db()
    assert (unpaid.status, unpaid.paid_at) == (Order.Status.CLOSED, None)
    assert unpaid.closed_at is not None
    assert_ran_once_on_time(close_job(unpaid))

    paid_elsewhere.refresh_from_db()
    assert (paid_elsewhere.status, paid_elsewhere.closed_at) == (Order.Status.PAID, None)
    assert_skipped(close_job(paid_elsewhere))

    # The paid order: its job was cancelled, never attempted, though it was due first.
    paid.refresh_from_db()
    assert (paid.status, paid.closed_at) == (Order.Status.PAID, None)
    job = close_job(paid)
    assert (job.status, job.attempts) == (JobStatus.CANCELLED, 0)
    assert not job.history.exists()
    assert job.run_at < close_job(unpaid).run_at
    assert consumer.returncode is None
