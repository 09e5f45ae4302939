"""System checks of the DELAYJOBS settings, and validation of job type declarations."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

import delayjobs
from delayjobs import conf
from delayjobs.checks import check_settings
from delayjobs.jobtypes import registry


@pytest.fixture
def delayjobs_settings(settings):
    """Set DELAYJOBS keys on top of the test settings: ``delayjobs_settings(KEY=value)``."""

    def update(**values):
        settings.DELAYJOBS = {**settings.DELAYJOBS, **values}

    return update


def ids(messages) -> list[str]:
    return [message.id for message in messages]


def delayjobs_ids(messages) -> list[str]:
    return [i for i in ids(messages) if i and i.startswith("delayjobs.")]


# A good configuration ----------------------------------------------------------------


def test_durations_may_be_timedeltas(delayjobs_settings):
    delayjobs_settings(
        PRELOAD_INTERVAL=timedelta(seconds=2),
        PRELOAD_WINDOW=timedelta(seconds=10),
        IDLE_TIMEOUT=0.5,
    )
    assert check_settings() == []


def test_defaults_pass_when_delayjobs_is_unset(settings):
    del settings.DELAYJOBS
    assert check_settings() == []


def test_a_django_redis_cache_alias_passes(settings, delayjobs_settings):
    settings.CACHES = {
        **settings.CACHES,
        "jobs": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
        },
    }
    delayjobs_settings(REDIS_URL=None, REDIS_CACHE_ALIAS="jobs")
    assert check_settings() == []


@pytest.mark.parametrize(
    ("options", "missing"),
    [
        (None, "SOCKET_CONNECT_TIMEOUT and no SOCKET_TIMEOUT"),
        ({"SOCKET_CONNECT_TIMEOUT": 1}, "SOCKET_TIMEOUT:"),
        ({"SOCKET_TIMEOUT": 2, "SOCKET_CONNECT_TIMEOUT": None}, "SOCKET_CONNECT_TIMEOUT:"),
    ],
)
def test_w003_a_cache_alias_without_socket_timeouts(settings, delayjobs_settings, options, missing):
    cache = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1"}
    if options is not None:
        cache["OPTIONS"] = options
    settings.CACHES = {**settings.CACHES, "jobs": cache}
    delayjobs_settings(REDIS_URL=None, REDIS_CACHE_ALIAS="jobs")
    [message] = check_settings()
    assert message.id == "delayjobs.W003"
    assert message.level == checks.WARNING
    assert f"sets no {missing}" in message.msg
    assert "'SOCKET_TIMEOUT': 2" in message.hint


# Each check id -----------------------------------------------------------------------


def test_e001_delayjobs_not_a_dict(settings):
    settings.DELAYJOBS = "redis://127.0.0.1:6379/0"
    [message] = check_settings()
    assert message.id == "delayjobs.E001"
    assert message.level == checks.ERROR
    assert message.hint


def test_e002_both_redis_url_and_cache_alias(delayjobs_settings):
    delayjobs_settings(REDIS_CACHE_ALIAS="default")
    assert ids(check_settings()) == ["delayjobs.E002"]


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "127.0.0.1:6379", 6379])
def test_e003_redis_url_not_a_redis_url(delayjobs_settings, url):
    delayjobs_settings(REDIS_URL=url)
    assert ids(check_settings()) == ["delayjobs.E003"]


@pytest.mark.parametrize(
    "url", ["redis+sentinel://127.0.0.1:26379/mymaster/0", "sentinel://127.0.0.1:26379"]
)
def test_e003_sentinel_url_points_to_the_cache_alias(delayjobs_settings, url):
    delayjobs_settings(REDIS_URL=url)
    [message] = check_settings()
    assert message.id == "delayjobs.E003"
    assert "REDIS_CACHE_ALIAS" in message.hint and "SentinelConnectionFactory" in message.hint


def test_e004_cache_alias_not_in_caches(delayjobs_settings):
    delayjobs_settings(REDIS_URL=None, REDIS_CACHE_ALIAS="nope")
    [message] = check_settings()
    assert message.id == "delayjobs.E004"
    assert "nope" in message.msg


def test_e004_cache_alias_not_a_django_redis_cache(settings, delayjobs_settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    delayjobs_settings(REDIS_URL=None, REDIS_CACHE_ALIAS="default")
    assert ids(check_settings()) == ["delayjobs.E004"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PRELOAD_INTERVAL", "10"),
        ("PRELOAD_INTERVAL", 0),
        ("PRELOAD_INTERVAL", -1),
        ("PRELOAD_INTERVAL", True),
        ("PRELOAD_WINDOW", float("nan")),
        ("PRELOAD_WINDOW", float("inf")),
        ("PRELOAD_WINDOW", timedelta(0)),
        ("IDLE_TIMEOUT", None),
        ("IDLE_TIMEOUT", -0.5),
    ],
)
def test_e005_duration_not_positive(delayjobs_settings, name, value):
    delayjobs_settings(**{name: value})
    assert ids(check_settings()) == ["delayjobs.E005"]


@pytest.mark.parametrize(("interval", "window"), [(10, 10), (10, 5), (timedelta(minutes=1), 30)])
def test_e006_window_not_longer_than_interval(delayjobs_settings, interval, window):
    delayjobs_settings(PRELOAD_INTERVAL=interval, PRELOAD_WINDOW=window)
    [message] = check_settings()
    assert message.id == "delayjobs.E006"
    assert "PRELOAD_WINDOW" in message.msg
    assert message.hint


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PRELOAD_BATCH_SIZE", 0),
        ("PRELOAD_BATCH_SIZE", "1000"),
        ("PRELOAD_BATCH_SIZE", 10.0),
        ("CONCURRENCY", -1),
        ("CONCURRENCY", True),
    ],
)
def test_e007_count_not_a_positive_int(delayjobs_settings, name, value):
    delayjobs_settings(**{name: value})
    assert ids(check_settings()) == ["delayjobs.E007"]


@pytest.mark.parametrize("value", [0, 65, -1, True, 2.0, "2", "many", None])
def test_e019_processes_neither_auto_nor_1_to_64(delayjobs_settings, value):
    delayjobs_settings(PROCESSES=value)
    [message] = check_settings()
    assert message.id == "delayjobs.E019"
    assert "'auto' (one per usable CPU) or a whole number from 1 to 64" in message.msg


@pytest.mark.parametrize("value", ["auto", 1, 64])
def test_processes_auto_or_1_to_64_pass(delayjobs_settings, value):
    delayjobs_settings(PROCESSES=value)
    assert check_settings() == []


def test_e008_use_tz_off(settings):
    settings.USE_TZ = False
    assert ids(check_settings()) == ["delayjobs.E008"]


@pytest.mark.parametrize("prefix", ["", "a{b}", "my app", 7, None])
def test_e009_bad_key_prefix(delayjobs_settings, prefix):
    delayjobs_settings(KEY_PREFIX=prefix)
    assert ids(check_settings()) == ["delayjobs.E009"]


@pytest.mark.parametrize(
    ("name", "value"),
    [("REDIS_CONNECT_TIMEOUT", 0), ("REDIS_CONNECT_TIMEOUT", "1"), ("REDIS_SOCKET_TIMEOUT", True)],
)
def test_e010_bad_redis_timeout(delayjobs_settings, name, value):
    delayjobs_settings(**{name: value})
    assert ids(check_settings()) == ["delayjobs.E010"]


def test_w001_unknown_setting_is_a_warning(delayjobs_settings):
    delayjobs_settings(PRELOAD_WINDOWS=60)
    [message] = check_settings()
    assert message.id == "delayjobs.W001"
    assert message.level == checks.WARNING
    assert "PRELOAD_WINDOWS" in message.msg


def test_several_problems_are_all_reported(delayjobs_settings):
    delayjobs_settings(CONCURRENCY=0, KEY_PREFIX="", TYPO=1)
    assert sorted(ids(check_settings())) == ["delayjobs.E007", "delayjobs.E009", "delayjobs.W001"]


# Job type declarations ---------------------------------------------------------------


@pytest.fixture
def clean_registry() -> Iterator[None]:
    """Whatever a test registers is gone afterwards; what was registered before stays."""
    before = {name: registry.get(name) for name in registry.names()}
    yield
    for name in registry.names():
        if name not in before:
            registry.remove(name)
    assert {name: registry.get(name) for name in registry.names()} == before


def make_type(**attrs) -> type[delayjobs.JobType]:
    attrs.setdefault("name", "tests.temporary")
    if attrs.pop("with_execute", True):
        attrs.setdefault("execute", lambda self, job: None)
    return type("Temporary", (delayjobs.JobType,), attrs)


def test_register_adds_a_valid_job_type(clean_registry):
    cls = delayjobs.register(make_type(queue="emails", max_attempts=None))
    assert cls.name in registry
    assert type(registry.get(cls.name)) is cls
    assert "emails" in registry.queues()
    assert repr(registry.get(cls.name)) == "<JobType 'tests.temporary' queue='emails'>"


@pytest.mark.parametrize("thing", [object, object(), "tests.scripted", len])
def test_register_refuses_what_is_not_a_job_type_class(clean_registry, thing):
    with pytest.raises(ImproperlyConfigured, match="JobType subclass"):
        delayjobs.register(thing)


def test_register_refuses_a_job_type_without_execute(clean_registry):
    with pytest.raises(ImproperlyConfigured, match="execute"):
        delayjobs.register(make_type(with_execute=False))
    assert "tests.temporary" not in registry


@pytest.mark.parametrize(
    ("attrs", "attribute"),
    [
        ({"name": ""}, "name"),
        ({"name": "has space"}, "name"),
        ({"name": "x" * 201}, "name"),
        ({"name": 5}, "name"),
        ({"queue": ""}, "queue"),
        ({"queue": "a b"}, "queue"),
        ({"queue": "a{b}"}, "queue"),
        ({"queue": None}, "queue"),
        ({"queue": "default\n"}, "queue"),
        ({"name": "tests.x\n"}, "name"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": -2}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"max_attempts": "3"}, "max_attempts"),
        ({"max_attempts": 2.0}, "max_attempts"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"concurrency": "2"}, "concurrency"),
        ({"time_to_run": 30}, "time_to_run"),
        ({"time_to_run": timedelta(0)}, "time_to_run"),
        ({"time_to_run": timedelta(seconds=-1)}, "time_to_run"),
        ({"retry_backoff_base": 1}, "retry_backoff_base"),
        ({"retry_backoff_cap": timedelta(0)}, "retry_backoff_cap"),
        # Durations past any sensible bound overflow at claim or retry time.
        ({"time_to_run": timedelta.max}, "time_to_run"),
        ({"time_to_run": timedelta(days=8)}, "time_to_run"),
        ({"retry_backoff_base": timedelta.max}, "retry_backoff_base"),
        ({"retry_backoff_cap": timedelta(days=367)}, "retry_backoff_cap"),
        ({"max_lateness": timedelta.max}, "max_lateness"),
        ({"max_lateness": timedelta(0)}, "max_lateness"),
    ],
)
def test_register_refuses_a_bad_declaration_naming_the_attribute(clean_registry, attrs, attribute):
    cls = make_type(**attrs)
    with pytest.raises(ImproperlyConfigured, match=attribute):
        delayjobs.register(cls)
    assert cls.name not in registry


def test_the_largest_bounded_durations_are_accepted(clean_registry):
    cls = make_type(
        name="tests.bounded",
        time_to_run=timedelta(days=7),
        retry_backoff_cap=timedelta(days=366),
        max_lateness=timedelta(days=366),
    )
    assert delayjobs.register(cls) is cls


def test_a_job_type_changed_after_registration_fails_the_system_check(clean_registry):
    cls = delayjobs.register(make_type(name="tests.changed_later"))
    cls.time_to_run = timedelta.max  # as a class attribute read from a setting might be
    # Only delayjobs' checks: Django's model checks query SQLite's features (no database
    # in a unit test).
    errors = [e for e in checks.run_checks(tags=["delayjobs"]) if e.id == "delayjobs.E101"]
    assert [e.msg for e in errors] == [
        f"{cls.__module__}.{cls.__qualname__}.time_to_run must be a timedelta from 1 ms to "
        f"7 days; got {timedelta.max!r}."
    ]


def test_register_refuses_a_second_class_with_the_same_name(clean_registry):
    first = delayjobs.register(make_type(name="tests.twice"))
    second = make_type(name="tests.twice")
    second.__qualname__ = "OtherTemporary"
    with pytest.raises(ImproperlyConfigured, match="registered twice"):
        delayjobs.register(second)
    assert type(registry.get("tests.twice")) is first


def test_register_refuses_a_class_stealing_a_registered_name(clean_registry):
    original = registry.get("tests.scripted")
    with pytest.raises(ImproperlyConfigured, match="registered twice"):
        delayjobs.register(make_type(name="tests.scripted"))
    assert registry.get("tests.scripted") is original


def test_registering_the_same_class_again_is_harmless(clean_registry):
    cls = delayjobs.register(make_type(name="tests.again"))
    assert delayjobs.register(cls) is cls
    assert registry.names().count("tests.again") == 1


def test_registry_get_of_an_unknown_name_raises_unknown_job_type():
    with pytest.raises(delayjobs.UnknownJobType):
        registry.get("tests.nope")
    with pytest.raises(delayjobs.UnknownJobType):
        registry.get(["unhashable"])


def test_job_types_are_autodiscovered_from_installed_apps():
    names = registry.names()
    assert {"tests.scripted", "tests.noop", "orders.close_unpaid"} <= set(names)
    assert {"meetings.remind", "meetings.start", "meetings.end"} <= set(names)


def test_default_retry_delay_backs_off_exponentially_with_jitter_and_a_cap():
    class Job:
        attempts = 1

    jobtype = delayjobs.JobType()
    job = Job()
    base = delayjobs.JobType.retry_backoff_base
    for attempts in (1, 2, 3, 4):
        job.attempts = attempts
        delay = jobtype.retry_delay(job, RuntimeError())
        ceiling = base * 2 ** (attempts - 1)
        assert ceiling / 2 <= delay <= ceiling
    job.attempts = 10_000  # never overflows, never exceeds the cap
    assert jobtype.retry_delay(job, RuntimeError()) <= delayjobs.JobType.retry_backoff_cap


@pytest.mark.parametrize("value", [-0.001, 6, "0.02", timedelta(seconds=-1)])
def test_e014_bad_claim_ahead(delayjobs_settings, value):
    delayjobs_settings(CLAIM_AHEAD=value)
    assert ids(check_settings()) == ["delayjobs.E014"]


@pytest.mark.parametrize("value", [0, -1, "100y", timedelta.max, timedelta(days=366_001)])
def test_e015_bad_max_schedule_ahead(delayjobs_settings, value):
    delayjobs_settings(MAX_SCHEDULE_AHEAD=value)
    assert ids(check_settings()) == ["delayjobs.E015"]


@pytest.mark.parametrize("value", [0, 0.05, timedelta(milliseconds=20)])
def test_claim_ahead_may_be_zero_or_a_timedelta(delayjobs_settings, value):
    delayjobs_settings(CLAIM_AHEAD=value)
    assert check_settings() == []


@pytest.mark.parametrize("value", [0, -1, 201, "64", True, None, 6.4])
def test_e016_bad_max_payload_depth(delayjobs_settings, value):
    delayjobs_settings(MAX_PAYLOAD_DEPTH=value)
    assert ids(check_settings()) == ["delayjobs.E016"]


@pytest.mark.parametrize("value", [-1, "10000", True, None, 1.5])
def test_e018_bad_admin_estimate_above(delayjobs_settings, value):
    delayjobs_settings(ADMIN_ESTIMATE_ABOVE=value)
    assert ids(check_settings()) == ["delayjobs.E018"]


@pytest.mark.parametrize("value", [0, 1, 10_000_000])
def test_admin_estimate_above_may_be_zero_or_any_count(delayjobs_settings, value):
    delayjobs_settings(ADMIN_ESTIMATE_ABOVE=value)
    assert check_settings() == []


@pytest.mark.parametrize(
    "values",
    [
        {"REDIS_CLUSTER": "yes"},
        {"REDIS_CLUSTER": 1},
        {"REDIS_CLUSTER": True, "REDIS_URL": None, "REDIS_CACHE_ALIAS": "default"},
        {"REDIS_CLUSTER": True, "REDIS_URL": "unix:///run/redis.sock"},
        {"REDIS_CLUSTER": True, "REDIS_URL": "redis://127.0.0.1:7000/3"},
    ],
)
def test_e017_bad_redis_cluster(delayjobs_settings, settings, values):
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "x"}}
    delayjobs_settings(**values)
    assert ids(check_settings()) == ["delayjobs.E017"]


@pytest.mark.parametrize("url", ["redis://127.0.0.1:7000", "rediss://u:p@10.0.0.1:7000/0"])
def test_redis_cluster_with_a_url(delayjobs_settings, url):
    delayjobs_settings(REDIS_CLUSTER=True, REDIS_URL=url)
    assert check_settings() == []


# Recurring job types (delayjobs.E102) and MISFIRE_GRACE -------------------------------


#: How E102 states the bounds of misfire_grace (those of max_lateness: it becomes that).
GRACE_BOUNDS = (
    "misfire_grace must be a timedelta from 1 ms to 366 days, or None (the MISFIRE_GRACE setting);"
)


def recurrence_errors(**attrs: object) -> list[str]:
    """The E102 messages of a job type registered with ``attrs``, by Django's checks."""
    cls = delayjobs.register(make_type(name="tests.recurring", **attrs))
    label = f"{cls.__module__}.{cls.__qualname__}: "
    messages = [m for m in checks.run_checks(tags=["delayjobs"]) if m.id == "delayjobs.E102"]
    for message in messages:
        assert message.level == checks.ERROR
        assert message.msg.startswith(label), message.msg
        assert "docs/howto/recurring.md" in message.hint
    return [message.msg.removeprefix(label) for message in messages]


