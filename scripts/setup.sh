#!/usr/bin/env bash
# Create .venv with everything the project, its training scripts and its tests need. Idempotent: re-runs only
# when pyproject.toml or constraints.txt changed. CPU machines get torch's CPU build, pinned by constraints.txt.
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
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -c constraints.txt -e ".[train,dev]"
echo "$want" > "$stamp"
