#!/usr/bin/env bash
# The test suite, from a fresh clone. Sets up .venv and runs ruff and pytest (extra arguments go to pytest); then,
# as root, the sandbox's isolation suites again with bubblewrap hidden (the sandbox must not need it) and as an
# unprivileged user, with bubblewrap present and hidden; then the tests that need their own environments: vLLM on
# CPU (.venv-vllm) and the real RL frameworks the adapters plug into (.venv-frameworks).
# RETOOL_SKIP_EXTRA_VENVS=1 runs the main suite only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
bash scripts/typecheck.sh
.venv/bin/python -m pytest -q --durations=25 "$@"
if [ "$(id -u)" = 0 ]; then
    isolation_suites=(tests/test_sandbox_isolation.py tests/test_sandbox_adversarial.py)
    if bwrap=$(command -v bwrap); then  # a private mount namespace in which bubblewrap is /dev/null
        unshare --mount --propagation private -- bash -euc 'mount --bind /dev/null "$1"; shift
            exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"' _ "$bwrap" "${isolation_suites[@]}"
        bash scripts/test_unprivileged.sh
    fi
    RETOOL_HIDE_BWRAP=1 bash scripts/test_unprivileged.sh
fi
if [ "${RETOOL_SKIP_EXTRA_VENVS:-0}" != 1 ]; then
    bash scripts/test_vllm.sh
    bash scripts/test_frameworks.sh
fi