@pytest.mark.parametrize(
    "attrs",
    [
        {"recurrence": delayjobs.Every(seconds=1)},
        {"recurrence": delayjobs.Every(minutes=5), "misfire": "skip"},
        {"recurrence": delayjobs.Cron("0 8 * * MON-FRI", tz="Europe/Berlin"), "misfire": "all"},
        {"recurrence": delayjobs.Cron("*/10 * * * * *"), "misfire_grace": timedelta(seconds=5)},
        {"recurrence": None},
    ],
)
def test_e102_a_good_recurrence_passes(clean_registry: None, attrs: dict[str, object]) -> None:
    assert recurrence_errors(**attrs) == []


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        (
            {"recurrence": delayjobs.Cron("61 * * * *")},
            "recurrence Cron(expression='61 * * * *', tz='UTC'): '61 * * * *' is not a "
            "valid cron expression: Bad minute.",
        ),
        (
            {"recurrence": delayjobs.Cron("0 8 * * *", tz="Europe/Berlim")},
            "recurrence Cron(expression='0 8 * * *', tz='Europe/Berlim'): Unknown time zone "
            "'Europe/Berlim': use an IANA name such as 'Europe/Berlin'.",
        ),
        (
            {"recurrence": delayjobs.Every(seconds=0.5)},
            "recurrence Every(seconds=0.5, minutes=0, hours=0, days=0): An interval must be "
            "from 1 second to 3660 days; got 0.5s.",
        ),
        (
            {"recurrence": "*/5 * * * *"},
            "recurrence must be delayjobs.Every(...), delayjobs.Cron(...) or None; got "
            "'*/5 * * * *'.",
        ),
        (
            {"recurrence": timedelta(minutes=5)},
            "recurrence must be delayjobs.Every(...), delayjobs.Cron(...) or None; got "
            "datetime.timedelta(seconds=300).",
        ),
        (
            {"recurrence": delayjobs.Every(minutes=1), "misfire": "never"},
            "misfire must be one of 'skip', 'once', 'all'; got 'never'.",
        ),
        (
            {"recurrence": delayjobs.Every(minutes=1), "misfire_grace": 60},
            f"{GRACE_BOUNDS} got 60.",
        ),
        (
            {"recurrence": delayjobs.Every(minutes=1), "misfire_grace": timedelta(0)},
            f"{GRACE_BOUNDS} got datetime.timedelta(0).",
        ),
        (
            {"recurrence": delayjobs.Every(minutes=1), "misfire_grace": timedelta(days=367)},
            f"{GRACE_BOUNDS} got datetime.timedelta(days=367).",
        ),
        (
            {"recurrence": delayjobs.Every(minutes=1), "misfire_grace": timedelta(seconds=-1)},
            f"{GRACE_BOUNDS} got datetime.timedelta(days=-1, seconds=86399).",
        ),
    ],
)
def test_e102_a_bad_recurrence_is_a_clear_error(
    clean_registry: None, attrs: dict[str, object], expected: str
) -> None:
    assert recurrence_errors(**attrs) == [expected]


