"""``delayjobs.bind``: jobs kept in step with a model field, on a real database and Redis.

The test model is ``tests.models.Appointment``; its jobs are ``tests.noop`` jobs (queue
"other"), which no consumer runs here: a job that "ran" is marked succeeded by hand.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from django.core import serializers
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, models, transaction
from django.db.models.signals import post_save, pre_save
from django.test.utils import isolate_apps
from django.utils import timezone

import delayjobs
from delayjobs.bindings import BEFORE_ATTR, SIGNALS, Binding, check_bindings
from delayjobs.index.store import RedisStore
from delayjobs.jobtypes import registry
from delayjobs.models import DelayedJob, JobStatus
from sampleproject.common import SavedWithJobs
from tests.models import Appointment, AppointmentProxy, Coded, RoomAppointment

pytestmark = pytest.mark.django_db(transaction=True)

JOB_TYPE = "tests.noop"
QUEUE = "other"  # tests.noop's queue

Bind = Callable[..., Binding]


@pytest.fixture
def bind() -> Iterator[Bind]:
    """``bind(field="at", **kwargs)``: a binding of Appointment, unbound after the test."""
    made: list[Binding] = []

    def make(field: str = "at", model: type[models.Model] = Appointment, **kwargs: Any) -> Binding:
        kwargs.setdefault("job_type", JOB_TYPE)
        binding = delayjobs.bind(model, field, **kwargs)
        made.append(binding)
        return binding

    yield make
    for binding in made:
        binding.unbind()


def soon(seconds: float = 3600) -> datetime:
    return timezone.now() + timedelta(seconds=seconds)


def jobs(binding: Binding, obj: models.Model) -> list[DelayedJob]:
    """Every job of ``obj``'s binding, oldest first."""
    return list(binding.jobs_for(obj).order_by("pk"))


def active(binding: Binding, obj: models.Model) -> DelayedJob:
    (job,) = binding.jobs_for(obj).active()
    return job


def mark_ran(job: DelayedJob) -> None:
    """As if a consumer had run the job: it succeeded, which frees its key."""
    DelayedJob.objects.filter(pk=job.pk).update(
        status=JobStatus.SUCCEEDED, attempts=1, finished_at=timezone.now()
    )


def indexed(redis_client: redis.Redis) -> dict[int, float]:
    return RedisStore(redis_client).members(QUEUE)


# Create, change, delete -----------------------------------------------------------------


def test_creating_an_object_schedules_its_job_at_field_plus_offset(bind: Bind) -> None:
    binding = bind(offset=timedelta(minutes=-15))
    at = soon()
    appointment = Appointment.objects.create(at=at)

    job = active(binding, appointment)
    assert job.key == f"tests.noop:tests.appointment:{appointment.pk}"
    assert job.key == binding.key_for(appointment)
    assert (job.job_type, job.queue, job.status) == (JOB_TYPE, QUEUE, JobStatus.SCHEDULED)
    assert job.run_at == at - timedelta(minutes=15)
    assert job.payload == {"pk": appointment.pk}
    assert list(DelayedJob.objects.for_object(appointment)) == [job]
    assert binding.job_for(appointment) == job
    assert binding.run_at_for(appointment) == job.run_at


def test_no_job_without_a_time_or_while_when_is_false(bind: Bind) -> None:
    binding = bind(when=lambda appointment: appointment.active)
    without_time = Appointment.objects.create(at=None)
    inactive = Appointment.objects.create(at=soon(), active=False)

    assert not jobs(binding, without_time)
    assert not jobs(binding, inactive)
    assert binding.run_at_for(inactive) is None


def test_changing_the_field_moves_the_same_job_in_the_database_and_redis(
    bind: Bind, redis_client: redis.Redis
) -> None:
    binding = bind()
    # Inside the pre-load window (5 s in tests): handed to Redis when the save commits.
    appointment = Appointment.objects.create(at=soon(4))
    job = active(binding, appointment)
    assert indexed(redis_client) == {job.pk: pytest.approx(job.run_at.timestamp(), abs=1e-5)}

    new_time = soon(2)
    appointment.at = new_time
    appointment.save()

    moved = active(binding, appointment)
    assert moved.pk == job.pk  # moved, not cancelled and scheduled again
    assert moved.run_at == new_time
    assert len(jobs(binding, appointment)) == 1
    assert indexed(redis_client) == {job.pk: pytest.approx(new_time.timestamp(), abs=1e-5)}

    # Moved beyond the window: out of Redis until a pre-loader pass brings it back.
    appointment.at = soon(3600)
    appointment.save()
    assert active(binding, appointment).run_at == appointment.at
    assert indexed(redis_client) == {}


def test_deleting_the_object_cancels_its_job(bind: Bind, redis_client: redis.Redis) -> None:
    binding = bind()
    appointment = Appointment.objects.create(at=soon(4))
    job = active(binding, appointment)
    assert job.pk in indexed(redis_client)

    appointment.delete()

    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert indexed(redis_client) == {}


