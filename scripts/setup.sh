#!/usr/bin/env bash
# Create .venv with everything the project, its training scripts and its tests need. Idempotent: re-runs only
# when pyproject.toml or constraints.txt changed; quiet unless something fails. CPU machines get torch's CPU
# build, pinned by constraints.txt.
# Also installs bubblewrap, the sandbox's strongest isolation layer, where apt is available (optional: without it
# the sandbox falls back to unshare namespaces, then to seccomp and rlimits, and `retool-env doctor` says so).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v bwrap >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    (apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 &&
        apt-get install -y -q bubblewrap >/dev/null 2>&1; }) || echo "setup: bubblewrap not installed" >&2
fi
stamp=.venv/.retool-env-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
[ -x .venv/bin/python ] || python3 -m venv .venv
# Quiet unless something fails: pip's output goes to a log, whose tail is shown on failure.
log=.venv/setup.log
: > "$log"
echo "setup: installing .venv (a few minutes the first time; log: $log)"
quiet() { "$@" >>"$log" 2>&1 || { tail -n 30 "$log" >&2; echo "setup: failed: $*" >&2; exit 1; }; }
quiet .venv/bin/python -m pip install --upgrade pip
quiet .venv/bin/python -m pip install torch==2.13.0
quiet .venv/bin/python -m pip install -c constraints.txt -e ".[train,dev]"
echo "$want" > "$stamp"
echo "setup: .venv ready"
