"""The public scheduling API: schedule, schedule_many, cancel, reschedule, retry."""

from __future__ import annotations

import logging
import math
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import delayjobs
from delayjobs import DuplicateJob, InvalidJob, InvalidTransition, JobNotFound, UnknownJobType
from delayjobs.index.store import get_store
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from tests.delay_jobs import Noop

pytestmark = pytest.mark.django_db

SCRIPTED = "tests.scripted"


def members(queue: str = "default") -> dict[int, float]:
    return get_store().members(queue)


def soon(seconds: float = 1.0) -> datetime:
    """A time inside the test pre-load window (5 s), so the hand-off indexes it."""
    return timezone.now() + timedelta(seconds=seconds)


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# schedule(): refusals ----------------------------------------------------------------


REFUSALS = {
    "unknown job type": ((("tests.nope",), {}), UnknownJobType),
    "job type not a str": (((42,), {}), UnknownJobType),
    "payload object": (((SCRIPTED, object()), {}), InvalidJob),
    "payload set": (((SCRIPTED, {1, 2}), {}), InvalidJob),
    "payload nan": (((SCRIPTED, {"x": float("nan")}), {}), InvalidJob),
    "payload datetime": (((SCRIPTED, {"at": datetime(2030, 1, 1, tzinfo=UTC)}), {}), InvalidJob),
    "naive run_at": (((SCRIPTED,), {"run_at": datetime(2030, 1, 1)}), InvalidJob),
    "run_at a string": (((SCRIPTED,), {"run_at": "2030-01-01T00:00:00Z"}), InvalidJob),
    "run_at and delay": (
        ((SCRIPTED,), {"run_at": datetime(2030, 1, 1, tzinfo=UTC), "delay": timedelta(1)}),
        InvalidJob,
    ),
    "delay an int": (((SCRIPTED,), {"delay": 10}), InvalidJob),
    "delay a float": (((SCRIPTED,), {"delay": 1.5}), InvalidJob),
    "delay overflows": (((SCRIPTED,), {"delay": timedelta.max}), InvalidJob),
    "empty key": (((SCRIPTED,), {"key": ""}), InvalidJob),
    "key of 256 chars": (((SCRIPTED,), {"key": "k" * 256}), InvalidJob),
    "key not a str": (((SCRIPTED,), {"key": 17}), InvalidJob),
    "queue with a space": (((SCRIPTED,), {"queue": "bad queue"}), InvalidJob),
    "queue empty": (((SCRIPTED,), {"queue": ""}), InvalidJob),
    "queue not a str": (((SCRIPTED,), {"queue": 3}), InvalidJob),
    "queue with a brace": (((SCRIPTED,), {"queue": "a{b}"}), InvalidJob),
    "max_attempts 0": (((SCRIPTED,), {"max_attempts": 0}), InvalidJob),
    "max_attempts -1": (((SCRIPTED,), {"max_attempts": -1}), InvalidJob),
    "max_attempts True": (((SCRIPTED,), {"max_attempts": True}), InvalidJob),
    "max_attempts a str": (((SCRIPTED,), {"max_attempts": "3"}), InvalidJob),
    "replace without key": (((SCRIPTED,), {"replace": True}), InvalidJob),
    "replace not a bool": (((SCRIPTED,), {"key": "k", "replace": "yes"}), InvalidJob),
}


@pytest.mark.parametrize(("call", "error"), list(REFUSALS.values()), ids=list(REFUSALS))
def test_schedule_refuses_bad_arguments_and_writes_nothing(
    call, error, redis_client, django_capture_on_commit_callbacks
):
    args, kwargs = call
    with django_capture_on_commit_callbacks(execute=True) as callbacks, pytest.raises(error):
        delayjobs.schedule(*args, **kwargs)
    assert callbacks == []
    assert DelayedJob.objects.count() == 0
    assert redis_client.dbsize() == 0


def _field_at_fault(name: str, call: tuple[tuple[Any, ...], dict[str, Any]]) -> str:
    """The argument a refusal is about: the job type or the payload (given by position),
    else the one keyword given, else the one both keywords share the blame with."""
    args, kwargs = call
    if name.startswith(("unknown job type", "job type")):
        return "job_type"
    if len(args) > 1:
        return "payload"
    shared = {
        "replace without key": "key",
        "run_at and delay": "delay",
        "replace not a bool": "replace",
    }
    return shared.get(name) or next(iter(kwargs))


@pytest.mark.parametrize("name", list(REFUSALS))
def test_every_refusal_names_the_argument_at_fault(name):
    call, error = REFUSALS[name]
    args, kwargs = call
    with pytest.raises(error) as info:
        delayjobs.schedule(*args, **kwargs)
    assert info.value.field == _field_at_fault(name, call)
    assert info.value.index is None


def test_a_refusal_in_a_batch_names_the_spec_and_the_field():
    specs = [{"job_type": SCRIPTED}, {"job_type": SCRIPTED, "priority": 101}]
    with pytest.raises(InvalidJob) as info:
        delayjobs.schedule_many(specs)
    assert (info.value.index, info.value.field) == (1, "priority")


