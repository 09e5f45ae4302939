"""Bad input, everywhere: property-based tests of the API's arguments, the commands' options
and the settings.

Each refusal is one specific exception whose message says what is wrong, and leaves the
jobs, their attempts and Redis exactly as they were. Valid input is generated too and must
succeed, so that every property can fail both ways.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from datetime import timezone as tz
from typing import Any, TypeVar

import pytest
import redis
from django.conf import settings as django_settings
from django.core import checks
from django.core.management import CommandError, call_command
from django.db import models, transaction
from django.test import TestCase, override_settings
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import delayjobs
from delayjobs import DuplicateJob, InvalidJob, InvalidTransition, JobNotFound, UnknownJobType
from delayjobs.checks import check_settings
from delayjobs.conf import (
    DEFAULTS,
    MAX_CONCURRENCY,
    MAX_DURATION,
    MAX_PROCESSES,
    MAX_TIMEOUT_SECONDS,
)
from delayjobs.jobtypes import MAX_LATENESS, MIN_LATENESS, registry
from delayjobs.models import AttemptOutcome, DelayedJob, JobAttempt, JobStatus
from delayjobs.validation import KEY_MAX_LENGTH, MAX_ATTEMPTS_LIMIT, SPEC_FIELDS
from sampleproject.meetings.models import Room

pytestmark = pytest.mark.django_db

SCRIPTED = "tests.scripted"
T = TypeVar("T")

# Deterministic and quick enough for CI on every database; no example database is
# written (it would land in the working tree). Registered, not loaded: other test
# modules keep Hypothesis' defaults.
settings.register_profile(
    "delayjobs-ci", deadline=None, max_examples=100, derandomize=True, database=None
)
PROFILE = settings.get_profile("delayjobs-ci")
# For tests that take fixtures: those are set up once per test, not once per example. That
# is what these tests need: every example must leave the world exactly as it found it.
WITH_FIXTURES = settings(PROFILE, suppress_health_check=[HealthCheck.function_scoped_fixture])


# The world every refusal must leave alone --------------------------------------------


@dataclass(frozen=True)
class World:
    scheduled: DelayedJob  # holds key "held:scheduled", indexed in Redis
    running: DelayedJob  # holds key "held:running"
    finished: dict[JobStatus, DelayedJob]  # succeeded, failed, cancelled: one each
    key_taken: DelayedJob  # failed, its key now held by `scheduled`: retry() is refused

    @property
    def ids(self) -> set[int]:
        jobs = [self.scheduled, self.running, self.key_taken, *self.finished.values()]
        return {job.pk for job in jobs}


def finish(job: DelayedJob, status: JobStatus) -> DelayedJob:
    """Put a job in ``status`` as a consumer would have left it, with an attempt row."""
    now = timezone.now()
    running = status == JobStatus.RUNNING
    DelayedJob.objects.filter(pk=job.pk).update(
        status=status,
        attempts=1,
        worker_id="w1",
        started_at=now,
        finished_at=None if running else now,
        lease_expires_at=now + timedelta(minutes=5) if running else None,
    )
    if not running:
        outcome = AttemptOutcome.SUCCEEDED if status == JobStatus.SUCCEEDED else "failed"
        JobAttempt.objects.create(
            job=job,
            number=1,
            worker_id="w1",
            started_at=now,
            finished_at=now,
            outcome=outcome,
            lateness=now - job.run_at,
        )
    job.refresh_from_db()
    return job


@pytest.fixture
def world(redis_client: redis.Redis) -> World:
    with TestCase.captureOnCommitCallbacks(execute=True):
        scheduled = delayjobs.schedule(SCRIPTED, {"n": 1}, key="held:scheduled")
    assert redis_client.dbsize() > 0, "the world should have a Redis entry to keep"
    key_taken = finish(delayjobs.schedule(SCRIPTED), JobStatus.FAILED)
    DelayedJob.objects.filter(pk=key_taken.pk).update(key="held:scheduled")
    key_taken.refresh_from_db()
    return World(
        scheduled=scheduled,
        running=finish(delayjobs.schedule(SCRIPTED, key="held:running"), JobStatus.RUNNING),
        finished={
            status: finish(delayjobs.schedule("tests.noop"), status)
            for status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)
        },
        key_taken=key_taken,
    )


def snapshot(client: redis.Redis) -> tuple[list[dict], list[dict], dict[bytes, bytes | None]]:
    """Every job row, every attempt row and every Redis key with its value."""
    return (
        list(DelayedJob.objects.order_by("pk").values()),
        list(JobAttempt.objects.order_by("pk").values()),
        {key: client.dump(key) for key in client.scan_iter()},
    )


@contextmanager
def unchanged(client: redis.Redis) -> Iterator[None]:
    """The block writes nothing to the database and hands nothing to Redis."""
    before = snapshot(client)
    with TestCase.captureOnCommitCallbacks(execute=True) as callbacks:
        yield
    assert callbacks == [], "nothing may be handed to Redis"
    assert snapshot(client) == before


def assert_refused(
    call: Callable[[], object], error: type[Exception], says: str, client: redis.Redis
) -> None:
    """``call()`` raises exactly ``error`` saying ``says``, and changes nothing at all."""
    with unchanged(client), pytest.raises(error, match=re.escape(says)) as info:
        call()
    assert info.type is error, f"{info.type.__name__}, not {error.__name__}: {info.value}"


class Undo(Exception):
    """Raised to roll back what a successful example wrote."""


def undone(call: Callable[[], T]) -> T:
    """``call()``'s result, checked by the caller; everything it wrote is rolled back."""
    results: list[T] = []
    with (
        pytest.raises(Undo),
        TestCase.captureOnCommitCallbacks(execute=False),
        transaction.atomic(),
    ):
        results.append(call())
        raise Undo
    return results[0]


