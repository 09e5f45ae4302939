#!/usr/bin/env bash
# The one-command demo: a virtualenv with delayjobs and an embedded Redis, then demo.py with
# this script's arguments (--seconds N, --forever, --check).
set -euo pipefail

cd "$(dirname "$0")/.."
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/python -m pip install -q -e ".[demo]"
exec .venv/bin/python sampleproject/demo.py "$@"
