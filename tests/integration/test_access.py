"""Access and isolation: admin permissions, no unpickling, code by registered name only,
KEY_PREFIX isolation, and Redis URLs with passwords and TLS that never show the password.

Everything runs against real services: the test run's Redis and database, consumer
subprocesses, and for passwords and TLS throwaway ``redis-server`` processes of their own.
"""

from __future__ import annotations

import ast
import base64
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

import pytest
import redis
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.db.models import Model
from django.test import RequestFactory
from django.utils import timezone

import delayjobs
from delayjobs.apps import JOB_TYPES_MODULE
from delayjobs.checks import check_settings
from delayjobs.conf import mask_url
from delayjobs.engine import preloader
from delayjobs.engine.consumer import Consumer
from delayjobs.exceptions import UnknownJobType
from delayjobs.index.client import describe_target
from delayjobs.index.keys import due_key, preload_lock_key, wake_channel
from delayjobs.index.store import RedisStore, get_store
from delayjobs.jobtypes import registry
from delayjobs.models import DelayedJob, JobAttempt, JobStatus
from tests.conftest import REPO_ROOT, ConsumerFactory, subprocess_env
from tests.integration.test_admin import changelist_url, make_job, staff_client
from tests.models import Execution
from tests.support.redis_server import RedisServer, redis_ping
from tests.utils import wait_for

SCRIPTED = "tests.scripted"
PACKAGE = REPO_ROOT / "delayjobs"


def with_pythonpath(directory: Path, **extra: str) -> dict[str, str]:
    """Env entries putting ``directory`` first on a child's import path (plus ``extra``)."""
    path = os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, **extra}


# 1. Admin actions need their own permissions -------------------------------------------


def delayjobs_model_admins() -> list[tuple[type[Model], admin.ModelAdmin]]:
    return [
        (model, admin.site.get_model_admin(model))
        for model in apps.get_app_config("delayjobs").get_models()
        if admin.site.is_registered(model)
    ]


def offered_actions(model_admin: admin.ModelAdmin, user: User) -> dict[str, Any]:
    """The actions the admin offers ``user`` (site-wide ones included), by name."""
    request = RequestFactory().get("/")
    request.user = user
    return model_admin.get_actions(request)


def action_function(action: Any) -> Any:
    """The function of an offered action: Django 6.1 gives an ``Action`` (``.func``),
    earlier versions a (function, name, description) tuple."""
    return action.func if hasattr(action, "func") else action[0]


def superuser() -> User:
    # Unsaved: has_perm() of an active superuser is True without a database query.
    return User(username="root", is_active=True, is_staff=True, is_superuser=True)


JOB_ADMIN = admin.site.get_model_admin(DelayedJob)
#: Every action of the jobs admin: each is checked below, so a new one is covered too.
JOB_ACTIONS = sorted(JOB_ADMIN.actions or ())


def test_the_jobs_admin_offers_exactly_its_own_actions() -> None:
    # Site-wide actions (delete_selected, or one added with admin.site.add_action) would
    # escape the per-action tests below: none may be offered, even to a superuser.
    assert set(offered_actions(JOB_ADMIN, superuser())) == set(JOB_ACTIONS)
    assert JOB_ACTIONS, "the jobs admin has no action: this file's admin tests test nothing"


@pytest.mark.django_db
def test_every_admin_action_needs_a_dedicated_permission_that_exists() -> None:
    checked = 0
    for model, model_admin in delayjobs_model_admins():
        declared = {codename for codename, _label in model._meta.permissions}
        for name, action in offered_actions(model_admin, superuser()).items():
            func = action_function(action)
            permissions = getattr(func, "allowed_permissions", ())
            assert permissions, f"{model.__name__} admin action {name!r} needs no permission"
            for permission in permissions:
                codename = f"{permission}_{model._meta.model_name}"
                # Not view/change/add/delete: changing jobs is a right of its own.
                assert codename in declared, (
                    f"action {name!r} is allowed by {permission!r}, not by a permission "
                    f"declared in {model.__name__}.Meta.permissions"
                )
                assert callable(getattr(model_admin, f"has_{permission}_permission", None))
                assert Permission.objects.filter(
                    content_type__app_label=model._meta.app_label, codename=codename
                ).exists(), f"permission {codename} is not in the database (migrations?)"
                checked += 1
    assert checked >= len(JOB_ACTIONS)