def test_e102_reports_every_problem_of_a_recurring_type(clean_registry: None) -> None:
    errors = recurrence_errors(
        recurrence=delayjobs.Cron("* * *", tz="Nowhere"), misfire="sometimes", misfire_grace=1
    )
    assert [error.split(":")[0] for error in errors] == [
        "recurrence Cron(expression='* * *', tz='Nowhere')",
        "misfire must be one of 'skip', 'once', 'all'; got 'sometimes'.",
        f"{GRACE_BOUNDS} got 1.",
    ]
    assert "Unknown time zone 'Nowhere'" in errors[0]


@pytest.mark.parametrize("value", [0, -1, "60", None, True, timedelta(0), timedelta(days=366)])
def test_e005_bad_misfire_grace(delayjobs_settings: Callable[..., None], value: object) -> None:
    delayjobs_settings(MISFIRE_GRACE=value)
    [message] = check_settings()
    assert message.id == "delayjobs.E005"
    assert "DELAYJOBS['MISFIRE_GRACE']" in message.msg
    assert repr(value) in message.msg


@pytest.mark.parametrize("value", [1, 0.5, 300, timedelta(minutes=2), timedelta(days=365)])
def test_misfire_grace_may_be_seconds_or_a_timedelta(
    delayjobs_settings: Callable[..., None], value: object
) -> None:
    delayjobs_settings(MISFIRE_GRACE=value)
    assert check_settings() == []


