#!/usr/bin/env bash
# The test suite, from a fresh clone. Sets up .venv and runs ruff and pytest (extra arguments go to pytest); then
# the sandbox's isolation suites again as an unprivileged user (when run as root); then the tests that need their own environments: vLLM on CPU (.venv-vllm) and the real RL frameworks the adapters plug
# into (.venv-frameworks). RETOOL_SKIP_EXTRA_VENVS=1 runs the main suite only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q "$@"
if [ "$(id -u)" = 0 ]; then bash scripts/test_unprivileged.sh; fi  # the sandbox's isolation, as uid 65534 too
if [ "${RETOOL_SKIP_EXTRA_VENVS:-0}" != 1 ]; then
    bash scripts/test_vllm.sh
    bash scripts/test_frameworks.sh
fi