def jobs_of_every_status() -> list[DelayedJob]:
    """One job per status, so that whatever an action changes, some row is changed."""
    return [make_job(status) for status in JobStatus.values]


def snapshot() -> list[dict[str, Any]]:
    """Every job row and attempt row as it is in the database."""
    return [
        *DelayedJob.objects.order_by("pk").values(),
        *JobAttempt.objects.order_by("pk").values(),
    ]


def confirmation(name: str) -> dict[str, str]:
    """What an action's intermediate page posts back: reschedule asks for the new time."""
    if name != "reschedule_jobs":
        return {}
    in_an_hour = timezone.localtime(timezone.now() + timedelta(hours=1))
    return {"post": "yes", "run_at": in_an_hour.strftime("%Y-%m-%dT%H:%M:%S")}


def post_action(client: Any, name: str, jobs: list[DelayedJob]) -> Any:
    """The POST the changelist form (and its confirmation page, if any) sends for ``name``:
    forged when it was not offered."""
    return client.post(
        changelist_url(),
        {"action": name, "_selected_action": [str(job.pk) for job in jobs], **confirmation(name)},
        follow=True,
    )


def changelist_actions(client: Any) -> set[str]:
    response = client.get(changelist_url())
    assert response.status_code == 200
    form = response.context["action_form"]
    if form is None:
        return set()
    return {value for value, _label in form.fields["action"].choices if value}


def all_delayjobs_permissions_but(excluded: set[str]) -> list[str]:
    return list(
        Permission.objects.filter(content_type__app_label="delayjobs")
        .exclude(codename__in=excluded)
        .values_list("codename", flat=True)
    )


def own_permissions(name: str) -> set[str]:
    func = getattr(JOB_ADMIN, name)
    return {f"{p}_{DelayedJob._meta.model_name}" for p in func.allowed_permissions}


@pytest.mark.django_db
@pytest.mark.parametrize("name", JOB_ACTIONS)
@pytest.mark.parametrize("others", ["view only", "every other delayjobs permission"])
def test_an_action_is_hidden_and_a_forged_post_changes_nothing_without_its_permission(
    client: Any, name: str, others: str
) -> None:
    jobs = jobs_of_every_status()
    granted = (
        ["view_delayedjob"]
        if others == "view only"
        else all_delayjobs_permissions_but(own_permissions(name))
    )
    staff = staff_client(client, *granted)
    assert name not in changelist_actions(staff)
    before = snapshot()
    response = post_action(staff, name, jobs)
    assert response.status_code in (200, 403)
    assert snapshot() == before


@pytest.mark.django_db
@pytest.mark.parametrize("name", JOB_ACTIONS)
def test_an_action_is_offered_and_works_with_its_permission(client: Any, name: str) -> None:
    jobs = jobs_of_every_status()
    staff = staff_client(client, "view_delayedjob", *own_permissions(name))
    assert name in changelist_actions(staff)
    before = snapshot()
    assert post_action(staff, name, jobs).status_code == 200
    assert snapshot() != before


# 2. Payloads are JSON, never unpickled; nothing is imported from data -------------------