def test_when_turning_false_cancels_and_true_again_schedules(bind: Bind) -> None:
    binding = bind(when=lambda appointment: appointment.active)
    appointment = Appointment.objects.create(at=soon())
    first = active(binding, appointment)

    appointment.active = False
    appointment.save()
    first.refresh_from_db()
    assert first.status == JobStatus.CANCELLED
    assert not binding.jobs_for(appointment).active().exists()

    appointment.active = True
    appointment.save()
    second = active(binding, appointment)
    assert second.pk != first.pk
    assert second.run_at == appointment.at


def test_the_field_becoming_empty_cancels_and_a_new_time_schedules(bind: Bind) -> None:
    binding = bind()
    appointment = Appointment.objects.create(at=soon())
    first = active(binding, appointment)

    appointment.at = None
    appointment.save()
    first.refresh_from_db()
    assert first.status == JobStatus.CANCELLED

    appointment.at = soon(7200)
    appointment.save()
    assert active(binding, appointment).run_at == appointment.at


def assert_follows_the_row(binding: Binding, model: type[Appointment]) -> None:
    """Created, moved and deleted through ``model``: the appointment's job follows."""
    appointment = model.objects.create(at=soon())
    job = active(binding, appointment)
    assert job.key == f"tests.noop:tests.appointment:{appointment.pk}"
    appointment.at = soon(7200)
    appointment.save()
    assert active(binding, appointment).run_at == appointment.at
    appointment.delete()
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED


def test_a_proxy_instance_is_covered_by_the_binding_of_its_model(bind: Bind) -> None:
    assert_follows_the_row(bind(), AppointmentProxy)


def test_a_child_model_is_covered_by_the_binding_of_its_parent(bind: Bind) -> None:
    """Multi-table inheritance: a RoomAppointment is an Appointment row plus a row of its
    own; its job has the appointment's key, whichever class it is saved through."""
    binding = bind()
    child = RoomAppointment.objects.create(at=soon(), room="A")
    job = active(binding, child)
    assert job.key == f"tests.noop:tests.appointment:{child.pk}"
    parent = Appointment.objects.get(pk=child.pk)
    assert binding.key_for(parent) == job.key

    child.at = soon(7200)
    child.save()
    assert (active(binding, child).pk, active(binding, child).run_at) == (job.pk, child.at)

    parent.refresh_from_db()
    parent.at = soon(10800)
    parent.save()
    assert active(binding, child).run_at == parent.at

    # The child's time in memory is stale now, and not saved: the job stays.
    child.room = "B"
    child.save(update_fields=["room"])
    assert active(binding, child).run_at == parent.at
    # A full save writes the stale time back: the job follows the row.
    child.save()
    assert active(binding, child).run_at == child.at == RoomAppointment.objects.get().at
    assert jobs(binding, child) == [job]

    child.delete()
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert not Appointment.objects.exists()


def test_a_subclass_declared_after_the_binding_is_covered(bind: Bind) -> None:
    """Receivers are connected per class: a subclass defined later (class_prepared) gets
    them too."""
    binding = bind()
    with isolate_apps("tests"):

        class LateProxy(Appointment):
            class Meta:
                proxy = True
                app_label = "tests"

        assert_follows_the_row(binding, LateProxy)


# Saves that change nothing the job depends on --------------------------------------------


def test_an_unrelated_save_leaves_the_job_alone(bind: Bind) -> None:
    binding = bind()
    appointment = Appointment.objects.create(at=soon())
    job = active(binding, appointment)
    DelayedJob.objects.filter(pk=job.pk).update(attempts=1)  # retrying: must stay retrying

    appointment.note = "new note"
    appointment.save()
    loaded = Appointment.objects.get(pk=appointment.pk)
    loaded.note = "newer note"
    loaded.save()

    assert jobs(binding, appointment) == [job]
    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.SCHEDULED, 1)


@pytest.mark.parametrize(
    "load",
    [
        pytest.param(lambda pk: Appointment.objects.get(pk=pk), id="loaded"),
        pytest.param(lambda pk: Appointment.objects.only("note").get(pk=pk), id="deferred"),
        pytest.param(lambda pk: Appointment.objects.all()[0], id="sliced"),
    ],
)
def test_an_unrelated_save_after_the_job_ran_schedules_nothing(
    bind: Bind, load: Callable[[int], Appointment]
) -> None:
    """The job ran, which freed its key: saving another field must not send it twice."""
    binding = bind()
    appointment = Appointment.objects.create(at=soon())
    job = active(binding, appointment)
    mark_ran(job)

    same = load(appointment.pk)
    same.note = "after the reminder"
    same.save()
    appointment.note = "the instance that created it"
    appointment.save()

    assert jobs(binding, appointment) == [job]


