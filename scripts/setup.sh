#!/usr/bin/env bash
# Create .venv with everything the project, its training scripts and its tests need. Idempotent: re-runs only
# when pyproject.toml or constraints.txt changed; quiet unless something fails. CPU machines get torch's CPU
# build, pinned by constraints.txt.
# Nothing outside pip: the sandbox builds its namespaces and read-only view itself (mount(2)), so bubblewrap is not
# needed (`retool-env doctor` shows what this machine allows).
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.retool-env-installed
want=$(cat pyproject.toml constraints.txt scripts/install.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
mkdir -p .venv  # the log lives in it; venv_bootstrap fills it
source scripts/install.sh
# Quiet unless something fails: pip's output goes to a log, whose tail is shown on failure.
log=.venv/setup.log
: > "$log"
echo "setup: installing .venv (a few minutes the first time; log: $log)"
quiet() { "$@" >>"$log" 2>&1 || { tail -n 30 "$log" >&2; echo "setup: failed: $*" >&2; exit 1; }; }
quiet venv_bootstrap .venv
quiet venv_install_torch .venv
quiet venv_install .venv -e ".[train,dev]"
echo "$want" > "$stamp"
echo "setup: .venv ready"