#: Modules that turn bytes into objects (and so into code): none may be imported.
DESERIALIZERS = {"pickle", "_pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle"}
DESERIALIZERS |= {"jsonpickle", "copyreg", "pydoc"}
#: Callables that import or run code named by a string.
DYNAMIC_CODE = {"import_string", "import_module", "__import__", "eval", "exec", "locate"}
DYNAMIC_CODE |= {"autodiscover_modules"}
#: The only dynamic imports allowed, each of module names fixed in the code, never read
#: from data: the lazy re-export of the public API (names in ``delayjobs._EXPORTS``),
#: Django's autodiscovery of every installed app's ``delay_jobs`` module, and the rest below.
ALLOWED_DYNAMIC_CODE = sorted(
    [
        ("__init__.py", "from importlib import import_module"),
        ("__init__.py", "import_module(module)"),
        ("apps.py", "from django.utils.module_loading import autodiscover_modules"),
        ("apps.py", "autodiscover_modules(JOB_TYPES_MODULE)"),
        # The Tasks backend's discovery of @task objects: each installed app's "tasks"
        # module and the backends' OPTIONS["MODULES"], names from the project's code and
        # settings; and a path stored in a row, imported only if its module lies inside
        # an installed app's package (contrib.tasks.discovery.importable).
        ("contrib/tasks/discovery.py", "from importlib import import_module"),
        ("contrib/tasks/discovery.py", "import_module(name)"),
        ("contrib/tasks/discovery.py", "import_module(module_name)"),
        # The executor a consumer runs with: a key of EXECUTOR_PATHS, whose dotted paths
        # are fixed in the code (the EXECUTOR setting and --executor only pick a key).
        ("engine/executors.py", "from django.utils.module_loading import import_string"),
        ("engine/executors.py", "import_string(EXECUTOR_PATHS[name])"),
    ]
)


