#!/usr/bin/env bash
# The vLLM generation tests (tests/vllm) in their own venv, .venv-vllm: vLLM's CPU build pins transformers<5.20.
# Creates the venv on first use (about 5 minutes), then runs in about 3-5 minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_vllm.sh
exec .venv-vllm/bin/python -m pytest -q tests/vllm "$@"