# Strategies: valid arguments ---------------------------------------------------------


# Text both databases store: UTF-8 (no lone surrogates) without NUL (PostgreSQL).
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    # PostgreSQL's jsonb keeps numbers as exact decimals: a float of 1e16 or more comes
    # back as an int, which may differ from it. Smaller ones come back as they went.
    | st.floats(min_value=-1e15, max_value=1e15)
    | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=10,
)
# Aware times from the start of the calendar to well inside MAX_SCHEDULE_AHEAD (100 years
# from now), at any offset Python allows: up to ±23:59, though PostgreSQL takes ±15:59.
OFFSETS = st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(
    lambda minutes: tz(timedelta(minutes=minutes))
)
RUN_AT = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(2120, 12, 30), timezones=OFFSETS
) | st.just(datetime.min.replace(tzinfo=UTC))
# From about year 110 to 98 years from now.
DELAY = st.timedeltas(min_value=-timedelta(days=700_000), max_value=timedelta(days=36_000))
FRESH_KEY = TEXT.filter(bool).map(lambda text: f"fresh:{text}"[:KEY_MAX_LENGTH])
QUEUE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
QUEUE = st.from_regex(QUEUE_NAME, fullmatch=True)
ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=10),
    st.binary(max_size=10),
    st.datetimes(),
    st.dates(),
    st.timedeltas(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    st.builds(object),
)


HASHABLE = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10))


@st.composite
def schedule_kwargs(draw: st.DrawFn) -> dict[str, Any]:
    """Valid keyword arguments of schedule(), job_type included, with a fresh key if any."""
    kwargs: dict[str, Any] = {
        "job_type": draw(st.sampled_from([SCRIPTED, "tests.noop"])),
        "payload": draw(JSON),
    }
    when = draw(st.sampled_from(["now", "run_at", "delay"]))
    if when != "now":
        kwargs[when] = draw(RUN_AT if when == "run_at" else DELAY)
    if draw(st.booleans()):
        kwargs["key"] = draw(FRESH_KEY)
        kwargs["replace"] = draw(st.booleans())
    if draw(st.booleans()):
        kwargs["queue"] = draw(QUEUE)
    if draw(st.booleans()):
        kwargs["max_attempts"] = draw(st.none() | st.integers(1, MAX_ATTEMPTS_LIMIT))
    if draw(st.booleans()):
        kwargs["max_lateness"] = draw(st.none() | st.timedeltas(MIN_LATENESS, MAX_LATENESS))
    if draw(st.booleans()):
        kwargs["priority"] = draw(st.integers(-100, 100))
    return kwargs


# Strategies: bad arguments -----------------------------------------------------------


def not_a(*types: type) -> st.SearchStrategy[Any]:
    """Values of ANYTHING that are not instances of ``types``; a bool is not an int here."""
    return ANYTHING.filter(
        lambda value: (
            not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
        )
    )


def beyond_the_calendar(sign: int) -> st.SearchStrategy[datetime]:
    """Aware times whose UTC value is after datetime.max (sign 1) or before datetime.min (-1).

    For example 23:00 of 9999-12-31 at UTC-5 is 04:00 of a day that does not exist.
    """

    @st.composite
    def build(draw: st.DrawFn) -> datetime:
        minutes = draw(st.integers(1, 14 * 60))
        edge = datetime.max if sign > 0 else datetime.min
        inside = draw(st.timedeltas(timedelta(0), timedelta(minutes=minutes, microseconds=-1)))
        return (edge - sign * inside).replace(tzinfo=tz(timedelta(minutes=-sign * minutes)))

    return build()


Refusal = tuple[st.SearchStrategy[Any], type[Exception], str]

