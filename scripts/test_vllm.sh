#!/usr/bin/env bash
# The vLLM generation tests (tests/vllm) in their own venv, .venv-vllm: vLLM's CPU build pins transformers<5.20.
# Creates the venv on first use (about 5 minutes), then runs in about 3-5 minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_vllm.sh
.venv-vllm/bin/python -m pytest -q tests/vllm "$@"
# The slime adapter's vLLM-router wire format, checked against vLLM's own request and response models.
.venv-vllm/bin/python -m pytest -q tests/test_adapter_slime.py -k vllm