def test_an_instance_built_by_hand_over_an_existing_row_schedules_nothing_new(bind: Bind) -> None:
    binding = bind()
    appointment = Appointment.objects.create(at=soon())
    job = active(binding, appointment)
    mark_ran(job)

    # Never loaded: the save compares with the row it overwrites, like any save.
    Appointment(pk=appointment.pk, at=appointment.at, note="by hand").save()
    assert jobs(binding, appointment) == [job]

    Appointment(pk=appointment.pk, at=appointment.at + timedelta(hours=1)).save()
    (old, new) = jobs(binding, appointment)
    assert (old.pk, new.status) == (job.pk, JobStatus.SCHEDULED)
    assert new.run_at == appointment.at + timedelta(hours=1)


def test_a_refreshed_instance_does_not_repeat_a_change_made_elsewhere(bind: Bind) -> None:
    binding = bind()
    appointment = Appointment.objects.create(at=soon())
    job = active(binding, appointment)

    elsewhere = Appointment.objects.get(pk=appointment.pk)
    elsewhere.at = soon(7200)
    elsewhere.save()
    mark_ran(job)  # the moved job ran

    # The save compares with the row, which already has this time: no change.
    appointment.refresh_from_db()
    appointment.note = "refreshed"
    appointment.save()
    assert jobs(binding, appointment) == [job]


def test_update_fields_judge_the_row_as_saved_not_unsaved_changes_in_memory(
    bind: Bind,
) -> None:
    """``when`` and the offset are evaluated on the row as the save leaves it: the row before
    the save, with only the saved fields taken from the instance."""
    binding = bind(
        offset=lambda appointment: -timedelta(minutes=appointment.lead_minutes),
        when=lambda appointment: appointment.active,
    )
    at = soon()
    appointment = Appointment.objects.create(at=at)
    job = active(binding, appointment)

    # Changed in memory, none of it saved: the row, and so the job, stay as they are.
    appointment.at = soon(7200)
    appointment.lead_minutes = 30
    appointment.active = False
    appointment.note = "saved"
    appointment.save(update_fields=["note"])
    row = Appointment.objects.get(pk=appointment.pk)
    assert (row.at, row.lead_minutes, row.active, row.note) == (at, 0, True, "saved")
    assert active(binding, appointment) == job
    assert job.run_at == at

    # Saving the offset's field moves the job by it, from the time the row still has.
    appointment.save(update_fields=["lead_minutes"])
    moved = active(binding, appointment)
    assert (moved.pk, moved.run_at) == (job.pk, at - timedelta(minutes=30))

    # Saving ``when``'s field cancels it.
    appointment.save(update_fields=["active"])
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED


# Saves judged against the row the database holds -------------------------------------------


def test_a_full_save_from_a_stale_instance_moves_the_job_to_the_time_it_writes_back(
    bind: Bind,
) -> None:
    """Request A loaded the appointment, request B moved it, A saves a new note: A's full
    save writes A's old time back, and the job must follow the row, not A's memory."""
    binding = bind()
    at = soon()
    appointment = Appointment.objects.create(at=at)
    stale = Appointment.objects.get(pk=appointment.pk)
    elsewhere = Appointment.objects.get(pk=appointment.pk)
    elsewhere.at = soon(7200)
    elsewhere.save()
    job = active(binding, appointment)
    assert job.run_at == elsewhere.at

    stale.note = "a new note"
    stale.save()

    assert Appointment.objects.get(pk=appointment.pk).at == at
    assert active(binding, appointment).run_at == at
    assert jobs(binding, appointment) == [job]  # moved back, not a second job


def test_a_full_save_from_a_stale_instance_restores_when_and_its_job(bind: Bind) -> None:
    binding = bind(when=lambda appointment: appointment.active)
    appointment = Appointment.objects.create(at=soon())
    stale = Appointment.objects.get(pk=appointment.pk)
    elsewhere = Appointment.objects.get(pk=appointment.pk)
    elsewhere.active = False
    elsewhere.save()
    assert not binding.jobs_for(appointment).active().exists()

    stale.save()  # writes active=True back

    assert Appointment.objects.get(pk=appointment.pk).active
    assert active(binding, appointment).run_at == appointment.at


def test_a_refreshed_instance_set_back_to_its_old_time_moves_the_job_back(bind: Bind) -> None:
    binding = bind()
    at = soon()
    appointment = Appointment.objects.create(at=at)
    elsewhere = Appointment.objects.get(pk=appointment.pk)
    elsewhere.at = soon(7200)
    elsewhere.save()

    appointment.refresh_from_db()
    appointment.at = at
    appointment.save()

    assert active(binding, appointment).run_at == at