BAD_RUN_AT: list[Refusal] = [
    (not_a(datetime, type(None)), InvalidJob, "run_at must be an aware datetime"),
    (st.datetimes(), InvalidJob, "run_at must be timezone-aware"),
    (beyond_the_calendar(1) | beyond_the_calendar(-1), InvalidJob, "outside the supported dates"),
    (
        st.datetimes(min_value=datetime(2200, 1, 1), max_value=datetime(9999, 12, 30)).map(
            lambda moment: moment.replace(tzinfo=UTC)
        )
        | st.just(datetime.max.replace(tzinfo=UTC)),
        InvalidJob,
        "DELAYJOBS['MAX_SCHEDULE_AHEAD']",
    ),
]
BAD_DELAY: list[Refusal] = [
    (not_a(timedelta, type(None)), InvalidJob, "delay must be a datetime.timedelta"),
    (
        st.timedeltas(min_value=timedelta(days=3_000_000))
        | st.timedeltas(max_value=-timedelta(days=800_000)),
        InvalidJob,
        "outside the supported dates",
    ),
    (
        st.timedeltas(min_value=timedelta(days=36_600), max_value=timedelta(days=2_900_000)),
        InvalidJob,
        "DELAYJOBS['MAX_SCHEDULE_AHEAD']",
    ),
]
BAD_KEY: list[Refusal] = [
    (not_a(str, type(None)), InvalidJob, "key must be a string"),
    (
        st.just("") | st.text(min_size=KEY_MAX_LENGTH + 1, max_size=KEY_MAX_LENGTH + 100),
        InvalidJob,
        f"key must be 1-{KEY_MAX_LENGTH} characters",
    ),
    (FRESH_KEY.map(lambda key: f"{key[:-1]}\x00"), InvalidJob, "NUL"),
    (FRESH_KEY.map(lambda key: f"{key[:-1]}\udfff"), InvalidJob, "surrogate"),
]
# One bad argument of schedule(): how to make it, the exception, what its message says.
BAD_ARGUMENTS: dict[str, list[Refusal]] = {
    "job_type": [
        (
            ANYTHING.filter(lambda value: value not in (SCRIPTED, "tests.noop")),
            UnknownJobType,
            "Unknown job type",
        ),
    ],
    "run_at": BAD_RUN_AT,
    "delay": BAD_DELAY,
    "key": BAD_KEY,
    "queue": [
        (not_a(str, type(None)), InvalidJob, "queue must be 1-100 characters"),
        (
            st.sampled_from(["", "q" * 101, "a b", "a{b}", "default\n", "é"])
            | st.text(max_size=110).filter(lambda queue: not QUEUE_NAME.fullmatch(queue)),
            InvalidJob,
            "queue must be 1-100 characters",
        ),
    ],
    "max_attempts": [
        (not_a(int, type(None)), InvalidJob, "max_attempts must be an int"),
        (
            st.integers(max_value=0) | st.integers(min_value=MAX_ATTEMPTS_LIMIT + 1),
            InvalidJob,
            f"from 1 to {MAX_ATTEMPTS_LIMIT}",
        ),
    ],
    "replace": [(not_a(bool), InvalidJob, "replace must be True or False")],
    "max_lateness": [
        (not_a(timedelta, type(None)), InvalidJob, "max_lateness must be a timedelta"),
        (
            st.timedeltas(max_value=MIN_LATENESS - timedelta(microseconds=1))
            | st.timedeltas(min_value=MAX_LATENESS + timedelta(microseconds=1)),
            InvalidJob,
            "max_lateness must be a timedelta from",
        ),
    ],
    "priority": [
        (not_a(int), InvalidJob, "priority must be an int from -100 to 100"),
        (
            st.integers(max_value=-101) | st.integers(min_value=101),
            InvalidJob,
            "priority must be an int from -100 to 100",
        ),
    ],
    "obj": [
        (
            not_a(type(None)).filter(lambda value: not isinstance(value, models.Model)),
            InvalidJob,
            "obj must be a saved model instance",
        ),
        (st.builds(Room), InvalidJob, "obj must be saved first"),
    ],
}


