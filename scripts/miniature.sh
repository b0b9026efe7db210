#!/usr/bin/env bash
# ReTool in miniature, the main job: tokenizer + tiny Qwen2 built offline, cold-start SFT, GRPO through
# `accelerate launch training/grpo_trl.py`, held-out evaluation per level, for a tool arm and a text-only arm.
#   bash scripts/miniature.sh            # one seed, both arms (about 15 minutes on 2 CPU cores)
#   bash scripts/miniature.sh --seeds 3  # mean and spread over three seeds
#   bash scripts/miniature.sh --seed_list 0 1 2 --out runs/sweep  # these seeds; the same command resumes
#   bash scripts/miniature.sh --smoke    # end to end in about a minute
# Writes runs/miniature-<timestamp>/ (seed<k>.json, metrics.jsonl, report.md, plots); --out DIR to choose.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python training/miniature.py "$@"
