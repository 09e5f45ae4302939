"""What every directory of the suite shares: the kind markers, Redis, consumer subprocesses.

A test's kind is where it lives (tests/unit, tests/integration, tests/e2e, tests/browser):
``pytest_collection_modifyitems`` below marks it, so ``-m unit``, ``-m "unit or integration"``
and the like select by kind. tests/faults and tests/scale mark their own tests. The autouse
clean-Redis fixture lives in the conftests of the directories whose tests use Redis.

The modules in DB_SENSITIVE also carry ``db_sensitive``: what they prove depends on the
database engine, so tests/run.sh runs them on SQLite and on PostgreSQL. The others run
once: on PostgreSQL, or, those in ONCE_ON_SQLITE (marker ``once_on_sqlite``), on SQLite,
so that the two runs, side by side, take about as long (docs/howto/development.md says
which and why).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection

from tests.support.processes import pdeathsig_preexec

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent

#: The kind markers by directory. A test in an integration file that starts processes
#: carries ``subprocess`` and is of kind ``e2e``: the kind says what a test does.
KINDS = {"unit": "unit", "integration": "integration", "e2e": "e2e", "browser": "browser"}
#: Directories whose own conftests mark their tests (``faults``, ``scale``).
SELF_MARKED = {"faults", "scale"}
#: What a test may carry to start a consumer process (see ``consumer_process``).
PROCESS_MARKERS = ("subprocess", "browser", "faults", "scale")
#: The modules whose tests depend on the database engine: claims, locks and SKIP LOCKED,
#: transactions and on_commit, the database's clock, fenced and bulk writes (COPY on
#: PostgreSQL), JSON stored and read back, aggregates over durations, migrations and
#: checks that query the database, and the harness's own database. The rest test HTTP,
#: the admin's pages, Redis, Celery, input validation and the browser: once, on
#: PostgreSQL. Keyed by path under tests/.
DB_SENSITIVE = frozenset(
    {
        "integration/test_api.py",
        "integration/test_admin_scale.py",
        "integration/test_async_jobs.py",
        "integration/test_bindings.py",
        "integration/test_burst_in_a_transaction.py",
        "integration/test_checks_db.py",
        "integration/test_claim_due.py",
        "integration/test_clock.py",
        "integration/test_commands.py",
        "integration/test_extreme_values.py",
        "integration/test_limiter.py",
        "integration/test_operability.py",
        "integration/test_outcomes.py",
        "integration/test_preloader.py",
        "integration/test_recorder.py",
        "integration/test_recurring.py",
        "integration/test_reservations.py",
        "integration/test_round_trips.py",
        "integration/test_services.py",
        "integration/test_stats.py",
        "integration/test_successors.py",
        "integration/test_tasks_backend.py",
        "integration/test_tasks_differential.py",
        "integration/test_tracing.py",
        "integration/test_transitions.py",
        "e2e/test_async_consumer.py",
        "e2e/test_consumer.py",
        "e2e/test_limits.py",
        "e2e/test_recorder_consumer.py",
        "e2e/test_recurring.py",
        "e2e/test_recurring_redis_down.py",
        "e2e/test_redis_down.py",
        "e2e/test_services_subprocess.py",
        "e2e/test_supervisor.py",
    }
)
#: Modules that do not depend on the database engine, run once on SQLite rather than on
#: PostgreSQL: the property-based input tests, the admin's pages and the browser tests,
#: which keep a CPU busy, and the sample project, whose demo runs on SQLite.
ONCE_ON_SQLITE = frozenset(
    {
        "integration/test_admin.py",
        "integration/test_admin_fuzz.py",
        "integration/test_admin_schedules.py",
        "integration/test_bad_input.py",
        "integration/test_sampleproject.py",
        "browser/test_browser.py",
        "browser/test_schedules_browser.py",
    }
)
#: What tests/run.sh's SQLite run collects.
ON_SQLITE = DB_SENSITIVE | ONCE_ON_SQLITE


def _parts(item: pytest.Item) -> tuple[str, ...]:
    """The test's path under tests/, as parts (empty: not under tests/)."""
    try:
        return Path(str(item.fspath)).resolve().relative_to(TESTS_DIR).parts
    except ValueError:
        return ()


