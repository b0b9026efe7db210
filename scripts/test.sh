#!/usr/bin/env bash
# The test suite, from a fresh clone. Sets up .venv and runs ruff and pytest (extra arguments go to pytest); then,
# as root, the sandbox's isolation suites again with bubblewrap hidden (the sandbox must not need it) and as an
# unprivileged user, with bubblewrap present and hidden; then the tests that need their own environments: vLLM on
# CPU (.venv-vllm) and the real RL frameworks the adapters plug into (.venv-frameworks), whose environments are
# installed in the background while the main suite runs.
# RETOOL_SKIP_EXTRA_VENVS=1 runs the main suite only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
extra_setup_log=$(mktemp /tmp/retool-extra-setup.XXXXXX)
trap 'rm -f "$extra_setup_log"' EXIT
if [ "${RETOOL_SKIP_EXTRA_VENVS:-0}" != 1 ]; then  # installed while the main suite runs (one after the other: each
    # installs the checkout in editable mode)
    (bash scripts/setup_vllm.sh && bash scripts/setup_frameworks.sh) >"$extra_setup_log" 2>&1 &
    extra_setup=$!
fi
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
    wait "$extra_setup" || { cat "$extra_setup_log" >&2; echo "test: setting up the extra venvs failed" >&2; exit 1; }
    bash scripts/test_vllm.sh
    bash scripts/test_frameworks.sh
fi