def deep(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def circular() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


# What a JSON column cannot take, as a value or as a dict key, and what the refusal says.
POISONS: list[tuple[st.SearchStrategy[Any], str]] = [
    (st.sets(st.integers(), max_size=2), "JSON-serializable"),
    (st.binary(max_size=5), "JSON-serializable"),
    (st.builds(object), "JSON-serializable"),
    (st.datetimes(timezones=st.just(UTC)), "JSON-serializable"),
    (st.sampled_from([math.nan, math.inf, -math.inf]), "JSON-serializable"),
    (st.builds(circular), "Circular reference"),
    (TEXT.map(lambda text: f"{text}\x00{text}"), "NUL characters"),
    (st.sampled_from(["\ud800", "a\udfff", "\udc00b"]), "lone surrogate"),
    (st.builds(deep, st.just(100_000)), "nested too deeply"),
    # Deeper than DELAYJOBS["MAX_PAYLOAD_DEPTH"] (64), though JSON encodes it: the admin
    # and the HTTP API could not show it.
    (st.integers(65, 900).map(deep), "MAX_PAYLOAD_DEPTH"),
]
POISONED_KEYS: list[tuple[st.SearchStrategy[Any], str]] = [
    (st.tuples(st.integers()), "JSON-serializable"),
    (st.binary(max_size=3), "JSON-serializable"),
    (st.just(math.nan), "JSON-serializable"),
    (TEXT.map(lambda text: f"{text}\x00"), "NUL characters"),
    (st.just("k\ud83d"), "lone surrogate"),
]


@st.composite
def poisoned_payload(draw: st.DrawFn) -> tuple[Any, str]:
    """A payload with one bad value or key somewhere in it, and what the refusal says."""
    if draw(st.booleans()):
        strategy, says = draw(st.sampled_from(POISONS))
        value = draw(strategy)
    else:
        strategy, says = draw(st.sampled_from(POISONED_KEYS))
        value = {draw(strategy): draw(JSON)}
    for _ in range(draw(st.integers(0, 3))):  # buried in valid lists and dicts
        siblings = draw(st.lists(JSON, max_size=2))
        if draw(st.booleans()):
            value = [*siblings, value]
        else:
            value = {**{str(i): sibling for i, sibling in enumerate(siblings)}, "x": value}
    return value, says


@st.composite
def one_bad_argument(draw: st.DrawFn) -> tuple[dict[str, Any], type[Exception], str]:
    """Valid schedule() arguments but one, the exception expected, what it says."""
    kwargs = draw(schedule_kwargs())
    if draw(st.integers(0, len(BAD_ARGUMENTS))) == 0:
        kwargs["payload"], says = draw(poisoned_payload())
        return kwargs, InvalidJob, says
    name = draw(st.sampled_from(sorted(BAD_ARGUMENTS)))
    strategy, error, says = draw(st.sampled_from(BAD_ARGUMENTS[name]))
    kwargs[name] = draw(strategy)
    # Only the one bad argument: not also "both run_at and delay".
    kwargs.pop({"run_at": "delay", "delay": "run_at"}.get(name, ""), None)
    return kwargs, error, says


# schedule() and schedule_many() ------------------------------------------------------


@WITH_FIXTURES
@given(case=one_bad_argument())
def test_schedule_refuses_one_bad_argument_saying_which(world: World, redis_client, case):
    kwargs, error, says = case
    assert_refused(lambda: delayjobs.schedule(**kwargs), error, says, redis_client)


@WITH_FIXTURES
@given(case=one_bad_argument(), good=st.lists(schedule_kwargs(), max_size=3), data=st.data())
def test_schedule_many_refuses_a_bad_spec_naming_its_index(
    world: World, redis_client, case, good, data
):
    bad, error, says = case
    index = data.draw(st.integers(0, len(good)))
    specs = [*good[:index], bad, *good[index:]]
    assert_refused(lambda: delayjobs.schedule_many(specs), error, says, redis_client)
    assert_refused(lambda: delayjobs.schedule_many(specs), error, f"specs[{index}]", redis_client)


SPEC_SHAPES: list[Refusal] = [
    (not_a(dict), InvalidJob, "must be a dict of schedule() arguments"),
    (
        st.dictionaries(
            HASHABLE.filter(lambda key: key not in SPEC_FIELDS), ANYTHING, min_size=1
        ).map(lambda extra: {"job_type": SCRIPTED, **extra}),
        InvalidJob,
        "has unknown argument",
    ),
    (st.just({"payload": {}}), InvalidJob, "has no job_type"),
]


@WITH_FIXTURES
@given(data=st.data())
def test_schedule_many_refuses_what_is_not_a_spec(world: World, redis_client, data):
    strategy, error, says = data.draw(st.sampled_from(SPEC_SHAPES))
    specs = [{"job_type": SCRIPTED}, data.draw(strategy)]
    assert_refused(lambda: delayjobs.schedule_many(specs), error, f"specs[1] {says}", redis_client)


@WITH_FIXTURES
@given(specs=ANYTHING.filter(lambda value: not isinstance(value, list)))
def test_schedule_many_refuses_what_is_not_a_list(world: World, redis_client, specs):
    assert_refused(
        lambda: delayjobs.schedule_many(specs), InvalidJob, "takes a list of dicts", redis_client
    )


@pytest.mark.parametrize(
    ("key", "replace", "reason"),
    [
        ("held:scheduled", False, "pass replace=True"),
        ("held:running", True, "it is running and cannot be moved"),
    ],
)
def test_a_key_held_by_an_active_job_is_refused(world: World, redis_client, key, replace, reason):
    for call in (
        lambda: delayjobs.schedule(SCRIPTED, key=key, replace=replace),
        lambda: delayjobs.schedule_many(
            [{"job_type": SCRIPTED, "key": "fresh:1"}, {"job_type": SCRIPTED, "key": key}]
        ),
    ):
        assert_refused(call, DuplicateJob, f"key {key!r}", redis_client)
    assert_refused(
        lambda: delayjobs.schedule(SCRIPTED, key=key, replace=replace),
        DuplicateJob,
        reason,
        redis_client,
    )


def test_schedule_many_refuses_a_key_twice_in_the_batch(world: World, redis_client):
    specs = [{"job_type": SCRIPTED, "key": "fresh:1"}, {"job_type": "tests.noop", "key": "fresh:1"}]
    assert_refused(lambda: delayjobs.schedule_many(specs), InvalidJob, "twice", redis_client)


def expected_fields(kwargs: dict[str, Any], jobtype: Any) -> dict[str, Any]:
    return {
        "job_type": kwargs["job_type"],
        "payload": {} if kwargs["payload"] is None else json.loads(json.dumps(kwargs["payload"])),
        "key": kwargs.get("key"),
        "queue": kwargs.get("queue") or jobtype.queue,
        "max_attempts": kwargs.get("max_attempts") or jobtype.max_attempts,
    }


def stored_fields(job: DelayedJob) -> dict[str, Any]:
    job.refresh_from_db()
    return {
        name: getattr(job, name) for name in ("job_type", "payload", "key", "queue", "max_attempts")
    }


@WITH_FIXTURES
@given(kwargs=schedule_kwargs())
def test_valid_arguments_are_scheduled_as_given(world: World, kwargs):
    jobtype = registry.get(kwargs["job_type"])
    before = timezone.now()

    def schedule_and_read() -> tuple[dict[str, Any], datetime]:
        job = delayjobs.schedule(**kwargs)
        return stored_fields(job), job.run_at

    fields, run_at = undone(schedule_and_read)
    assert fields == expected_fields(kwargs, jobtype)
    if "run_at" in kwargs:
        assert run_at == kwargs["run_at"]
    else:
        assert run_at >= before + kwargs.get("delay", timedelta(0))


@WITH_FIXTURES
@given(
    specs=st.lists(schedule_kwargs(), max_size=5, unique_by=lambda spec: spec.get("key", id(spec)))
)
def test_valid_specs_are_all_scheduled_in_order(world: World, specs):
    def schedule_and_read() -> list[dict[str, Any]]:
        return [stored_fields(job) for job in delayjobs.schedule_many(specs)]

    assert undone(schedule_and_read) == [
        expected_fields(spec, registry.get(spec["job_type"])) for spec in specs
    ]


# The payload size limit --------------------------------------------------------------


def json_bytes(payload: Any) -> int:
    return len(json.dumps(payload, ensure_ascii=False).encode())


@WITH_FIXTURES
@given(payload=JSON, slack=st.integers(-3, 3))
def test_a_payload_over_the_limit_is_refused_and_one_within_it_is_not(
    world: World, redis_client, payload, slack
):
    size = json_bytes(payload)
    limit = max(1, size + slack)
    with override_settings(DELAYJOBS={**django_settings.DELAYJOBS, "MAX_PAYLOAD_BYTES": limit}):
        if size <= limit:
            assert undone(lambda: delayjobs.schedule(SCRIPTED, payload)).pk is not None
        else:
            says = f"payload is {size} bytes of JSON, over the limit of {limit} bytes"
            call = lambda: delayjobs.schedule(SCRIPTED, payload)  # noqa: E731
            assert_refused(call, InvalidJob, says, redis_client)
            assert_refused(call, InvalidJob, "DELAYJOBS['MAX_PAYLOAD_BYTES']", redis_client)


def test_the_default_limit_is_64_kib_and_none_lifts_it(world: World, redis_client):
    limit = DEFAULTS["MAX_PAYLOAD_BYTES"]
    assert limit == 64 * 1024
    envelope = json_bytes({"s": ""})
    room = limit - envelope
    fits = {"s": "é" * (room // 2) + "x" * (room % 2)}  # "é" is two bytes in UTF-8
    assert json_bytes(fits) == limit
    over = {"s": fits["s"] + "x"}
    assert undone(lambda: delayjobs.schedule(SCRIPTED, fits)).pk is not None
    assert_refused(lambda: delayjobs.schedule(SCRIPTED, over), InvalidJob, str(limit), redis_client)
    with override_settings(DELAYJOBS={**django_settings.DELAYJOBS, "MAX_PAYLOAD_BYTES": None}):
        assert undone(lambda: delayjobs.schedule(SCRIPTED, {"s": "x" * 2 * limit})).pk


# cancel(), reschedule(), retry() -----------------------------------------------------


BAD_JOB: list[Refusal] = [
    (not_a(int, DelayedJob, type(None)), InvalidJob, "job must be a DelayedJob or its integer id"),
    (st.builds(DelayedJob, job_type=st.just(SCRIPTED)), InvalidJob, "unsaved DelayedJob"),
]
# Bad ways to name the job for cancel() and reschedule(), as (job, key) arguments.
BAD_TARGETS: list[tuple[st.SearchStrategy[dict[str, Any]], type[Exception], str]] = [
    *[(strategy.map(lambda job: {"job": job}), error, says) for strategy, error, says in BAD_JOB],
    *[(strategy.map(lambda key: {"key": key}), error, says) for strategy, error, says in BAD_KEY],
    (st.just({}), InvalidJob, "Give either a job"),
    (st.builds(dict, job=st.integers(), key=FRESH_KEY), InvalidJob, "not both"),
]


@WITH_FIXTURES
@given(data=st.data())
def test_cancel_refuses_a_bad_job_or_key(world: World, redis_client, data):
    strategy, error, says = data.draw(st.sampled_from(BAD_TARGETS))
    target = data.draw(strategy)
    assert_refused(lambda: delayjobs.cancel(**target), error, says, redis_client)


def missing_ids(world: World) -> st.SearchStrategy[int]:
    """Ids of no job, from negative to far past any database's bigint."""
    return st.integers().filter(lambda pk: pk not in world.ids)


@WITH_FIXTURES
@given(data=st.data())
def test_cancel_of_no_scheduled_job_cancels_nothing(world: World, redis_client, data):
    not_scheduled = [world.running, world.key_taken, *world.finished.values()]
    target = data.draw(
        missing_ids(world).map(lambda pk: {"job": pk})
        | st.sampled_from(not_scheduled).map(lambda job: {"job": job})
        | st.sampled_from(not_scheduled).map(lambda job: {"job": job.pk})
        | FRESH_KEY.map(lambda key: {"key": key})
        | st.just({"key": "held:running"})
    )
    with unchanged(redis_client):
        assert delayjobs.cancel(**target) == 0


@WITH_FIXTURES
@given(data=st.data())
def test_reschedule_refuses_a_bad_job_key_or_time(world: World, redis_client, data):
    when: dict[str, Any] = {}
    if data.draw(st.booleans()):
        strategy, error, says = data.draw(st.sampled_from(BAD_TARGETS))
        target = data.draw(strategy)
    else:
        target = {"job": world.scheduled}
        argument = data.draw(st.sampled_from(["run_at", "delay", "both"]))
        if argument == "both":
            when, error, says = (
                {"run_at": data.draw(RUN_AT), "delay": data.draw(DELAY)},
                InvalidJob,
                "not both",
            )
        else:
            strategy, error, says = data.draw(
                st.sampled_from(BAD_RUN_AT if argument == "run_at" else BAD_DELAY)
            )
            when = {argument: data.draw(strategy)}
    assert_refused(lambda: delayjobs.reschedule(**target, **when), error, says, redis_client)


@WITH_FIXTURES
@given(data=st.data())
def test_reschedule_of_a_missing_or_unscheduled_job_is_refused(world: World, redis_client, data):
    cases = [
        (missing_ids(world).map(lambda pk: {"job": pk}), JobNotFound, "no such job"),
        (FRESH_KEY.map(lambda key: {"key": key}), JobNotFound, "no such job"),
        (
            st.sampled_from([world.running, world.key_taken, *world.finished.values()]).map(
                lambda job: {"job": job}
            ),
            InvalidTransition,
            "only a scheduled job moves",
        ),
        (st.just({"key": "held:running"}), InvalidTransition, "it is running"),
    ]
    strategy, error, says = data.draw(st.sampled_from(cases))
    target = data.draw(strategy)
    when = data.draw(
        st.fixed_dictionaries({}, optional={"run_at": RUN_AT}) | st.builds(dict, delay=DELAY)
    )
    assert_refused(lambda: delayjobs.reschedule(**target, **when), error, says, redis_client)


@WITH_FIXTURES
@given(when=st.builds(dict, run_at=RUN_AT) | st.builds(dict, delay=DELAY), by_key=st.booleans())
def test_reschedule_moves_a_scheduled_job_to_any_valid_time(world: World, when, by_key):
    target = {"key": "held:scheduled"} if by_key else {"job": world.scheduled.pk}
    before = timezone.now()

    def reschedule_and_read() -> datetime:
        job = delayjobs.reschedule(**target, **when)
        job.refresh_from_db()
        return job.run_at

    run_at = undone(reschedule_and_read)
    if "run_at" in when:
        assert run_at == when["run_at"]
    else:
        assert run_at >= before + when["delay"]


@WITH_FIXTURES
@given(data=st.data())
def test_retry_refuses_what_it_cannot_retry(world: World, redis_client, data):
    cases = [
        *BAD_JOB,
        (st.just(None), InvalidJob, "Give either a job"),
        (missing_ids(world), JobNotFound, "does not exist"),
        (
            st.sampled_from([world.scheduled, world.running]),
            InvalidTransition,
            "only a finished job",
        ),
        (st.just(world.key_taken), DuplicateJob, "held:scheduled"),
    ]
    strategy, error, says = data.draw(st.sampled_from(cases))
    job = data.draw(strategy)
    assert_refused(lambda: delayjobs.retry(job), error, says, redis_client)


@pytest.mark.parametrize("status", [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED])
def test_retry_runs_a_finished_job_again(world: World, status):
    job = undone(lambda: delayjobs.retry(world.finished[status].pk))
    assert (job.status, job.attempts) == (JobStatus.SCHEDULED, 0)


# The commands' options -----------------------------------------------------------------


def consume(*args: str, **options: Any) -> None:
    """One burst of the consumer, without the pre-loader: returns if the options pass.

    The command tests use no ``world``: were an option let through, the burst would then
    find nothing due and return (failing the test), not claim the world's job, whose row
    this test's open transaction holds.
    """
    call_command(
        "run_delay_consumer", "--processes", "1", *args, "--burst", "--no-preload", **options
    )


def bad_concurrency_texts() -> st.SearchStrategy[str]:
    numbers = st.integers(max_value=0) | st.integers(min_value=MAX_CONCURRENCY + 1)
    return numbers.map(str) | st.text(max_size=10).filter(lambda text: not is_int(text))


def is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


@WITH_FIXTURES
@given(value=bad_concurrency_texts())
def test_consumer_refuses_a_bad_concurrency_on_the_command_line(redis_client, value):
    call = lambda: consume(f"--concurrency={value}")  # noqa: E731
    assert_refused(call, CommandError, "argument --concurrency: must be", redis_client)


def is_concurrency(value: Any) -> bool:
    """1 to MAX_CONCURRENCY, as an int or (as on a command line) a string."""
    if isinstance(value, str):
        return is_int(value) and 1 <= int(value) <= MAX_CONCURRENCY
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_CONCURRENCY


BAD_CONCURRENCY = ANYTHING.filter(lambda value: value is not None and not is_concurrency(value))


@WITH_FIXTURES
@given(value=BAD_CONCURRENCY)
def test_consumer_refuses_a_bad_concurrency_from_call_command(redis_client, value):
    call = lambda: consume(concurrency=value)  # noqa: E731
    assert_refused(call, CommandError, "--concurrency: must be", redis_client)


@WITH_FIXTURES
@given(value=BAD_CONCURRENCY)
def test_consumer_refuses_a_bad_concurrency_setting(redis_client, value):
    # call_command skips the system checks, which would have reported it (E007).
    with override_settings(DELAYJOBS={**django_settings.DELAYJOBS, "CONCURRENCY": value}):
        assert_refused(consume, CommandError, "DELAYJOBS['CONCURRENCY'] must be", redis_client)


#: Refused by --processes, whether typed or given to call_command (which passes them as
#: they are). Never one it accepts: that would fork the test's own process.
BAD_PROCESSES_TEXTS = ["0", "-1", str(MAX_PROCESSES + 1), "abc", "", "1.5", "Auto", "auto "]
BAD_PROCESSES = [0, -1, MAX_PROCESSES + 1, 10**30, True, 2.0, "0", "many", [], {"n": 2}]


@pytest.mark.parametrize("value", BAD_PROCESSES_TEXTS)
def test_consumer_refuses_a_bad_number_of_processes_on_the_command_line(redis_client, value):
    call = lambda: consume(f"--processes={value}")  # noqa: E731
    says = "argument --processes: use 'auto' (one per usable CPU) or a whole number from 1 to 64"
    assert_refused(call, CommandError, says, redis_client)


@pytest.mark.parametrize("value", BAD_PROCESSES)
def test_consumer_refuses_a_bad_number_of_processes_from_call_command(redis_client, value):
    call = lambda: consume(processes=value)  # noqa: E731
    assert_refused(call, CommandError, "--processes: use 'auto'", redis_client)


@pytest.mark.parametrize("value", [0, MAX_PROCESSES + 1, "2", True])
def test_consumer_refuses_a_bad_processes_setting(redis_client, value):
    # Without --processes, the setting is read (call_command skips the checks: E019).
    with override_settings(DELAYJOBS={**django_settings.DELAYJOBS, "PROCESSES": value}):
        call = lambda: call_command("run_delay_consumer", "--burst", "--no-preload")  # noqa: E731
        assert_refused(call, CommandError, "DELAYJOBS['PROCESSES'] must be", redis_client)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--executor", "celery"],
            "--processes 2 with --executor celery: one consumer process claims and publishes",
        ),
        (["--worker-id", "w" * 254], "(process 1): use 1-255 printable characters"),
        (["--celery-app", "sampleproject"], "--celery-app is for the Celery executor"),
    ],
)
def test_several_processes_refuse_what_every_one_would_refuse_before_any_starts(
    redis_client, args, says
):
    call = lambda: consume(*args, processes=2)  # noqa: E731
    assert_refused(call, CommandError, says, redis_client)