def _kind(item: pytest.Item) -> str | None:
    """The kind of a test, from its directory under tests/ (None: not ours to mark)."""
    parts = _parts(item)
    if not parts:
        return None
    if parts[0] in SELF_MARKED:
        return None
    if len(parts) == 1 or parts[0] not in KINDS:
        raise pytest.UsageError(
            f"{item.nodeid}: a test lives in tests/unit, tests/integration, tests/e2e or "
            "tests/browser (see docs/howto/development.md), not directly in tests/"
        )
    kind = KINDS[parts[0]]
    if kind == "integration" and item.get_closest_marker("subprocess"):
        return "e2e"
    return kind


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A module renamed or moved must not leave its run silently.
    if missing := sorted(path for path in ON_SQLITE if not (TESTS_DIR / path).is_file()):
        raise pytest.UsageError(f"tests/conftest.py names no such test module: {missing}")
    for item in items:
        kind = _kind(item)
        if kind is None:
            continue
        item.add_marker(kind)
        path = "/".join(_parts(item))
        if path in DB_SENSITIVE:
            item.add_marker(pytest.mark.db_sensitive)
        elif path in ONCE_ON_SQLITE:
            item.add_marker(pytest.mark.once_on_sqlite)
        if kind in ("e2e", "browser") and not item.get_closest_marker("subprocess"):
            # The matrix's core legs leave out `subprocess`: a test here starts processes.
            item.add_marker(pytest.mark.subprocess)


def _test_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.DELAYJOBS["REDIS_URL"])


@pytest.fixture
def _clean_redis() -> Iterator[None]:
    """The test starts and ends with an empty Redis (the index is rebuildable anyway).

    Autouse in tests/integration, tests/e2e and tests/browser (their conftests), never in
    tests/unit, whose tests need no Redis at all.
    """
    client = _test_redis()
    try:
        client.flushdb()
        yield
        client.flushdb()
    finally:
        client.close()


@pytest.fixture
def redis_client(_clean_redis: None) -> Iterator[redis.Redis]:
    """A client of the test run's real Redis, flushed before and after the test."""
    client = _test_redis()
    try:
        yield client
    finally:
        client.close()


#: What a consumer subprocess runs, after ``python``. Without Django's system checks, a
#: third of a consumer's start: the suite starts hundreds, and the checks have tests of
#: their own (tests/unit/test_checks.py, tests/integration/test_checks_db.py). One
#: consumer process, as the tests count them (pids, signals, kills); tests/e2e/
#: test_supervisor.py passes --processes again, which argparse takes over this one.
CONSUMER = ("manage.py", "run_delay_consumer", "--skip-checks", "--processes", "1")


class ConsumerProcess:
    """A ``manage.py run_delay_consumer`` subprocess whose output goes to a log file."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        env: dict[str, str],
        command: tuple[str, ...] = CONSUMER,
        prefix: Sequence[str] = (),
    ) -> None:
        """``prefix``: what runs ``python`` (``ip netns exec NAME``, say), if anything."""
        self.args = args
        self.log_path = log_path
        # The child gets its own copy of the descriptor; the parent keeps none open.
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                [*prefix, sys.executable, *command, *args],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # If pytest itself is SIGKILLed, its consumers must not live on.
                preexec_fn=pdeathsig_preexec(os.getpid()),
                # A group of its own, which kill() ends whole: a supervisor's consumer
                # processes too, which would otherwise finish their jobs (or wait on a
                # held one) after the test, still writing to its database.
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def send_signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float | None = 30.0) -> int:
        """Wait for the exit and return the exit code; AssertionError (with output) on timeout."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"consumer {self.pid} still running after {timeout}s. Output:\n{self.output()}"
            ) from None
        return code

    def output(self) -> str:
        """Everything the consumer wrote to stdout and stderr so far."""
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL it and every process it started (its process group), and reap it."""
        with contextlib.suppress(ProcessLookupError):  # the whole group has exited
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


ConsumerFactory = Callable[..., ConsumerProcess]


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child Django process that must share this test's database.

    The test database has a name pytest-django chose ("test_…"); DELAYJOBS_TEST_DB_NAME
    makes tests.settings use it. The service addresses are already in os.environ.
    """
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["DELAYJOBS_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@pytest.fixture
def consumer_process(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ConsumerFactory]:
    """Factory: ``consumer_process(*args, env=None) -> ConsumerProcess``.

    Starts ``python manage.py run_delay_consumer *args``. The consumer only sees committed
    rows, so tests using it need ``@pytest.mark.django_db(transaction=True)``. Consumers
    still running at teardown are SIGKILLed and reaped. A test that uses it must be marked
    ``subprocess`` (tests/e2e marks all of its tests), so that the in-process runs leave it out.
    """
    if not any(request.node.get_closest_marker(name) for name in PROCESS_MARKERS):
        pytest.fail(
            f"{request.node.nodeid} starts a consumer process: move it to tests/e2e or mark it "
            "@pytest.mark.subprocess"
        )
    started: list[ConsumerProcess] = []

    def start(
        *args: str, env: dict[str, str] | None = None, command: tuple[str, ...] = CONSUMER
    ) -> ConsumerProcess:
        log_path = tmp_path / f"consumer-{len(started)}.log"
        consumer = ConsumerProcess(list(args), log_path, subprocess_env(**(env or {})), command)
        started.append(consumer)
        return consumer

    yield start
    for consumer in started:
        consumer.kill()
