#!/usr/bin/env bash
# Build the documentation site into docs/_build/html, warnings as errors (a broken
# internal link, a page in no toctree, a failing autodoc import all fail the build).
# Usage: docs/build.sh   Env: PYTHON (default .venv/bin/python, with the docs extra:
# pip install -e ".[docs]")
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
"$PYTHON" -m sphinx -W --keep-going -q -b html docs docs/_build/html
echo "The documentation site is in docs/_build/html/index.html"