BAD_QUEUES = st.sampled_from(["", "a b", "q" * 101, "default\n", "x{y}"]) | st.text(
    max_size=110
).filter(lambda queue: not QUEUE_NAME.fullmatch(queue))
# Stored in job rows: at most 255 characters, and printable (no NUL, no newline...).
BAD_WORKER_IDS = st.sampled_from(["", "w" * 256, "a\nb", "nul\x00", "\udc80"]) | st.text(
    max_size=300
).filter(lambda worker: not (0 < len(worker) <= 255 and worker.isprintable()))


@WITH_FIXTURES
@given(data=st.data())
def test_consumer_refuses_a_bad_queue_or_worker_id(redis_client, data):
    option, strategy, says = data.draw(
        st.sampled_from(
            [
                ("--queue", BAD_QUEUES, "use 1-100 characters of letters, digits and '_.-'"),
                ("--worker-id", BAD_WORKER_IDS, "use 1-255 printable characters"),
            ]
        )
    )
    value = data.draw(strategy)
    good = ["--queue", "default"] if option == "--worker-id" else []
    # argparse reads a separate value that starts with "-" as an option ("expected one
    # argument"): such a value reaches the command only as --queue=VALUE, tested below.
    if not value.startswith("-"):
        assert_refused(lambda: consume(*good, option, value), CommandError, says, redis_client)
    assert_refused(
        lambda: consume(*good, f"{option}={value}"), CommandError, f"{option} ", redis_client
    )


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"queues": "default"}, "--queue: give a list of queue names"),
        ({"queues": []}, "--queue: give a list of queue names"),
        ({"queues": ["default", 7]}, "--queue 7: use 1-100"),
        ({"worker_id": 42}, "--worker-id 42: use 1-255"),
        ({"burst": "no"}, "--burst is a flag"),
        ({"preload": "yes"}, "--no-preload (preload) is a flag"),
    ],
)
def test_consumer_refuses_bad_options_from_call_command(redis_client, options, says):
    options = {"burst": True, "preload": False, **options}
    assert_refused(
        lambda: call_command("run_delay_consumer", **options), CommandError, says, redis_client
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--concurrency", "1", "--queue", "q" * 100],
        ["--concurrency", str(MAX_CONCURRENCY), "--queue", "default", "--queue", "other"],
        ["--worker-id", "w" * 255],
    ],
)
def test_consumer_accepts_the_extremes_of_valid_options(args):
    consume(*args)  # a burst over nothing due: it returns


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--loop=yes"], "ignored explicit argument 'yes'"),
        (["--loop", "forever"], "unrecognized arguments: forever"),
        (["--interval", "5"], "unrecognized arguments: --interval"),
    ],
)
def test_preloader_command_refuses_bad_options(redis_client, args, says):
    assert_refused(
        lambda: call_command("preload_delay_jobs", *args), CommandError, says, redis_client
    )