def test_unknown_job_type_error_lists_the_registered_names():
    with pytest.raises(UnknownJobType) as info:
        delayjobs.schedule("tests.nope")
    assert info.value.name == "tests.nope"
    assert SCRIPTED in str(info.value)


def test_schedule_refuses_an_unregistered_job_type_class():
    class Unregistered(delayjobs.JobType):
        name = "tests.unregistered"

        def execute(self, job):
            return None

    with pytest.raises(UnknownJobType):
        delayjobs.schedule(Unregistered)
    assert DelayedJob.objects.count() == 0


def test_schedule_refuses_a_look_alike_class_using_a_registered_name():
    """Only the registered class itself resolves: invariant 8, code runs by name only."""

    class Impostor(delayjobs.JobType):
        name = SCRIPTED

        def execute(self, job):
            return None

    with pytest.raises(UnknownJobType):
        delayjobs.schedule(Impostor)


def test_non_json_payload_error_says_why():
    with pytest.raises(InvalidJob, match="JSON-serializable"):
        delayjobs.schedule(SCRIPTED, {"when": timezone.now()})


def test_invalid_job_is_a_value_error_for_callers_that_catch_those():
    with pytest.raises(ValueError):
        delayjobs.schedule(SCRIPTED, delay=5)


# schedule(): times, payload, defaults --------------------------------------------------


def test_run_at_is_stored_as_given():
    when = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    job = delayjobs.schedule(SCRIPTED, run_at=when)
    job.refresh_from_db()
    assert job.run_at == when
    assert job.status == JobStatus.SCHEDULED
    assert job.attempts == 0


def test_delay_is_counted_from_now():
    before = timezone.now()
    job = delayjobs.schedule(SCRIPTED, delay=timedelta(minutes=10))
    after = timezone.now()
    assert before + timedelta(minutes=10) <= job.run_at <= after + timedelta(minutes=10)


def test_neither_run_at_nor_delay_means_now():
    before = timezone.now()
    job = delayjobs.schedule(SCRIPTED)
    after = timezone.now()
    assert before <= job.run_at <= after


def test_an_aware_run_at_in_another_timezone_is_the_same_instant():
    from zoneinfo import ZoneInfo

    when = datetime(2031, 1, 1, 12, 0, tzinfo=ZoneInfo("Asia/Tokyo"))
    job = delayjobs.schedule(SCRIPTED, run_at=when)
    job.refresh_from_db()
    assert job.run_at == when
    assert job.run_at == datetime(2031, 1, 1, 3, 0, tzinfo=UTC)


def test_payload_is_normalised_by_a_json_round_trip():
    job = delayjobs.schedule(SCRIPTED, {"ids": (1, 2), 3: "three", "nested": {"ok": True}})
    expected = {"ids": [1, 2], "3": "three", "nested": {"ok": True}}
    assert job.payload == expected
    job.refresh_from_db()
    assert job.payload == expected


def test_payload_none_is_stored_as_an_empty_dict():
    job = delayjobs.schedule(SCRIPTED)
    job.refresh_from_db()
    assert job.payload == {}


def test_queue_defaults_to_the_job_types_and_can_be_overridden():
    assert delayjobs.schedule("tests.noop").queue == "other"
    assert delayjobs.schedule(SCRIPTED).queue == "default"
    assert delayjobs.schedule("tests.noop", queue="urgent").queue == "urgent"


def test_max_attempts_defaults_to_the_job_types_and_can_be_overridden():
    assert delayjobs.schedule(SCRIPTED).max_attempts == 3
    assert delayjobs.schedule(SCRIPTED, max_attempts=7).max_attempts == 7


def test_schedule_accepts_the_registered_class_or_its_instance():
    from delayjobs.jobtypes import registry

    by_class = delayjobs.schedule(Noop)
    by_instance = delayjobs.schedule(registry.get("tests.noop"))
    assert by_class.job_type == by_instance.job_type == "tests.noop"


def test_scheduled_job_is_indexed_in_its_queue_with_run_at_as_score(
    django_capture_on_commit_callbacks,
):
    with django_capture_on_commit_callbacks(execute=True):
        job = delayjobs.schedule("tests.noop", run_at=soon())
    assert members("other") == {job.pk: job.run_at.timestamp()}
    assert members("default") == {}