def test_a_stale_save_racing_a_move_in_another_transaction_ends_with_the_job_at_the_row(
    bind: Bind,
) -> None:
    """The move commits between the stale save's read of the row and its write, unless the
    read locks the row (in a transaction): then the stale save waits, reads the moved row,
    and moves the job back with the time it writes."""
    binding = bind()
    at = soon()
    appointment = Appointment.objects.create(at=at)
    stale = Appointment.objects.get(pk=appointment.pk)
    saved = threading.Event()

    def move_elsewhere() -> None:
        try:
            with transaction.atomic():
                mover = Appointment.objects.get(pk=appointment.pk)
                mover.at = soon(7200)
                mover.save()
                saved.set()
                time.sleep(0.5)  # holding the row: the stale save must wait for the commit
        finally:
            connection.close()

    thread = threading.Thread(target=move_elsewhere)
    thread.start()
    try:
        assert saved.wait(10)
        with transaction.atomic():
            stale.note = "a new note"
            stale.save()
    finally:
        thread.join()

    assert Appointment.objects.get(pk=appointment.pk).at == at
    assert active(binding, appointment).run_at == at


def test_each_save_reads_the_row_once_unless_depends_on_rules_it_out(
    bind: Bind, django_assert_num_queries: Any
) -> None:
    binding = bind(when=lambda appointment: appointment.active, depends_on=["active"])
    assert binding.depends_on == {"at", "active"}
    appointment = Appointment.objects.create(at=soon())
    job = active(binding, appointment)

    appointment.note = "new note"
    with django_assert_num_queries(1):  # the UPDATE: the job depends on no saved field
        appointment.save(update_fields=["note"])
    with django_assert_num_queries(2):  # the row read by pk, and the UPDATE
        appointment.save()
    with django_assert_num_queries(2):
        appointment.save(update_fields=["note", "active"])
    assert jobs(binding, appointment) == [job]

    # A full save writes every column: a stale instance is still judged against the row.
    stale = Appointment.objects.get(pk=appointment.pk)
    Appointment.objects.get(pk=appointment.pk).delete()
    assert binding.jobs_for(appointment).active().count() == 0
    stale.save()  # inserts the row again
    assert active(binding, appointment).run_at == appointment.at


def test_loading_instances_runs_no_binding_code(bind: Bind) -> None:
    """``offset`` and ``when`` run on saves only: loading many rows costs nothing more."""
    calls: list[int] = []

    def when(appointment: Appointment) -> bool:
        calls.append(appointment.pk)
        return True

    bind(when=when)
    Appointment.objects.bulk_create([Appointment(at=soon()) for _ in range(3)])
    assert len(list(Appointment.objects.all())) == 3
    assert calls == []


# Values Django accepts on save -----------------------------------------------------------------


def test_a_time_given_as_an_iso_string_gets_its_job_at_that_time(bind: Bind) -> None:
    binding = bind(offset=timedelta(minutes=-15))
    appointment = Appointment.objects.create(at="2099-01-01T10:00:00+00:00")

    job = active(binding, appointment)
    assert job.run_at == datetime(2099, 1, 1, 9, 45, tzinfo=UTC)
    # Saved again, still a string in memory: the same time as the row's, nothing to do.
    appointment.note = "new note"
    appointment.save()
    assert jobs(binding, appointment) == [job]


def test_a_naive_time_is_taken_in_the_default_time_zone_as_django_saves_it(
    bind: Bind, settings: Any
) -> None:
    settings.TIME_ZONE = "Europe/Paris"
    binding = bind()
    with pytest.warns(RuntimeWarning, match="naive datetime"):  # Django's own warning
        appointment = Appointment.objects.create(at=datetime(2099, 1, 1, 10, 0))

    expected = datetime(2099, 1, 1, 9, 0, tzinfo=UTC)  # 10:00 in Paris, in winter
    assert Appointment.objects.get(pk=appointment.pk).at == expected
    assert active(binding, appointment).run_at == expected


@pytest.mark.parametrize(
    ("at", "offset", "message"),
    [
        pytest.param(
            "next tuesday",
            timedelta(0),
            r"Binding tests\.appointment\.at->tests\.noop>: at of .* must be a date and time",
            id="not-a-time",
        ),
        pytest.param(
            datetime(9999, 12, 31, tzinfo=UTC),
            timedelta(days=1),
            r"Binding tests\.appointment\.at->tests\.noop>: at of .* out of the range",
            id="overflow",
        ),
    ],
)
def test_a_time_that_cannot_give_a_job_fails_the_save_before_the_row_is_written(
    bind: Bind, at: Any, offset: timedelta, message: str
) -> None:
    bind(offset=offset)
    with pytest.raises(delayjobs.InvalidJob, match=message):
        Appointment.objects.create(at=at)
    assert not Appointment.objects.exists()

    # The same for a change: the row keeps its time, the job its own.
    appointment = Appointment.objects.create(at=soon())
    appointment.at = at
    with pytest.raises(delayjobs.InvalidJob, match=message):
        appointment.save()
    assert Appointment.objects.get().at != at


