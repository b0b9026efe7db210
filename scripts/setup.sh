#!/usr/bin/env bash
# Create .venv with everything the project, its training scripts and its tests need. Idempotent: re-runs only
# when pyproject.toml or constraints.txt changed. CPU machines get torch's CPU build, pinned by constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.retool-env-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -c constraints.txt -e ".[train,dev]"
echo "$want" > "$stamp"
