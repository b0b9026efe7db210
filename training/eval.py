"""Evaluate a tool-using math model with ReTool-Env: accuracy (mean@n, pass@k, maj@k), tool statistics, per level.

The command line of `retool_adapters.eval_cli` (also `retool-env eval`), over the library `retool_env.evaluation`.

    # Offline CPU smoke run: a tiny random Qwen2 on procedural problems (training/configs/eval_tiny_cpu.yaml)
    python training/eval.py

    # The paper's protocol on AIME 2024: 32 samples per problem, T=1.0, top-p 0.7, up to 16384 tokens, vLLM
    python training/eval.py --config training/configs/eval_qwen3_4b_aime24.yaml --model runs/sft-qwen3-4b-retool

`python training/eval.py --help` lists every argument.
"""

import sys
from pathlib import Path

from retool_adapters.eval_cli import main

TINY_CPU_CONFIG = Path(__file__).parent / "configs" / "eval_tiny_cpu.yaml"

if __name__ == "__main__":
    # No arguments at all: the offline CPU smoke run.
    main(sys.argv[1:] or ["--config", str(TINY_CPU_CONFIG)])
