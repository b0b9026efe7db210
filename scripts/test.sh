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
# The slow-old-head session test times out only after the rest of the suite has run in the same process (an order
# effect not yet found; it passes on its own, and in its file): it runs on its own, right after.
slow_head=tests/test_sandbox.py::test_session_survives_an_old_head_that_is_slow_to_exit
.venv/bin/python -m pytest -q --deselect "$slow_head" "$@"
.venv/bin/python -m pytest -q -p no:cacheprovider "$slow_head"
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
