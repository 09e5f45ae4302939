#!/usr/bin/env bash
# The one-command demo: a virtualenv with delayjobs and an embedded Redis, then demo.py.
# Arguments go to demo.py (for example --seconds 75).
set -euo pipefail

cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q -e ".[demo]"
exec .venv/bin/python sampleproject/demo.py "$@"
