#!/usr/bin/env bash
# The adapter tests against the frameworks' real packages (verl, SkyRL-gym, OpenEnv, OpenRLHF, GEM, NeMo-Gym, verifiers)
# in .venv-frameworks, where none of them is skipped. Creates the venv on first use (about 5 minutes), then runs in about 3 minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_frameworks.sh
exec .venv-frameworks/bin/python -m pytest -q tests/test_adapter_*.py "$@"