# conf.settings reads by the same table ------------------------------------------------

#: Values of every kind, good for some settings and bad for others.
SAMPLES = [
    None,
    True,
    0,
    -1,
    1,
    7,
    2.5,
    float("nan"),
    10**30,
    "",
    "x",
    "a b",
    "redis://127.0.0.1:6379/0",
    "local",
    timedelta(0),
    timedelta(seconds=1),
    timedelta(days=400),
    {},
    {"sms": 2},
    {"sms": 0},
    [],
]


@pytest.mark.parametrize("setting", conf.SETTINGS, ids=lambda setting: setting.name)
def test_a_setting_reads_as_the_checks_judge_it(settings, setting):
    """For every value: the system check reports the row's id exactly when reading the
    setting raises ImproperlyConfigured naming it; never a silent default."""
    for value in SAMPLES:
        settings.DELAYJOBS = {"REDIS_URL": None, setting.name: value}
        reported = setting.check_id in ids(check_settings())
        try:
            getattr(conf.settings, setting.name)
        except ImproperlyConfigured as exc:
            assert reported, (setting.name, value)
            assert f"DELAYJOBS[{setting.name!r}] must be" in str(exc)
            assert setting.check_id in str(exc)
        else:
            # A value read is valid by its row; only settings together may still fail.
            assert not reported or setting.check_id in {"delayjobs.E004", "delayjobs.E017"}, (
                setting.name,
                value,
            )