# Settings ---------------------------------------------------------------------------------


def checked_settings(delayjobs_setting: Any) -> list[checks.CheckMessage]:
    with override_settings(DELAYJOBS=delayjobs_setting):
        return check_settings()


def positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def seconds(value: Any) -> timedelta | None:
    """A valid duration setting as a timedelta, None if it is not one."""
    if isinstance(value, timedelta):
        duration = value
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        try:
            duration = timedelta(seconds=value)
        except OverflowError:
            return None
    else:
        return None
    return duration if timedelta(0) < duration <= MAX_DURATION else None


def is_timeout(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= MAX_TIMEOUT_SECONDS
    )


DURATION_KEYS = ("PRELOAD_INTERVAL", "PRELOAD_WINDOW", "IDLE_TIMEOUT", "DATABASE_POLL_INTERVAL")
# Each setting: is a value valid, and which check id reports it when it is not.
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "REDIS_URL": (lambda value: value is None or value in VALID_URLS, "delayjobs.E003"),
    "KEY_PREFIX": (
        lambda value: isinstance(value, str) and bool(value) and not set(value) & set("{} "),
        "delayjobs.E009",
    ),
    **{
        name: (lambda value: seconds(value) is not None, "delayjobs.E005") for name in DURATION_KEYS
    },
    "PRELOAD_BATCH_SIZE": (positive_int, "delayjobs.E007"),
    "CONCURRENCY": (
        lambda value: positive_int(value) and value <= MAX_CONCURRENCY,
        "delayjobs.E007",
    ),
    "PROCESSES": (
        lambda value: value == "auto" or (positive_int(value) and value <= MAX_PROCESSES),
        "delayjobs.E019",
    ),
    "REDIS_CONNECT_TIMEOUT": (is_timeout, "delayjobs.E010"),
    "REDIS_SOCKET_TIMEOUT": (is_timeout, "delayjobs.E010"),
    "QUEUE_CONCURRENCY": (
        lambda value: (
            isinstance(value, dict)
            and all(
                isinstance(queue, str) and QUEUE_NAME.fullmatch(queue) and positive_int(limit)
                for queue, limit in value.items()
            )
        ),
        "delayjobs.E011",
    ),
    "MAX_PAYLOAD_BYTES": (lambda value: value is None or positive_int(value), "delayjobs.E012"),
}
VALID_URLS = [
    "redis://127.0.0.1:6379/0",
    "rediss://user:secret@redis.example:6380/2",
    "unix:///tmp/r.sock",
]
POSITIVE_SECONDS = (
    st.integers(1, int(MAX_DURATION.total_seconds()))
    | st.floats(min_value=0.001, max_value=MAX_DURATION.total_seconds())
    | st.timedeltas(min_value=timedelta(milliseconds=1), max_value=MAX_DURATION)
)
VALID_SETTINGS: dict[str, st.SearchStrategy[Any]] = {
    "REDIS_URL": st.sampled_from([None, *VALID_URLS]),
    "KEY_PREFIX": st.text(min_size=1, max_size=20).filter(lambda text: not set(text) & set("{} ")),
    "IDLE_TIMEOUT": POSITIVE_SECONDS,
    "DATABASE_POLL_INTERVAL": POSITIVE_SECONDS,
    "PRELOAD_BATCH_SIZE": st.integers(1, 10**9),
    "CONCURRENCY": st.integers(1, MAX_CONCURRENCY),
    "PROCESSES": st.just("auto") | st.integers(1, MAX_PROCESSES),
    "REDIS_CONNECT_TIMEOUT": st.integers(1, MAX_TIMEOUT_SECONDS)
    | st.floats(0.001, MAX_TIMEOUT_SECONDS),
    "REDIS_SOCKET_TIMEOUT": st.integers(1, MAX_TIMEOUT_SECONDS)
    | st.floats(0.001, MAX_TIMEOUT_SECONDS),
    "QUEUE_CONCURRENCY": st.dictionaries(QUEUE, st.integers(1, 10**6), max_size=3),
    "MAX_PAYLOAD_BYTES": st.none() | st.integers(1, 10**12),
}
# Garbage of many types for any setting, plus values close to valid ones.
GARBAGE = (
    ANYTHING
    | st.sampled_from(
        ["", "redis://host:port/0", "http://127.0.0.1", "a b", "{x}", math.nan, -math.inf, 10**30]
    )
    | st.dictionaries(HASHABLE, ANYTHING, max_size=3)
    | st.timedeltas(max_value=timedelta(0))
)


