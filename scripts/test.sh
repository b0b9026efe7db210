#!/usr/bin/env bash
# The test suite, from a fresh clone: sets up .venv, then runs ruff and pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q "$@"