def test_an_offset_across_the_spring_change_is_taken_on_the_utc_clock(
    bind: Bind, settings: Any
) -> None:
    """In Paris, 2030-03-31 02:00 CET is 03:00 CEST. A meeting at 03:10 CEST (01:10 UTC)
    with a reminder 15 minutes before: 00:55 UTC, not 02:55 on the wall clock (a time that
    does not exist there, taken as 01:55 UTC: after the meeting)."""
    settings.TIME_ZONE = "Europe/Paris"
    binding = bind(offset=timedelta(minutes=-15))
    at = datetime(2030, 3, 31, 3, 10, tzinfo=ZoneInfo("Europe/Paris"))
    expected = datetime(2030, 3, 31, 0, 55, tzinfo=UTC)
    appointment = Appointment.objects.create(at=at)

    assert active(binding, appointment).run_at == expected
    # The instance in memory and the row read back (in UTC) give the same time.
    loaded = Appointment.objects.get(pk=appointment.pk)
    assert loaded.at == datetime(2030, 3, 31, 1, 10, tzinfo=UTC)
    assert binding.run_at_for(appointment) == binding.run_at_for(loaded) == expected
    assert binding.sync([appointment, loaded]) == 0  # both agree with the job


def test_an_offset_from_the_second_pass_of_the_autumn_fold_is_taken_on_the_utc_clock(
    bind: Bind, settings: Any
) -> None:
    """In Paris, 2030-10-27 03:00 CEST is 02:00 CET: 02:30 happens twice. The second one
    (fold=1) is 01:30 UTC; 15 minutes before it is 01:15 UTC, not 02:15 of the first pass."""
    settings.TIME_ZONE = "Europe/Paris"
    paris = ZoneInfo("Europe/Paris")
    binding = bind(offset=timedelta(minutes=-15))
    first_pass = datetime(2030, 10, 27, 2, 30, tzinfo=paris)
    appointment = Appointment.objects.create(at=first_pass)
    job = active(binding, appointment)
    assert job.run_at == datetime(2030, 10, 27, 0, 15, tzinfo=UTC)

    # The same wall-clock time, an hour later: the job moves by that hour.
    appointment.at = first_pass.replace(fold=1)
    appointment.save()
    moved = active(binding, appointment)
    assert (moved.pk, moved.run_at) == (job.pk, datetime(2030, 10, 27, 1, 15, tzinfo=UTC))
    assert binding.run_at_for(appointment) == moved.run_at
    assert binding.sync([appointment, Appointment.objects.get(pk=appointment.pk)]) == 0


# Moves after the job ran or while it runs ---------------------------------------------------


def test_moving_after_the_job_ran_schedules_a_job_for_the_new_time(bind: Bind) -> None:
    """The rule: a changed time always gets its job; the one for the old time stays in the
    history. A meeting moved after its reminder was sent is reminded of the new time."""
    binding = bind(offset=timedelta(minutes=-15))
    appointment = Appointment.objects.create(at=soon())
    first = active(binding, appointment)
    mark_ran(first)

    appointment.at += timedelta(hours=1)
    appointment.save()

    second = active(binding, appointment)
    assert second.pk != first.pk
    assert second.run_at == appointment.at - timedelta(minutes=15)
    first.refresh_from_db()
    assert first.status == JobStatus.SUCCEEDED


def test_moving_while_the_job_runs_saves_and_leaves_the_running_job(
    bind: Bind, caplog: pytest.LogCaptureFixture
) -> None:
    binding = bind()
    at = soon()
    appointment = Appointment.objects.create(at=at)
    job = active(binding, appointment)
    DelayedJob.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)

    appointment.at = soon(7200)
    with caplog.at_level(logging.WARNING, logger="delayjobs.bindings"):
        appointment.save()

    assert Appointment.objects.get(pk=appointment.pk).at == appointment.at
    job.refresh_from_db()
    assert (job.status, job.run_at) == (JobStatus.RUNNING, at)
    assert jobs(binding, appointment) == [job]
    assert f"job {job.pk}" in caplog.text and "running" in caplog.text

    # Cancelling a running job does not interrupt it either (its should_run sees the row).
    appointment.delete()
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


# Offsets, payloads, options ------------------------------------------------------------------


def test_a_callable_offset_follows_the_fields_it_reads(bind: Bind) -> None:
    binding = bind(offset=lambda appointment: -timedelta(minutes=appointment.lead_minutes))
    appointment = Appointment.objects.create(at=soon(), lead_minutes=15)
    job = active(binding, appointment)
    assert job.run_at == appointment.at - timedelta(minutes=15)

    appointment.lead_minutes = 30  # only the offset changes: the job moves
    appointment.save()
    assert active(binding, appointment).run_at == appointment.at - timedelta(minutes=30)
    assert active(binding, appointment).pk == job.pk


def test_payload_and_schedule_options_are_passed_to_the_job(bind: Bind) -> None:
    binding = bind(
        payload=lambda appointment: {"id": appointment.pk, "note": appointment.note},
        queue="default",
        max_attempts=2,
        max_lateness=timedelta(minutes=5),
        priority=7,
    )
    appointment = Appointment.objects.create(at=soon(), note="hello")
    job = active(binding, appointment)
    assert job.payload == {"id": appointment.pk, "note": "hello"}
    assert (job.queue, job.max_attempts, job.max_lateness, job.priority) == (
        "default",
        2,
        timedelta(minutes=5),
        7,
    )