# Invalid values close to valid ones, which garbage would seldom hit.
DURATION_MISSES = [0, -1, 1e-7, math.nan, math.inf, timedelta(0), -MAX_DURATION, 10**30, True]
TIMEOUT_MISSES = [0, -0.5, math.nan, math.inf, MAX_TIMEOUT_SECONDS + 1, 1e300, True, "1"]
NEAR_MISSES: dict[str, list[Any]] = {
    "REDIS_URL": ["", "127.0.0.1:6379", "http://h:6379", "redis://h:port/0", "redis://h:99999"],
    "KEY_PREFIX": ["", "a b", "{x}", 7, None],
    **{name: [*DURATION_MISSES, MAX_DURATION * 2, timedelta.max] for name in DURATION_KEYS},
    "PRELOAD_BATCH_SIZE": [0, -5, 1.0, True, "100", None],
    "CONCURRENCY": [0, MAX_CONCURRENCY + 1, 2.0, False],
    "PROCESSES": [0, -1, MAX_PROCESSES + 1, 2.0, True, "2", "Auto", "", None],
    "REDIS_CONNECT_TIMEOUT": TIMEOUT_MISSES,
    "REDIS_SOCKET_TIMEOUT": TIMEOUT_MISSES,
    "QUEUE_CONCURRENCY": [{"sms": 0}, {"": 1}, {"a b": 1}, {"sms\n": 2}, {1: 1}, ["sms"], None],
    "MAX_PAYLOAD_BYTES": [0, -1, 1.5, True, "64k", math.inf],
}