def test_a_setting_left_out_reads_as_its_default(settings):
    del settings.DELAYJOBS
    assert timedelta(seconds=60) == conf.settings.PRELOAD_WINDOW
    assert timedelta(milliseconds=20) == conf.settings.CLAIM_AHEAD
    assert conf.settings.redis_target == ("url", "redis://127.0.0.1:6379/0")


def test_durations_read_as_timedeltas(delayjobs_settings):
    delayjobs_settings(PRELOAD_INTERVAL=2.5, CLAIM_AHEAD=0)
    assert timedelta(seconds=2.5) == conf.settings.PRELOAD_INTERVAL
    assert timedelta(0) == conf.settings.CLAIM_AHEAD


def test_a_password_in_a_bad_url_is_not_shown(delayjobs_settings):
    delayjobs_settings(REDIS_URL="redis://user:s3cret@host:port/0")
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL") as caught:
        _ = conf.settings.REDIS_URL
    assert "s3cret" not in str(caught.value)
    [message] = check_settings()
    assert "s3cret" not in message.msg


def test_delayjobs_not_a_dict_is_an_error_when_read(settings):
    settings.DELAYJOBS = ["REDIS_URL"]
    with pytest.raises(ImproperlyConfigured, match="DELAYJOBS must be a dict"):
        _ = conf.settings.KEY_PREFIX


def test_both_redis_url_and_cache_alias_is_an_error_when_read(delayjobs_settings):
    delayjobs_settings(REDIS_CACHE_ALIAS="default")
    with pytest.raises(ImproperlyConfigured, match="both REDIS_URL and REDIS_CACHE_ALIAS"):
        _ = conf.settings.redis_target