def package_modules() -> list[tuple[str, ast.Module]]:
    return [
        (str(path.relative_to(PACKAGE)), ast.parse(path.read_text(), filename=str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def test_no_module_deserializes_objects_or_imports_code_named_by_data() -> None:
    deserializers: list[str] = []
    dynamic: list[tuple[str, str]] = []
    modules = package_modules()
    assert len(modules) > 10, "delayjobs' modules not found"
    for relative, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                imported = [alias.name for alias in node.names]
                if isinstance(node, ast.ImportFrom):
                    imported = [node.module or ""]
                    if any(alias.name in DYNAMIC_CODE for alias in node.names):
                        dynamic.append((relative, ast.unparse(node)))
                if any(name.split(".")[0] in DESERIALIZERS for name in imported):
                    deserializers.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Call) and called_name(node) in DYNAMIC_CODE:
                dynamic.append((relative, ast.unparse(node)))
    assert deserializers == []
    assert sorted(dynamic) == ALLOWED_DYNAMIC_CODE
    assert JOB_TYPES_MODULE == "delay_jobs"
    assert all(module.startswith("delayjobs.") for module in delayjobs._EXPORTS.values())


class _MakeDirectory:
    """Unpickling this calls ``os.mkdir(path)``: a side effect a test can observe."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (self.path,))


def pickle_like_payload(marker: Path) -> dict[str, Any]:
    """A JSON payload whose strings are live pickles (and a jsonpickle look-alike).

    A consumer that unpickled any of them would create ``marker``.
    """
    live = _MakeDirectory(marker)
    return {
        "base64_pickle": base64.b64encode(pickle.dumps(live, pickle.HIGHEST_PROTOCOL)).decode(),
        "protocol_0_pickle": pickle.dumps(live, protocol=0).decode("ascii"),
        "jsonpickle": {"py/reduce": [{"py/function": "posix.mkdir"}, {"py/tuple": [str(marker)]}]},
        "list": [1, "two", None, True],
    }


class RecordPayload(delayjobs.JobType):
    """Keeps what ``execute`` was handed, for the test running it in this process."""

    name = "tests.access.record_payload"
    queue = "access-payload"
    max_attempts = 1
    received: ClassVar[list[Any]] = []

    def execute(self, job: DelayedJob) -> None:
        self.received.append(job.payload)


@pytest.fixture
def record_payload() -> Iterator[type[RecordPayload]]:
    RecordPayload.received = []
    delayjobs.register(RecordPayload)
    try:
        yield RecordPayload
    finally:
        registry.remove(RecordPayload.name)


@pytest.mark.django_db(transaction=True)
def test_a_payload_that_looks_like_a_pickle_is_stored_and_executed_as_plain_json(
    record_payload: type[RecordPayload], tmp_path: Path, redis_client: redis.Redis
) -> None:
    marker = tmp_path / "unpickled"
    payload = pickle_like_payload(marker)
    job = delayjobs.schedule(record_payload.name, payload)

    with connection.cursor() as cursor:
        table = connection.ops.quote_name(DelayedJob._meta.db_table)
        cursor.execute(f"SELECT CAST(payload AS TEXT) FROM {table} WHERE id = %s", [job.pk])
        (stored,) = cursor.fetchone()
    assert json.loads(stored) == payload

    # In this process, so that the test sees the very object ``execute`` was handed.
    Consumer(queues=[record_payload.queue], burst=True, preload=False, concurrency=1).run()

    assert DelayedJob.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED
    assert record_payload.received == [payload]
    [received] = record_payload.received
    assert type(received) is dict
    assert all(type(received[name]) is str for name in ("base64_pickle", "protocol_0_pickle"))
    assert not marker.exists(), "a payload was unpickled"
    # The control: these strings really are pickles that would have created the marker.
    pickle.loads(base64.b64decode(received["base64_pickle"]))
    assert marker.is_dir()


# 3. Job types resolve through the registry only ----------------------------------------

MARKER_MODULE = "delayjobs_access_marker"
MARKER_ENV = "DELAYJOBS_ACCESS_MARKER"
#: Names that are import paths, not registered names: none may be imported or run.
IMPORT_PATHS = [
    "os.system",
    "antigravity",
    "tests.delay_jobs.Scripted",
    "tests.delay_jobs:Scripted",
    "delayjobs.jobtypes.JobType",
    MARKER_MODULE,
    f"{MARKER_MODULE}.Job",
]


@pytest.fixture
def marker_module(tmp_path: Path) -> Path:
    """A module that, when imported, writes the file named by $DELAYJOBS_ACCESS_MARKER.

    Returns the directory to put on the import path.
    """
    directory = tmp_path / "importable"
    directory.mkdir()
    (directory / f"{MARKER_MODULE}.py").write_text(
        "import os\n"
        "import pathlib\n\n"
        f"pathlib.Path(os.environ[{MARKER_ENV!r}]).write_text('imported')\n\n\n"
        "class Job:\n"
        "    name = 'marker'\n"
    )
    return directory


@pytest.mark.django_db
@pytest.mark.parametrize("name", IMPORT_PATHS)
def test_schedule_refuses_an_import_path_without_importing_it(
    name: str, marker_module: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    monkeypatch.setenv(MARKER_ENV, str(marker))
    monkeypatch.syspath_prepend(str(marker_module))
    modules_before = set(sys.modules)
    with pytest.raises(UnknownJobType):
        delayjobs.schedule(name, {"command": "true"})
    with pytest.raises(UnknownJobType):
        delayjobs.schedule_many([{"job_type": name}])
    assert not DelayedJob.objects.exists()
    path = name.replace(":", ".")
    imported = {m for m in set(sys.modules) - modules_before if path.startswith(m)}
    assert imported == set()
    assert not marker.exists()


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_row_naming_an_import_path_is_left_unclaimed_and_its_module_never_imported(
    consumer_process: ConsumerFactory, marker_module: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "imported"
    now = timezone.now()
    # Written as a compromised database or a buggy migration could: past schedule().
    foreign = DelayedJob.objects.bulk_create(
        DelayedJob.build(job_type=name, payload={"command": "true"}, run_at=now, queue="default")
        for name in IMPORT_PATHS
    )
    control = delayjobs.schedule(SCRIPTED)
    env = with_pythonpath(marker_module, **{MARKER_ENV: str(marker)})

    consumer = consumer_process("--burst", "--worker-id", "registry-only", env=env)
    assert consumer.wait(timeout=60) == 0, consumer.output()

    # The consumer did go through the queue: the registered job ran.
    assert DelayedJob.objects.get(pk=control.pk).status == JobStatus.SUCCEEDED
    output = consumer.output()
    for job in foreign:
        job.refresh_from_db()
        assert (job.status, job.attempts, job.worker_id) == (JobStatus.SCHEDULED, 0, "")
        assert f"does not know job type {job.job_type!r}" in output
    assert not JobAttempt.objects.filter(job__in=foreign).exists()
    assert not Execution.objects.filter(job_id__in=[job.pk for job in foreign]).exists()
    assert not marker.exists(), f"the consumer imported {MARKER_MODULE}"
    # The control: importing the module in the same environment does create the marker.
    completed = subprocess.run(
        [sys.executable, "-c", f"import {MARKER_MODULE}"],
        cwd=REPO_ROOT,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert marker.read_text() == "imported"


# 4. KEY_PREFIX isolates projects sharing one Redis -------------------------------------

PREFIX_A, PREFIX_B = "dj-test", "dj-test-b"
QUEUES = ["default", "other", "emails.high"]
#: ``use_prefix(name)``: from now on this process is the project with that KEY_PREFIX.
UsePrefix = Callable[[str], None]


@pytest.fixture
def use_prefix(settings: Any) -> UsePrefix:
    """Switch this process's KEY_PREFIX (restored after the test)."""

    def switch(prefix: str) -> None:
        settings.DELAYJOBS = {**settings.DELAYJOBS, "KEY_PREFIX": prefix}

    return switch


def project_keys() -> set[str]:
    return {preload_lock_key()} | {f(q) for q in QUEUES for f in (due_key, wake_channel)}


def test_two_prefixes_share_no_key_channel_or_lock(use_prefix: UsePrefix) -> None:
    use_prefix(PREFIX_A)
    keys_a = project_keys()
    use_prefix(PREFIX_B)
    keys_b = project_keys()
    assert len(keys_a) == len(keys_b) == 1 + 2 * len(QUEUES)
    assert keys_a.isdisjoint(keys_b)


@pytest.mark.django_db
def test_one_prefix_never_pops_reads_loads_or_locks_the_others_entries(
    use_prefix: UsePrefix, redis_client: redis.Redis
) -> None:
    store = RedisStore(redis_client)
    use_prefix(PREFIX_B)
    store.add([(1, "default", 10.0), (2, "default", 20.0), (3, "other", 30.0)])
    b_keys = sorted(redis_client.keys("*"))
    b_before = {key: redis_client.zrange(key, 0, -1, withscores=True) for key in b_keys}

    use_prefix(PREFIX_A)
    job = delayjobs.schedule(SCRIPTED)  # project A's own job, in its database
    with store.preload_lock(60) as a_holds_lock:
        assert a_holds_lock
        use_prefix(PREFIX_B)
        with store.preload_lock(60) as b_holds_lock:
            assert b_holds_lock, "project A's pre-loader lock kept project B's out"
        use_prefix(PREFIX_A)
    assert store.next_due(["default", "other"]) is None
    assert store.pop_due("default", 1e12, 100) == ([], False)
    store.remove([(1, "default", 10.0), (3, "other", 30.0)])
    assert preloader.preload(store=store).loaded == 1
    assert store.members("default") == {job.pk: job.due_timestamp}

    assert {key: redis_client.zrange(key, 0, -1, withscores=True) for key in b_keys} == b_before
    assert set(redis_client.keys("*")) == {*b_keys, due_key("default").encode()}


def test_a_wake_notification_reaches_only_its_own_prefix(
    use_prefix: UsePrefix, redis_client: redis.Redis
) -> None:
    store = RedisStore(redis_client)
    use_prefix(PREFIX_A)
    listener = store.subscribe_wake(["default"])
    channel = wake_channel("default").encode()
    try:
        wait_for(lambda: dict(redis_client.pubsub_numsub(channel))[channel] == 1)
        use_prefix(PREFIX_B)
        store.add([(1, "default", 10.0)])  # published on B's channel first
        use_prefix(PREFIX_A)
        store.add([(2, "default", 20.0)])
        message = wait_for(lambda: listener.get_message(timeout=0.1))
        # Delivered in publishing order: had B's reached A, it would have come first.
        assert message["channel"] == channel
        assert float(message["data"]) == 20.0
    finally:
        listener.close()


# End to end: two projects, two databases, one Redis.

#: The same ids in both projects' databases: a consumer reading the other project's keys
#: would claim its own row of that id, and leave the other project's job unrun.
SHARED_IDS = list(range(910_001, 910_016))


def seed_project(ids: list[int], run_at: float) -> None:
    """Jobs with exactly these ids, due at ``run_at``, in this process's database and
    indexed in Redis under this process's KEY_PREFIX (also run in project B's process)."""
    due = datetime.fromtimestamp(run_at, tz=UTC)
    jobs = DelayedJob.objects.bulk_create(
        DelayedJob.build(id=pk, job_type=SCRIPTED, run_at=due, queue="default") for pk in ids
    )
    get_store().add((job.pk, job.queue, job.due_timestamp) for job in jobs)


def project_report(ids: list[int]) -> dict[str, list[Any]]:
    """What happened to the jobs, as JSON (also run in project B's process)."""
    statuses = DelayedJob.objects.filter(pk__in=ids).order_by("pk").values_list("pk", "status")
    executions = Execution.objects.order_by("job_id").values_list("job_id", "attempt", "worker_id")
    return {
        "statuses": [list(row) for row in statuses],
        "executions": [list(row) for row in executions],
    }


def expected_report(ids: list[int], worker_id: str) -> dict[str, list[Any]]:
    return {
        "statuses": [[pk, JobStatus.SUCCEEDED] for pk in ids],
        "executions": [[pk, 1, worker_id] for pk in ids],
    }


def run_python(args: list[str], env: dict[str, str]) -> str:
    completed = subprocess.run(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert completed.returncode == 0, f"{args} failed:\n{completed.stdout}\n{completed.stderr}"
    return completed.stdout


def call_in_project(env: dict[str, str], call: str) -> Any:
    """Evaluate ``call`` (an expression over this module) in a Django process with ``env``."""
    code = (
        "import json, django\n"
        "django.setup()\n"
        "from tests.integration import test_access\n"
        f"print(json.dumps(test_access.{call}))\n"
    )
    return json.loads(run_python(["-c", code], env).splitlines()[-1])


@pytest.fixture
def project_b_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Env of a second project: its own, freshly migrated database, its own KEY_PREFIX.

    SQLite: a second file. PostgreSQL: a second database on the same server, created
    here and dropped afterwards. Both are migrated by ``manage.py migrate``, as a real
    project's would be.
    """
    postgres = connection.vendor == "postgresql"
    if postgres:
        name = f"{connection.settings_dict['NAME']}_project_b"
        quoted = connection.ops.quote_name(name)
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")
            cursor.execute(f"CREATE DATABASE {quoted}")
    else:
        name = str(tmp_path / "project-b.sqlite3")
    env = subprocess_env(
        DELAYJOBS_TEST_DB_NAME=name,
        DELAYJOBS_TEST_OVERRIDES=json.dumps({"KEY_PREFIX": PREFIX_B}),
    )
    try:
        run_python(["manage.py", "migrate", "--noinput", "-v", "0"], env)
        yield env
    finally:
        if postgres:
            with connection.cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_two_projects_sharing_one_redis_each_run_exactly_their_own_jobs(
    consumer_process: ConsumerFactory,
    project_b_env: dict[str, str],
    redis_client: redis.Redis,
    use_prefix: UsePrefix,
) -> None:
    use_prefix(PREFIX_B)
    key_b = due_key("default")
    use_prefix(PREFIX_A)  # this process is project A, as its consumer is
    key_a = due_key("default")
    now = timezone.now().timestamp()
    seed_project(SHARED_IDS, now)
    call_in_project(project_b_env, f"seed_project({SHARED_IDS!r}, {now!r})")
    assert set(redis_client.keys("*")) == {key_a.encode(), key_b.encode()}
    for key in (key_a, key_b):
        assert sorted(int(m) for m in redis_client.zrange(key, 0, -1)) == SHARED_IDS

    # No pre-loader: it would repair, from each database, entries the other project's
    # consumer took, and so hide the very leak this test is about.
    consumers = [
        consumer_process("--burst", "--no-preload", "--worker-id", "project-a"),
        consumer_process("--burst", "--no-preload", "--worker-id", "project-b", env=project_b_env),
    ]
    for consumer in consumers:
        assert consumer.wait(timeout=60) == 0, consumer.output()

    assert project_report(SHARED_IDS) == expected_report(SHARED_IDS, "project-a")
    assert call_in_project(project_b_env, f"project_report({SHARED_IDS!r})") == (
        expected_report(SHARED_IDS, "project-b")
    )
    assert redis_client.keys("*") == []


# 5. Redis URLs with passwords and TLS; passwords never shown ---------------------------

#: URL-special characters on purpose: the URL must carry it quoted, and the masking must
#: hide it in both forms. Its first part is what no output may contain.
SECRET_MARK = "hunter2Zq9"
SECRET = f"{SECRET_MARK}:@/%"
WRONG_MARK = "wrongKx4Tq"
WRONG = f"{WRONG_MARK}:@/%"


def assert_no_password(text: str) -> None:
    for mark in (SECRET_MARK, WRONG_MARK):
        assert mark not in text, f"a password appears in:\n{text}"


def log_text(caplog: pytest.LogCaptureFixture) -> str:
    """Every captured record as a handler would write it, tracebacks included."""
    formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
    return "\n".join(formatter.format(record) for record in caplog.records)


@pytest.fixture(scope="module")
def password_redis() -> Iterator[RedisServer]:
    with RedisServer(password=SECRET) as server:
        yield server


@pytest.fixture(scope="module")
def tls_redis() -> Iterator[RedisServer]:
    with RedisServer(password=SECRET, tls=True) as server:
        yield server


@pytest.fixture(params=["password", "tls"])
def secured_redis(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A Redis requiring SECRET: over plain TCP (redis://), or over TLS (rediss://)."""
    server: RedisServer = request.getfixturevalue(f"{request.param}_redis")
    client = redis.Redis.from_url(server.url)
    try:
        client.flushdb()
        yield server
    finally:
        client.close()


def secured_url(settings: Any, server: RedisServer, password: str = SECRET) -> str:
    """Point this process's DELAYJOBS at ``server`` with ``password``; return the URL."""
    url = server.url.replace(quote(SECRET, safe=""), quote(password, safe=""))
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    return url


@pytest.fixture
def info_settings(tmp_path: Path) -> dict[str, str]:
    """Env for a consumer that logs at INFO, so its start line shows where Redis is."""
    directory = tmp_path / "settings"
    directory.mkdir()
    (directory / "access_info_settings.py").write_text(
        "from tests.settings import *  # noqa: F403\n"
        "from tests.settings import LOGGING\n\n"
        "LOGGING = {**LOGGING, 'root': {'handlers': ['console'], 'level': 'INFO'}}\n"
    )
    return with_pythonpath(directory, DJANGO_SETTINGS_MODULE="access_info_settings")


def test_the_tls_server_speaks_only_tls(tls_redis: RedisServer) -> None:
    assert tls_redis.url.startswith(f"rediss://:{quote(SECRET, safe='')}@")
    assert tls_redis.port is not None and tls_redis.tls_ca_file is not None
    assert not redis_ping(tls_redis.port), "the TLS port answered plain text"
    assert redis_ping(tls_redis.port, tls_ca_file=tls_redis.tls_ca_file)


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_consumer_runs_jobs_through_a_redis_url_with_a_password(
    secured_redis: RedisServer,
    settings: Any,
    consumer_process: ConsumerFactory,
    info_settings: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="delayjobs")
    url = secured_url(settings, secured_redis)
    client = redis.Redis.from_url(url)
    try:
        jobs = delayjobs.schedule_many([{"job_type": SCRIPTED} for _ in range(5)])
        # Handed to the secured Redis by this process, on commit.
        assert client.zcard(due_key("default")) == len(jobs)

        overrides = json.dumps({"REDIS_URL": url})
        consumer = consumer_process(
            "--burst", env={**info_settings, "DELAYJOBS_TEST_OVERRIDES": overrides}
        )
        assert consumer.wait(timeout=60) == 0, consumer.output()
        assert client.zcard(due_key("default")) == 0
    finally:
        client.close()

    ids = [job.pk for job in jobs]
    assert set(DelayedJob.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        JobStatus.SUCCEEDED
    }
    output = consumer.output()
    assert f"Redis at {mask_url(url)}" in output  # where it connected, masked
    assert describe_target() == mask_url(url)
    assert check_settings() == []
    for text in (output, describe_target(), log_text(caplog)):
        assert_no_password(text)


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_wrong_password_is_a_clear_error_that_shows_no_password(
    secured_redis: RedisServer,
    settings: Any,
    consumer_process: ConsumerFactory,
    info_settings: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="delayjobs")
    url = secured_url(settings, secured_redis, password=WRONG)

    with pytest.raises(redis.AuthenticationError) as raised:
        get_store().size("default")
    assert_no_password("".join(traceback.format_exception(raised.value)))

    # schedule() succeeds (the row is what counts); the hand-off failure is logged.
    job = delayjobs.schedule(SCRIPTED)
    assert DelayedJob.objects.filter(pk=job.pk).exists()
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "AuthenticationError" in warning.getMessage()
    assert mask_url(url) in warning.getMessage()

    overrides = json.dumps({"REDIS_URL": url})
    consumer = consumer_process(env={**info_settings, "DELAYJOBS_TEST_OVERRIDES": overrides})
    # Redis's own reason, whatever the consumer does meanwhile (retry, database fallback).
    reason = "invalid username-password pair"
    wait_for(
        lambda: reason in consumer.output() or consumer.returncode is not None,
        message=f"the consumer never reported {reason!r}",
    )
    consumer.send_signal(signal.SIGTERM)
    assert consumer.wait(timeout=30) == 0, consumer.output()
    output = consumer.output()
    assert reason in output, output

    for text in (output, describe_target(), log_text(caplog)):
        assert_no_password(text)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://user:{SECRET_MARK}@redis.example:6379/0", "redis://user:***@redis.example"),
        (f"redis://{SECRET_MARK}@redis.example:6379/0", "redis://***@redis.example"),
        (f"rediss://h:6380/0?ssl_password={SECRET_MARK}&db=1", "ssl_password=***&db=1"),
        (f"rediss://h/0?ssl_ca_certs=/ca.crt&password={SECRET_MARK}", "?ssl_ca_certs=/ca.crt&"),
        (f"redis:/:{SECRET_MARK}@127.0.0.1:6379/0", "***@127.0.0.1:6379/0"),
        (f"redis://:pa/ss#{SECRET_MARK}@h:1/0", "redis://:***@h:1/0"),
        (f"unix://:{SECRET_MARK}@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1"),
    ],
)
def test_mask_url_hides_every_form_of_password(url: str, shown: str) -> None:
    masked = mask_url(url)
    assert_no_password(masked)
    assert shown in masked


def test_a_system_check_about_a_bad_url_shows_no_password(settings: Any) -> None:
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "REDIS_URL": f"redis:/:{SECRET_MARK}@127.0.0.1:6379/0",  # one slash: not a URL
    }
    messages = check_settings()
    assert [message.id for message in messages] == ["delayjobs.E003"]
    assert_no_password(" ".join(f"{m.msg} {m.hint}" for m in messages))