@st.composite
def valid_settings(draw: st.DrawFn) -> dict[str, Any]:
    """A valid DELAYJOBS dict: some settings given, the others left to their defaults."""
    config = draw(st.fixed_dictionaries({}, optional=VALID_SETTINGS))
    # Interval and window together: the window must be longer than the interval (E006).
    interval = draw(st.timedeltas(timedelta(milliseconds=1), MAX_DURATION / 2))
    window = interval + draw(st.timedeltas(timedelta(milliseconds=1), MAX_DURATION / 2))
    as_seconds = draw(st.booleans())
    config["PRELOAD_INTERVAL"] = interval.total_seconds() if as_seconds else interval
    config["PRELOAD_WINDOW"] = window.total_seconds() if as_seconds else window
    return config


@PROFILE
@given(config=valid_settings())
def test_valid_settings_pass_every_check(config):
    assert checked_settings(config) == []


@PROFILE
@given(config=valid_settings(), data=st.data())
def test_each_bad_setting_is_reported_with_its_id_and_a_hint(config, data):
    bad_names = data.draw(st.sets(st.sampled_from(sorted(RULES)), min_size=1, max_size=4))
    for name in bad_names:
        is_valid = RULES[name][0]
        garbage = GARBAGE.filter(lambda value, valid=is_valid: not valid(value))
        config[name] = data.draw(st.sampled_from(NEAR_MISSES[name]) | garbage)
    messages = checked_settings(config)
    assert sorted(message.id for message in messages) == sorted(
        RULES[name][1] for name in bad_names
    )
    for message in messages:
        assert message.level == checks.ERROR
        assert message.hint
    for name in bad_names:
        assert any(name in message.msg for message in messages), f"no message names {name}"


@PROFILE
@given(
    config=st.dictionaries(st.sampled_from(sorted(DEFAULTS)) | HASHABLE, GARBAGE, max_size=8)
    | GARBAGE
)
def test_no_setting_makes_the_checks_crash(config):
    messages = checked_settings(config)
    for message in messages:
        assert re.fullmatch(r"delayjobs\.(E0\d\d|W001)", message.id), message.id
        assert message.hint
        assert message.level == (checks.WARNING if message.id.endswith("W001") else checks.ERROR)
    if not isinstance(config, dict):
        assert [message.id for message in messages] == ["delayjobs.E001"]
        return
    unknown = [name for name in config if name not in DEFAULTS]
    warned = [message.msg for message in messages if message.id == "delayjobs.W001"]
    assert len(warned) == len(unknown)
    # REDIS_URL with a REDIS_CACHE_ALIAS is E002, whatever the URL (tests/unit/test_checks.py).
    both_redis = bool(config.get("REDIS_URL") and config.get("REDIS_CACHE_ALIAS"))
    for name, value in config.items():
        if name in RULES and not RULES[name][0](value) and not (both_redis and name == "REDIS_URL"):
            assert RULES[name][1] in [message.id for message in messages], (name, value)
