#!/usr/bin/env bash
# The test command: lint, migration check, then the whole suite on SQLite and PostgreSQL.
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

header "ruff"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .

header "Migrations are up to date"
DJANGO_SETTINGS_MODULE=tests.settings "$VENV/bin/python" manage.py makemigrations --check --dry-run

header "pytest on SQLite"
DELAYJOBS_TEST_DB=sqlite "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"

header "pytest on PostgreSQL"
DELAYJOBS_TEST_DB=postgres "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"

header "All checks passed"