def test_an_auto_now_field_moves_its_job_at_every_save(bind: Bind) -> None:
    """``updated_at`` is set during the save, after pre_save's signal: still followed."""
    binding = bind("updated_at", offset=timedelta(days=30))
    appointment = Appointment.objects.create()
    job = active(binding, appointment)
    assert job.run_at == appointment.updated_at + timedelta(days=30)

    appointment.note = "touched"
    appointment.save()
    moved = active(binding, appointment)
    assert moved.pk == job.pk
    assert moved.run_at == appointment.updated_at + timedelta(days=30) > job.run_at


def test_long_primary_keys_get_a_hashed_key_that_fits(bind: Bind) -> None:
    binding = bind(model=Coded)
    first = Coded.objects.create(code="x" * 290 + "1", at=soon())
    second = Coded.objects.create(code="x" * 290 + "2", at=soon())

    keys = {active(binding, first).key, active(binding, second).key}
    assert len(keys) == 2
    assert all(len(key) <= 255 and key.startswith("tests.noop:tests.coded:xxx") for key in keys)
    assert binding.key_for(first) == binding.key_for(Coded.objects.get(pk=first.pk))
    # Too long to link as the job's object: the key (and the payload) find it instead.
    job = active(binding, first)
    assert job.object_id is None
    assert job.payload == {"pk": first.code}


def test_instances_stay_picklable_with_bindings_made_of_lambdas(bind: Bind) -> None:
    bind(when=lambda appointment: appointment.active)
    appointment = Appointment.objects.create(at=soon())
    copy = pickle.loads(pickle.dumps(Appointment.objects.get(pk=appointment.pk)))
    assert copy.at == appointment.at


# Transactions, fixtures, update() --------------------------------------------------------------


class Boom(Exception):
    pass


def test_a_rolled_back_save_leaves_no_job(bind: Bind, redis_client: redis.Redis) -> None:
    binding = bind()
    with pytest.raises(Boom), transaction.atomic():
        appointment = Appointment.objects.create(at=soon(2))
        assert active(binding, appointment)
        raise Boom

    assert not Appointment.objects.exists()
    assert not DelayedJob.objects.exists()
    assert indexed(redis_client) == {}


def test_a_move_rolled_back_is_made_again_by_the_next_save(bind: Bind) -> None:
    binding = bind()
    at = soon()
    appointment = Appointment.objects.create(at=at)
    new_time = soon(7200)

    with pytest.raises(Boom), transaction.atomic():
        appointment.at = new_time
        appointment.save()
        raise Boom
    assert active(binding, appointment).run_at == at  # rolled back with the row

    # The instance still holds the new time: saving it must move the job for real.
    appointment.save()
    assert active(binding, appointment).run_at == new_time


def test_saving_twice_in_one_transaction_follows_the_last_save(bind: Bind) -> None:
    binding = bind()
    at = soon()
    appointment = Appointment.objects.create(at=at)
    with transaction.atomic():
        appointment.at = soon(7200)
        appointment.save()
        appointment.at = at
        appointment.save()
    assert active(binding, appointment).run_at == at


@contextmanager
def post_save_receiver_before_the_bindings(receiver: Callable[..., None]) -> Iterator[None]:
    """``receiver`` connected to Appointment's post_save ahead of the bindings' own receiver
    (Django calls receivers in the order they were connected), as an app's receiver
    connected before ``bind()`` ran would be."""
    bindings_receiver = dict(SIGNALS)[post_save]
    uid = f"delayjobs.bindings.{bindings_receiver.__name__}"
    assert post_save.disconnect(sender=Appointment, dispatch_uid=uid)
    post_save.connect(receiver, sender=Appointment, weak=False)
    post_save.connect(bindings_receiver, sender=Appointment, dispatch_uid=uid)
    try:
        yield
    finally:
        post_save.disconnect(receiver, sender=Appointment)


def numbered(sender: Any, instance: Appointment, created: bool, **kwargs: Any) -> None:
    """The usual receiver: a new row gets a number made of its pk, saved at once."""
    if created:
        instance.note = f"ORD-{instance.pk}"
        instance.save(update_fields=["note"])


@pytest.mark.parametrize("depends_on", [None, ["active"]], ids=["every-field", "depends-on"])
def test_a_new_row_saved_again_by_an_earlier_post_save_receiver_gets_its_job(
    bind: Bind, depends_on: list[str] | None
) -> None:
    """The receiver's save runs inside the creating save, before the bindings' post_save
    for it: each save acts on what its own pre_save found."""
    binding = bind(offset=timedelta(minutes=-15), depends_on=depends_on)
    with post_save_receiver_before_the_bindings(numbered):
        appointment = Appointment.objects.create(at=soon())

    assert Appointment.objects.get(pk=appointment.pk).note == f"ORD-{appointment.pk}"
    job = active(binding, appointment)
    assert job.run_at == appointment.at - timedelta(minutes=15)
    assert BEFORE_ATTR not in appointment.__dict__  # nothing left behind


