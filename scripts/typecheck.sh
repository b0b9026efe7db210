#!/usr/bin/env bash
# mypy over retool_env, retool_adapters and training/, with the settings in pyproject.toml ([tool.mypy]); extra
# arguments go to mypy. `adapters/` is installed as `retool_adapters` (a package-dir mapping, which mypy cannot
# follow), so mypy reads it through a link of that name in its cache folder. Incremental: reruns take seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
path=.mypy_cache/path
mkdir -p "$path"
ln -sfn "$PWD/adapters" "$path/retool_adapters"
exec .venv/bin/python -m mypy "$@" retool_env "$path/retool_adapters" training