def test_job_due_after_the_window_is_left_to_the_preloader(
    redis_client, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        delayjobs.schedule(SCRIPTED, delay=timedelta(hours=1))
    assert DelayedJob.objects.count() == 1
    assert redis_client.dbsize() == 0


# Keys --------------------------------------------------------------------------------


def test_second_active_job_with_the_same_key_raises_duplicate_job():
    first = delayjobs.schedule(SCRIPTED, key="order:1")
    with pytest.raises(DuplicateJob) as info:
        delayjobs.schedule(SCRIPTED, key="order:1")
    assert info.value.existing_id == first.pk
    assert info.value.key == "order:1"
    assert DelayedJob.objects.count() == 1


def test_key_held_by_a_running_job_raises_duplicate_job_even_with_replace():
    first = delayjobs.schedule(SCRIPTED, key="order:1")
    DelayedJob.objects.filter(pk=first.pk).update(status=JobStatus.RUNNING)
    with pytest.raises(DuplicateJob) as info:
        delayjobs.schedule(SCRIPTED, {"v": 2}, key="order:1", replace=True)
    assert info.value.existing_id == first.pk
    first.refresh_from_db()
    assert first.status == JobStatus.RUNNING
    assert first.payload == {}


def test_replace_moves_the_job_holding_the_key_with_its_payload_and_score(
    django_capture_on_commit_callbacks,
):
    with django_capture_on_commit_callbacks(execute=True):
        first = delayjobs.schedule(SCRIPTED, {"v": 1}, run_at=soon(1), key="order:1")
    assert members() == {first.pk: first.run_at.timestamp()}

    new_time = soon(3)
    with django_capture_on_commit_callbacks(execute=True):
        moved = delayjobs.schedule(SCRIPTED, {"v": 2}, run_at=new_time, key="order:1", replace=True)

    assert moved.pk == first.pk
    assert DelayedJob.objects.count() == 1
    first.refresh_from_db()
    assert first.run_at == new_time
    assert first.payload == {"v": 2}
    # Moved later: Redis keeps the earlier time (a score is only ever lowered, so it can
    # never be late); the consumer pops it then, finds it not due and puts it back.
    assert list(members()) == [first.pk]
    assert members()[first.pk] <= new_time.timestamp()

    earlier = soon(0.5)
    with django_capture_on_commit_callbacks(execute=True):
        delayjobs.schedule(SCRIPTED, {"v": 3}, run_at=earlier, key="order:1", replace=True)
    assert members() == {first.pk: earlier.timestamp()}


def test_replace_beyond_the_window_takes_the_job_out_of_redis(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        first = delayjobs.schedule(SCRIPTED, run_at=soon(1), key="order:1")
    assert first.pk in members()
    with django_capture_on_commit_callbacks(execute=True):
        delayjobs.schedule(SCRIPTED, delay=timedelta(hours=2), key="order:1", replace=True)
    assert members() == {}


def test_replace_into_another_queue_moves_the_index_entry(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job = delayjobs.schedule(SCRIPTED, run_at=soon(1), key="k")
    with django_capture_on_commit_callbacks(execute=True):
        delayjobs.schedule(SCRIPTED, run_at=soon(2), key="k", queue="urgent", replace=True)
    assert members("default") == {}
    assert list(members("urgent")) == [job.pk]


def test_replace_without_a_holder_creates_the_job():
    job = delayjobs.schedule(SCRIPTED, key="fresh", replace=True)
    assert DelayedJob.objects.get(key="fresh").pk == job.pk


@pytest.mark.parametrize("final_status", [JobStatus.SUCCEEDED, JobStatus.FAILED])
def test_key_is_free_again_once_the_job_finished(final_status):
    first = delayjobs.schedule(SCRIPTED, key="order:1")
    DelayedJob.objects.filter(pk=first.pk).update(status=final_status)
    second = delayjobs.schedule(SCRIPTED, key="order:1")
    assert second.pk != first.pk
    assert DelayedJob.objects.filter(key="order:1").count() == 2


def test_key_is_free_again_once_the_job_was_cancelled():
    first = delayjobs.schedule(SCRIPTED, key="order:1")
    assert delayjobs.cancel(key="order:1") == 1
    second = delayjobs.schedule(SCRIPTED, key="order:1")
    assert second.pk != first.pk


def test_keyless_jobs_never_collide():
    delayjobs.schedule(SCRIPTED)
    delayjobs.schedule(SCRIPTED)
    assert DelayedJob.objects.filter(key__isnull=True).count() == 2


# schedule_many() ---------------------------------------------------------------------


def test_schedule_many_returns_the_jobs_in_order_with_pks(django_capture_on_commit_callbacks):
    when = soon(2)
    with django_capture_on_commit_callbacks(execute=True):
        jobs = delayjobs.schedule_many(
            [
                {"job_type": SCRIPTED, "payload": {"n": 0}, "run_at": when},
                {"job_type": "tests.noop", "payload": {"n": 1}, "key": "k1"},
                {"job_type": SCRIPTED, "payload": {"n": 2}, "delay": timedelta(hours=1)},
            ]
        )
    assert [job.payload for job in jobs] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert all(job.pk is not None for job in jobs)
    stored = {job.pk: job for job in DelayedJob.objects.all()}
    assert [stored[job.pk].payload for job in jobs] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert stored[jobs[1].pk].queue == "other"
    assert stored[jobs[1].pk].key == "k1"
    # The two due within the window are indexed, the one due in an hour is not.
    assert members("default") == {jobs[0].pk: when.timestamp()}
    assert list(members("other")) == [jobs[1].pk]


def test_schedule_many_of_nothing_is_nothing():
    assert delayjobs.schedule_many([]) == []


@pytest.mark.parametrize(
    ("bad_spec", "message"),
    [
        ({"job_type": "tests.nope"}, "Unknown job type"),
        ({"job_type": SCRIPTED, "payload": object()}, "JSON"),
        ({"job_type": SCRIPTED, "delay": 3}, "timedelta"),
        ({"payload": {}}, "no job_type"),
        ({"job_type": SCRIPTED, "when": 3}, "unknown argument"),
        ("tests.scripted", "must be a dict"),
    ],
)
def test_schedule_many_refuses_a_bad_spec_naming_its_index_and_writes_nothing(
    bad_spec, message, redis_client, django_capture_on_commit_callbacks
):
    specs = [{"job_type": SCRIPTED}, {"job_type": SCRIPTED, "key": "a"}, bad_spec]
    with (
        django_capture_on_commit_callbacks(execute=True),
        pytest.raises(InvalidJob, match=r"specs\[2\]") as info,
    ):
        delayjobs.schedule_many(specs)
    assert message in str(info.value)
    assert DelayedJob.objects.count() == 0
    assert redis_client.dbsize() == 0


def test_schedule_many_refuses_a_key_repeated_in_the_batch(redis_client):
    specs = [
        {"job_type": SCRIPTED, "key": "a"},
        {"job_type": SCRIPTED, "key": "b"},
        {"job_type": SCRIPTED, "key": "a"},
    ]
    with pytest.raises(InvalidJob, match=r"specs\[2\].*'a'.*twice"):
        delayjobs.schedule_many(specs)
    assert DelayedJob.objects.count() == 0
    assert redis_client.dbsize() == 0


def test_schedule_many_raises_duplicate_job_for_a_key_held_by_an_existing_job(redis_client):
    holder = delayjobs.schedule(SCRIPTED, key="a")
    specs = [{"job_type": SCRIPTED, "key": "new"}, {"job_type": SCRIPTED, "key": "a"}]
    with pytest.raises(DuplicateJob) as info:
        delayjobs.schedule_many(specs)
    assert info.value.existing_id == holder.pk
    assert list(DelayedJob.objects.values_list("pk", flat=True)) == [holder.pk]
    assert redis_client.dbsize() == 0


def test_schedule_many_replace_true_moves_the_holder_and_returns_it_in_place(
    django_capture_on_commit_callbacks,
):
    holder = delayjobs.schedule(SCRIPTED, {"v": 1}, delay=timedelta(hours=1), key="a")
    new_time = soon(2)
    with django_capture_on_commit_callbacks(execute=True):
        jobs = delayjobs.schedule_many(
            [
                {"job_type": SCRIPTED, "key": "b", "run_at": new_time},
                {
                    "job_type": SCRIPTED,
                    "key": "a",
                    "run_at": new_time,
                    "payload": {"v": 2},
                    "replace": True,
                },
            ]
        )
    assert jobs[1].pk == holder.pk
    holder.refresh_from_db()
    assert holder.run_at == new_time
    assert holder.payload == {"v": 2}
    assert DelayedJob.objects.count() == 2
    assert members() == {jobs[0].pk: new_time.timestamp(), holder.pk: new_time.timestamp()}


def _queries_for_batch(size: int) -> tuple[list[str], list[str]]:
    """(INSERT statements, other statements) of one schedule_many() call of ``size`` jobs."""
    specs = [{"job_type": SCRIPTED, "payload": {"n": n}} for n in range(size)]
    with CaptureQueriesContext(connection) as captured:
        jobs = delayjobs.schedule_many(specs)
    assert len(jobs) == size
    statements = [query["sql"].lstrip() for query in captured.captured_queries]
    inserts = [sql for sql in statements if sql.upper().startswith("INSERT")]
    return inserts, [sql for sql in statements if sql not in inserts]


def test_schedule_many_inserts_in_bulk_not_row_by_row():
    small_inserts, small_other = _queries_for_batch(10)
    inserts, other = _queries_for_batch(1000)
    if connection.vendor == "postgresql":
        # Ids come from one sequence query and the rows stream through COPY, which the
        # query capture does not see: no INSERT at all, whatever the size.
        assert inserts == small_inserts == []
        assert any("nextval" in sql for sql in other)
    else:
        # bulk_create: as many rows per INSERT as the backend's parameter limit allows
        # (SQLite on Django 5.2: 999 parameters), at most 500.
        fields = [f for f in DelayedJob._meta.concrete_fields if not f.primary_key]
        rows_per_insert = min(500, connection.ops.bulk_batch_size(fields, [None] * 1000))
        assert rows_per_insert >= 40  # 1000 jobs in at most 25 INSERTs
        assert len(small_inserts) == 1
        assert len(inserts) == math.ceil(1000 / rows_per_insert)
    # Everything else is a constant, whatever the batch size.
    assert len(other) == len(small_other)
    assert len(other) <= 5, other  # savepoints, plus the id query on PostgreSQL
    assert DelayedJob.objects.count() == 1010


def test_schedule_many_rows_read_back_exactly_as_written():
    """The COPY path (PostgreSQL) and bulk_create store the same values as save() does."""
    run_at = soon(30)
    text = "tab\there, quote ' \" é"
    jobs = delayjobs.schedule_many(
        [
            {"job_type": SCRIPTED, "payload": {"text": text}, "run_at": run_at},
            {"job_type": "tests.noop", "key": "k:1", "max_attempts": 7, "payload": [1, None]},
        ]
    )
    for job in jobs:
        stored = DelayedJob.objects.get(pk=job.pk)
        for field in DelayedJob._meta.concrete_fields:
            assert getattr(stored, field.attname) == getattr(job, field.attname), field.name
    assert jobs[0].payload == {"text": text}
    assert jobs[1].queue == "other" and jobs[1].status == "scheduled" and jobs[1].attempts == 0


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_schedule_row_reads_back_exactly_as_written(keyed, django_capture_on_commit_callbacks):
    """The one-row INSERT compiled once (PostgreSQL) stores what save() stores, in one
    statement that Django's cursor sees (query logging, execute wrappers)."""
    text = "tab\there, quote ' \" é \\u0000"
    linked = DelayedJob.objects.create(job_type="tests.noop", run_at=timezone.now())
    with (
        CaptureQueriesContext(connection) as captured,
        django_capture_on_commit_callbacks(execute=True),
    ):
        job = delayjobs.schedule(
            SCRIPTED,
            {"text": text, "list": [1, None, 2.5], "nested": {"a": {"b": True}}},
            run_at=soon(2),  # in the pre-load window: indexed on commit
            key="row:1" if keyed else None,
            max_attempts=7,
            max_lateness=timedelta(seconds=90),
            priority=-3,
            obj=linked,
        )
    inserts = [q["sql"] for q in captured.captured_queries if "INSERT" in q["sql"].upper()]
    assert len(inserts) == 1, inserts
    assert job.pk is not None and not job._state.adding and job._state.db == "default"
    stored = DelayedJob.objects.get(pk=job.pk)
    for field in DelayedJob._meta.concrete_fields:
        assert getattr(stored, field.attname) == getattr(job, field.attname), field.name
    assert stored.payload["text"] == text
    # No result yet is SQL NULL, as save() stores it, not the JSON null.
    assert DelayedJob.objects.filter(pk=job.pk, result__isnull=True).exists()
    assert stored.object_id == str(linked.pk)
    assert members(job.queue) == {job.pk: job.run_at.timestamp()}


def test_schedule_sends_save_signals_when_a_receiver_listens_to_delayed_job():
    """With a pre_save or post_save receiver of DelayedJob, schedule() saves through the ORM,
    so the receivers see the new job as they always did."""
    from django.db.models.signals import post_save, pre_save

    seen: list[tuple[str, bool, int | None]] = []

    def before(sender, instance, **kwargs):
        seen.append(("pre", instance._state.adding, instance.pk))

    def after(sender, instance, created, **kwargs):
        seen.append(("post", created, instance.pk))

    pre_save.connect(before, sender=DelayedJob)
    post_save.connect(after, sender=DelayedJob)
    try:
        job = delayjobs.schedule(SCRIPTED, {"n": 1})
        keyed = delayjobs.schedule(SCRIPTED, {"n": 2}, key="signals:1")
    finally:
        pre_save.disconnect(before, sender=DelayedJob)
        post_save.disconnect(after, sender=DelayedJob)
    assert seen == [
        ("pre", True, None),
        ("post", True, job.pk),
        ("pre", True, None),
        ("post", True, keyed.pk),
    ]


def test_schedule_many_where_every_spec_replaces_inserts_nothing_and_moves_all():
    first = delayjobs.schedule(SCRIPTED, {"v": 1}, run_at=soon(5), key="a")
    second = delayjobs.schedule(SCRIPTED, {"v": 1}, run_at=soon(5), key="b")
    moved = delayjobs.schedule_many(
        [
            {"job_type": SCRIPTED, "payload": {"v": 2}, "key": "a", "replace": True},
            {"job_type": SCRIPTED, "payload": {"v": 2}, "key": "b", "replace": True},
        ]
    )
    assert [job.pk for job in moved] == [first.pk, second.pk]
    assert DelayedJob.objects.count() == 2
    assert list(DelayedJob.objects.values_list("payload", flat=True)) == [{"v": 2}, {"v": 2}]


def test_schedule_many_key_conflict_through_the_bulk_path_raises_duplicate_job():
    holder = delayjobs.schedule(SCRIPTED, key="taken")
    with pytest.raises(DuplicateJob) as caught:
        delayjobs.schedule_many([{"job_type": SCRIPTED}, {"job_type": SCRIPTED, "key": "taken"}])
    assert caught.value.existing_id == holder.pk
    assert DelayedJob.objects.count() == 1


def test_schedule_many_indexes_the_whole_batch_on_commit(django_capture_on_commit_callbacks):
    specs = [{"job_type": SCRIPTED, "run_at": soon(1)} for _ in range(1000)]
    with django_capture_on_commit_callbacks(execute=True):
        jobs = delayjobs.schedule_many(specs)
        assert members() == {}
    assert set(members()) == {job.pk for job in jobs}


# cancel() ----------------------------------------------------------------------------


def test_cancel_by_job_returns_1_then_0():
    job = delayjobs.schedule(SCRIPTED)
    assert delayjobs.cancel(job) == 1
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert job.finished_at is not None
    assert delayjobs.cancel(job) == 0


def test_cancel_by_id():
    job = delayjobs.schedule(SCRIPTED)
    assert delayjobs.cancel(job.pk) == 1
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.CANCELLED


def test_cancel_by_key_returns_1_then_0():
    job = delayjobs.schedule(SCRIPTED, key="order:7")
    other = delayjobs.schedule(SCRIPTED, key="order:8")
    assert delayjobs.cancel(key="order:7") == 1
    assert delayjobs.cancel(key="order:7") == 0
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.CANCELLED
    assert DelayedJob.objects.get(pk=other.pk).status == JobStatus.SCHEDULED


def test_cancel_of_an_unknown_key_or_id_returns_0():
    assert delayjobs.cancel(key="nobody") == 0
    assert delayjobs.cancel(987654) == 0


@pytest.mark.parametrize(
    "status", [JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED]
)
def test_cancel_leaves_a_job_that_is_not_scheduled_alone(status):
    job = delayjobs.schedule(SCRIPTED, key="k")
    DelayedJob.objects.filter(pk=job.pk).update(status=status)
    assert delayjobs.cancel(job) == 0
    assert delayjobs.cancel(key="k") == 0
    assert DelayedJob.objects.get(pk=job.pk).status == status


@pytest.mark.parametrize(
    "kwargs", [{}, {"job": 1, "key": "k"}, {"job": "1"}, {"job": True}, {"key": ""}]
)
def test_cancel_needs_exactly_one_valid_target(kwargs):
    with pytest.raises(InvalidJob):
        delayjobs.cancel(**kwargs)


def test_cancel_removes_the_job_from_redis_on_commit(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job = delayjobs.schedule(SCRIPTED, run_at=soon(), key="k")
        keep = delayjobs.schedule(SCRIPTED, run_at=soon())
    assert set(members()) == {job.pk, keep.pk}
    with django_capture_on_commit_callbacks(execute=True):
        assert delayjobs.cancel(key="k") == 1
        assert set(members()) == {job.pk, keep.pk}  # not before the commit
    assert set(members()) == {keep.pk}


# reschedule() ------------------------------------------------------------------------


def test_reschedule_by_job_moves_run_at_and_the_redis_score(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job = delayjobs.schedule(SCRIPTED, run_at=soon(1))
    new_time = soon(3)
    with django_capture_on_commit_callbacks(execute=True):
        moved = delayjobs.reschedule(job, run_at=new_time)
    assert moved.run_at == new_time
    assert DelayedJob.objects.get(pk=job.pk).run_at == new_time
    assert members()[job.pk] <= new_time.timestamp()  # moved later: never a late score
    earlier = soon(0.5)
    with django_capture_on_commit_callbacks(execute=True):
        delayjobs.reschedule(job, run_at=earlier)
    assert members() == {job.pk: earlier.timestamp()}


def test_reschedule_by_key_with_a_delay(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job = delayjobs.schedule("tests.noop", run_at=soon(1), key="meeting:1:start")
    before = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        moved = delayjobs.reschedule(key="meeting:1:start", delay=timedelta(seconds=2))
    assert moved.pk == job.pk
    assert moved.run_at >= before + timedelta(seconds=2)
    assert list(members("other")) == [job.pk]
    assert members("other")[job.pk] <= moved.run_at.timestamp()


def test_reschedule_beyond_the_window_takes_the_job_out_of_redis(
    django_capture_on_commit_callbacks,
):
    with django_capture_on_commit_callbacks(execute=True):
        job = delayjobs.schedule(SCRIPTED, run_at=soon(1))
    with django_capture_on_commit_callbacks(execute=True):
        delayjobs.reschedule(job, delay=timedelta(days=1))
    assert members() == {}


def test_reschedule_of_a_missing_job_raises_job_not_found():
    with pytest.raises(JobNotFound):
        delayjobs.reschedule(key="nobody", run_at=soon())
    with pytest.raises(JobNotFound):
        delayjobs.reschedule(987654, run_at=soon())


@pytest.mark.parametrize(
    "status", [JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED]
)
def test_reschedule_of_a_job_that_is_not_scheduled_raises_invalid_transition(status):
    job = delayjobs.schedule(SCRIPTED, key="k")
    DelayedJob.objects.filter(pk=job.pk).update(status=status)
    original = DelayedJob.objects.get(pk=job.pk).run_at
    with pytest.raises(InvalidTransition, match=str(status)):
        delayjobs.reschedule(job, delay=timedelta(hours=1))
    assert DelayedJob.objects.get(pk=job.pk).run_at == original


def test_reschedule_of_a_job_that_does_not_exist_raises_job_not_found():
    with pytest.raises(JobNotFound):
        delayjobs.reschedule(987654, delay=timedelta(hours=1))
    with pytest.raises(JobNotFound):
        delayjobs.reschedule(key="nobody", delay=timedelta(hours=1))


@pytest.mark.parametrize("payload", [{"s": "a\x00b"}, ["\x00"], {"k\x00": 1}])
def test_schedule_refuses_a_nul_character_anywhere_in_the_payload(payload):
    with pytest.raises(InvalidJob, match="NUL"):
        delayjobs.schedule(SCRIPTED, payload)
    assert DelayedJob.objects.count() == 0


def test_schedule_keeps_a_literal_backslash_u0000_text():
    job = delayjobs.schedule(SCRIPTED, {"s": "\\u0000"})
    assert DelayedJob.objects.get(pk=job.pk).payload == {"s": "\\u0000"}


def test_reschedule_refuses_bad_times():
    job = delayjobs.schedule(SCRIPTED)
    with pytest.raises(InvalidJob):
        delayjobs.reschedule(job, run_at=datetime(2030, 1, 1))
    with pytest.raises(InvalidJob):
        delayjobs.reschedule(job, delay=60)


# retry() -----------------------------------------------------------------------------


def _finished_job(status: str, *, key: str | None = None, attempts: int = 3) -> DelayedJob:
    job = delayjobs.schedule(SCRIPTED, key=key, run_at=timezone.now() - timedelta(hours=1))
    started = timezone.now() - timedelta(minutes=30)
    for number in range(1, attempts + 1):
        JobAttempt.objects.create(
            job=job,
            number=number,
            worker_id="w1",
            started_at=started,
            finished_at=started,
            outcome=AttemptOutcome.RETRYING if number < attempts else AttemptOutcome.FAILED,
            error="RuntimeError: boom",
            lateness=timedelta(minutes=30),
        )
    DelayedJob.objects.filter(pk=job.pk).update(
        status=status,
        attempts=attempts,
        worker_id="w1",
        started_at=started,
        finished_at=started,
        last_error="RuntimeError: boom",
    )
    job.refresh_from_db()
    return job


@pytest.mark.parametrize("status", [JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.SUCCEEDED])
def test_retry_runs_a_finished_job_again_now_keeping_its_history(
    status, django_capture_on_commit_callbacks
):
    job = _finished_job(status)
    before = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        retried = delayjobs.retry(job)
    after = timezone.now()
    job.refresh_from_db()
    assert retried.pk == job.pk
    assert job.status == JobStatus.SCHEDULED
    assert job.attempts == 0
    assert before <= job.run_at <= after
    assert job.started_at is None
    assert job.finished_at is None
    assert job.worker_id == ""
    assert job.history.count() == 3
    assert members() == {job.pk: job.run_at.timestamp()}


def test_retry_by_id():
    job = _finished_job(JobStatus.FAILED)
    delayjobs.retry(job.pk)
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SCHEDULED


@pytest.mark.parametrize("status", [JobStatus.SCHEDULED, JobStatus.RUNNING])
def test_retry_of_an_active_job_raises_invalid_transition(status):
    job = delayjobs.schedule(SCRIPTED)
    DelayedJob.objects.filter(pk=job.pk).update(status=status, attempts=1)
    with pytest.raises(InvalidTransition):
        delayjobs.retry(job)
    job.refresh_from_db()
    assert job.status == status
    assert job.attempts == 1


def test_retry_raises_duplicate_job_when_another_active_job_took_the_key(redis_client):
    old = _finished_job(JobStatus.FAILED, key="order:1")
    new = delayjobs.schedule(SCRIPTED, key="order:1")
    with pytest.raises(DuplicateJob) as info:
        delayjobs.retry(old)
    assert info.value.existing_id == new.pk
    old.refresh_from_db()
    assert old.status == JobStatus.FAILED
    assert old.attempts == 3


def test_retry_of_a_missing_job_raises_job_not_found():
    with pytest.raises(JobNotFound):
        delayjobs.retry(987654)


# Transactions and Redis outages ------------------------------------------------------


def test_job_reaches_redis_only_when_the_transaction_commits(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with transaction.atomic():
            job = delayjobs.schedule(SCRIPTED, run_at=soon())
            assert members() == {}
        assert members() == {}  # the test's own transaction has not committed yet
    assert callbacks  # the hand-off to Redis (and, with prometheus_client, the count)
    assert members() == {job.pk: job.run_at.timestamp()}


@pytest.mark.django_db(transaction=True)
def test_job_reaches_redis_when_a_real_transaction_commits():
    with transaction.atomic():
        job = delayjobs.schedule(SCRIPTED, run_at=soon(), key="k")
        assert members() == {}
    assert members() == {job.pk: job.run_at.timestamp()}


@pytest.mark.django_db(transaction=True)
def test_rolled_back_transaction_leaves_no_job_anywhere(redis_client):
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        delayjobs.schedule(SCRIPTED, run_at=soon())
        delayjobs.schedule(SCRIPTED, run_at=soon(), key="k")
        delayjobs.schedule_many([{"job_type": "tests.noop", "run_at": soon()}])
        raise Rollback
    assert DelayedJob.objects.count() == 0
    assert redis_client.dbsize() == 0


@pytest.mark.django_db(transaction=True)
def test_rolled_back_cancel_keeps_the_job_scheduled_and_indexed():
    job = delayjobs.schedule(SCRIPTED, run_at=soon())
    assert job.pk in members()

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        assert delayjobs.cancel(job) == 1
        raise Rollback
    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SCHEDULED
    assert job.pk in members()


@pytest.mark.django_db(transaction=True)
def test_autocommit_schedule_is_indexed_at_once():
    job = delayjobs.schedule(SCRIPTED, run_at=soon())
    assert members() == {job.pk: job.run_at.timestamp()}


@pytest.fixture
def redis_down(settings):
    """DELAYJOBS pointed at a port nobody listens on; the store client follows the change."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": f"redis://127.0.0.1:{closed_port()}/0"}
    with pytest.raises(redis.ConnectionError):
        get_store().size("default")


def test_schedule_succeeds_and_warns_when_redis_is_down(
    redis_client, redis_down, caplog, django_capture_on_commit_callbacks
):
    caplog.set_level(logging.WARNING, logger="delayjobs")
    with django_capture_on_commit_callbacks(execute=True):
        job = delayjobs.schedule(SCRIPTED, run_at=soon())
        keyed = delayjobs.schedule(SCRIPTED, run_at=soon(), key="k")
        many = delayjobs.schedule_many([{"job_type": SCRIPTED, "run_at": soon()}])
    assert DelayedJob.objects.filter(pk__in=[job.pk, keyed.pk, many[0].pk]).count() == 3
    # One warning, then hand-offs pause instead of costing every caller a timeout.
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "pre-loader" in warnings[0].getMessage()
    assert "pause" in warnings[0].getMessage()
    assert redis_client.dbsize() == 0


def test_a_hand_off_error_that_is_not_a_redis_error_never_reaches_the_caller(
    settings, caplog, django_capture_on_commit_callbacks
):
    # A cache alias that does not exist: django-redis raises its own error, not RedisError.
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": None, "REDIS_CACHE_ALIAS": "nope"}
    caplog.set_level(logging.WARNING, logger="delayjobs")
    with django_capture_on_commit_callbacks(execute=True):
        job = delayjobs.schedule(SCRIPTED, run_at=soon())
    assert DelayedJob.objects.filter(pk=job.pk).exists()
    assert any("pre-loader" in r.getMessage() for r in caplog.records)


def test_cancel_and_retry_succeed_when_redis_is_down(
    redis_down, caplog, django_capture_on_commit_callbacks
):
    job = delayjobs.schedule(SCRIPTED, run_at=soon())
    with django_capture_on_commit_callbacks(execute=True):
        assert delayjobs.cancel(job) == 1
        delayjobs.retry(job)
        delayjobs.reschedule(job, run_at=soon(2))
    job.refresh_from_db()
    assert job.status == JobStatus.SCHEDULED
    assert job.run_at > timezone.now()
    assert any("Could not hand" in r.getMessage() for r in caplog.records)


def _race(workers: int, schedule_one) -> list[object]:
    """Run ``schedule_one(n)`` in ``workers`` threads at once; their results or errors."""
    import threading

    from django.db import connections

    barrier = threading.Barrier(workers)
    results: list[object] = []
    lock = threading.Lock()

    def attempt(n: int) -> None:
        try:
            barrier.wait()
            try:
                outcome: object = schedule_one(n)
            except Exception as exc:
                outcome = exc
            with lock:
                results.append(outcome)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == workers
    return results


@pytest.mark.django_db(transaction=True)
def test_concurrent_schedules_of_one_key_have_exactly_one_winner():
    results = _race(4, lambda n: delayjobs.schedule(SCRIPTED, {"n": n}, key="race"))
    winners = [r for r in results if isinstance(r, DelayedJob)]
    losers = [r for r in results if isinstance(r, DuplicateJob)]
    assert len(winners) == 1
    assert len(losers) == 3
    assert {loser.existing_id for loser in losers} == {winners[0].pk}
    assert list(DelayedJob.objects.values_list("pk", flat=True)) == [winners[0].pk]


@pytest.mark.django_db(transaction=True)
def test_concurrent_replaces_of_one_key_all_succeed_on_one_job():
    """replace=True means "this key's job, at this time": losing the race to insert it
    moves the winner's job instead of failing."""
    results = _race(4, lambda n: delayjobs.schedule(SCRIPTED, {"n": n}, key="race", replace=True))
    assert all(isinstance(r, DelayedJob) for r in results), results
    [job] = DelayedJob.objects.all()
    assert {r.pk for r in results} == {job.pk}
    assert job.payload in [{"n": n} for n in range(4)]


@pytest.mark.django_db
def test_a_payload_nested_past_max_payload_depth_is_refused_before_anything_is_written() -> None:
    deep: object = 1
    for _ in range(65):
        deep = {"a": deep}
    with pytest.raises(delayjobs.InvalidJob, match=r"more than 64 levels deep"):
        delayjobs.schedule("tests.scripted", deep)
    with pytest.raises(delayjobs.InvalidJob, match=r"more than 64 levels deep"):
        delayjobs.schedule_many([{"job_type": "tests.scripted", "payload": deep}])
    assert not DelayedJob.objects.exists()
    assert delayjobs.schedule("tests.scripted", deep["a"]).payload == deep["a"]  # 64: fine