def test_a_move_saved_again_by_an_earlier_post_save_receiver_moves_the_job(bind: Bind) -> None:
    binding = bind()

    def touched(sender: Any, instance: Appointment, update_fields: Any, **kwargs: Any) -> None:
        if update_fields is None:
            instance.note = "touched"
            instance.save(update_fields=["note"])

    appointment = Appointment.objects.create(at=soon())
    job = active(binding, appointment)
    with post_save_receiver_before_the_bindings(touched):
        appointment.at = soon(7200)
        appointment.save()

    moved = active(binding, appointment)
    assert (moved.pk, moved.run_at) == (job.pk, appointment.at)
    assert Appointment.objects.get(pk=appointment.pk).note == "touched"


def test_a_nested_save_that_failed_leaves_nothing_for_the_save_around_it(bind: Bind) -> None:
    """A save that fails between its pre_save and its post_save never reaches post_save:
    what its pre_save found must not be taken for the outer save's."""
    binding = bind()

    def refuse_notes(sender: Any, update_fields: Any, **kwargs: Any) -> None:
        if update_fields == {"note"}:
            raise Boom  # after the bindings' pre_save (connected before this one)

    def try_a_note(sender: Any, instance: Appointment, update_fields: Any, **kwargs: Any) -> None:
        if update_fields is None:
            instance.note = "refused"
            with suppress(Boom):
                instance.save(update_fields=["note"])

    appointment = Appointment.objects.create(at=soon())
    job = active(binding, appointment)
    pre_save.connect(refuse_notes, sender=Appointment, weak=False)
    try:
        with post_save_receiver_before_the_bindings(try_a_note):
            appointment.at = soon(7200)
            appointment.save()
    finally:
        pre_save.disconnect(refuse_notes, sender=Appointment)

    moved = active(binding, appointment)
    assert (moved.pk, moved.run_at) == (job.pk, appointment.at)
    assert Appointment.objects.get(pk=appointment.pk).note == ""


def test_a_failed_save_leaves_nothing_for_a_later_save_to_act_on(bind: Bind) -> None:
    """The save fails after the bindings' pre_save, its change is not written; a later save
    that writes nothing the job depends on must not act on that change."""
    binding = bind(depends_on=["active"])
    at = soon()
    appointment = Appointment.objects.create(at=at)

    def refuse(sender: Any, instance: Appointment, **kwargs: Any) -> None:
        if instance.note == "refused":
            raise Boom

    pre_save.connect(refuse, sender=Appointment, weak=False)
    try:
        appointment.at = soon(7200)
        appointment.note = "refused"
        with pytest.raises(Boom):
            appointment.save()
    finally:
        pre_save.disconnect(refuse, sender=Appointment)

    appointment.note = "accepted"
    appointment.save(update_fields=["note"])  # not the time: the job stays
    assert Appointment.objects.get(pk=appointment.pk).at == at
    assert active(binding, appointment).run_at == at


def test_loaddata_raw_saves_schedule_nothing(bind: Bind) -> None:
    binding = bind()
    fixture = serializers.serialize(
        "json", [Appointment(pk=41, at=soon(), updated_at=timezone.now())]
    )
    for deserialized in serializers.deserialize("json", fixture):
        deserialized.save()  # raw=True, as loaddata does

    appointment = Appointment.objects.get(pk=41)
    assert not jobs(binding, appointment)


def test_sync_derives_jobs_for_rows_changed_by_update(bind: Bind) -> None:
    """update() sends no signals: sync() is how its changes reach the jobs."""
    binding = bind(when=lambda appointment: appointment.active)
    first = Appointment.objects.create(at=soon())
    second = Appointment.objects.create(at=soon())
    new_time = soon(7200)

    Appointment.objects.filter(pk=first.pk).update(at=new_time)
    assert active(binding, first).run_at != new_time  # not followed without sync()
    Appointment.objects.filter(pk=second.pk).update(active=False)

    assert binding.sync(Appointment.objects.all()) == 2
    assert active(binding, first).run_at == new_time
    assert not binding.jobs_for(second).active().exists()
    # Jobs already right are left as they are.
    assert binding.sync(Appointment.objects.all()) == 0
    assert len(jobs(binding, first)) == 1


def test_sync_schedules_jobs_for_rows_older_than_the_binding(bind: Bind) -> None:
    Appointment.objects.bulk_create([Appointment(at=soon()), Appointment(at=None)])
    binding = bind()
    assert not DelayedJob.objects.exists()

    assert binding.sync(list(Appointment.objects.all())) == 1
    (job,) = DelayedJob.objects.all()
    assert job.run_at == Appointment.objects.get(at__isnull=False).at


# Declarations ---------------------------------------------------------------------------------


def test_binding_the_same_again_returns_the_same_binding(bind: Bind) -> None:
    def early(appointment: Appointment) -> timedelta:
        return -timedelta(minutes=5)

    binding = bind(offset=early)
    assert delayjobs.bind(Appointment, "at", job_type=JOB_TYPE, offset=early) is binding
    with pytest.raises(ImproperlyConfigured, match=r"already bound to job type 'tests\.noop'"):
        delayjobs.bind(Appointment, "at", job_type=JOB_TYPE, offset=timedelta(0))
    # The same job type on another field of the model would share its keys: refused.
    with pytest.raises(ImproperlyConfigured, match="one binding per model and job type"):
        delayjobs.bind(Appointment, "updated_at", job_type=JOB_TYPE, offset=early)
    # Another job type is another binding, with keys of its own.
    other = bind("updated_at", job_type="tests.scripted")
    assert other is not binding
    appointment = Appointment.objects.create(at=soon())
    assert binding.key_for(appointment) != other.key_for(appointment)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((object, "at"), {}, TypeError, "expects a model class"),
        ((SavedWithJobs, "at"), {}, ImproperlyConfigured, "abstract"),
        ((AppointmentProxy, "at"), {}, ImproperlyConfigured, "proxy"),
        ((Appointment, "when"), {}, ImproperlyConfigured, "no field 'when'.*DateTimeFields: at"),
        ((Appointment, "day"), {}, ImproperlyConfigured, "must be a DateTimeField, it is a Date"),
        ((Appointment, "note"), {}, ImproperlyConfigured, "must be a DateTimeField"),
        ((Appointment, 3), {}, TypeError, "field must be a name"),
        ((Appointment, "at"), {"job_type": "no spaces allowed"}, TypeError, "job_type must"),
        ((Appointment, "at"), {"job_type": int}, TypeError, "job_type must"),
        ((Appointment, "at"), {"offset": 15}, TypeError, "offset must be a timedelta"),
        ((Appointment, "at"), {"when": True}, TypeError, "when must be a callable"),
        ((Appointment, "at"), {"payload": {}}, TypeError, "payload must be a callable"),
        ((Appointment, "at"), {"depends_on": "active"}, TypeError, "depends_on must be a list"),
        (
            (Appointment, "at"),
            {"depends_on": ["active", "nope"]},
            ImproperlyConfigured,
            "depends_on names 'nope'",
        ),
        ((Appointment, "at"), {"queue": "a b"}, ImproperlyConfigured, "queue must"),
        ((Appointment, "at"), {"max_attempts": 0}, ImproperlyConfigured, "max_attempts must"),
        ((Appointment, "at"), {"max_lateness": 5}, ImproperlyConfigured, "max_lateness must"),
        ((Appointment, "at"), {"priority": 1000}, ImproperlyConfigured, "priority must"),
    ],
)
def test_bad_declarations_are_refused_with_the_reason(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    kwargs.setdefault("job_type", JOB_TYPE)
    with pytest.raises(error, match=message):
        delayjobs.bind(*args, **kwargs)


def test_an_unregistered_job_type_fails_loudly_at_the_first_save_and_in_checks(
    bind: Bind,
) -> None:
    bind(job_type="tests.not_registered")  # may be registered later: accepted for now

    (error,) = [e for e in check_bindings() if e.id == "delayjobs.E100"]
    assert "'tests.not_registered' is not registered" in error.msg

    with pytest.raises(ImproperlyConfigured, match=r"'tests\.not_registered' is not registered"):
        Appointment.objects.create(at=soon())
    assert not Appointment.objects.exists()  # refused before the row was written


def test_a_job_type_registered_after_the_binding_is_found_at_the_first_save(
    bind: Bind,
) -> None:
    class Later(delayjobs.JobType):
        name = "tests.registered_later"

        def execute(self, job: DelayedJob) -> None:
            return None

    binding = bind(job_type=Later)  # declared before its job type is registered
    registry.add(Later)
    try:
        assert not [e for e in check_bindings() if e.id == "delayjobs.E100"]
        appointment = Appointment.objects.create(at=soon())
        assert active(binding, appointment).job_type == "tests.registered_later"
    finally:
        registry.remove(Later.name)


def test_a_bad_offset_result_or_payload_fails_the_save(bind: Bind) -> None:
    bind(offset=lambda appointment: 15)
    with pytest.raises(TypeError, match=r"must return a datetime\.timedelta"):
        Appointment.objects.create(at=soon())
    assert not Appointment.objects.exists()  # refused before the row was written


def test_a_payload_that_is_not_json_fails_the_save_and_says_which_binding(bind: Bind) -> None:
    bind(payload=lambda appointment: {"at": appointment.at})
    with pytest.raises(delayjobs.InvalidJob, match=r"Binding tests.appointment.at->tests.noop"):
        Appointment.objects.create(at=soon())
