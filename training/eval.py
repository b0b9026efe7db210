"""Evaluate a tool-using math model with ReTool-Env: accuracy (mean@n, pass@k, maj@k), tool statistics, per level.

The command line of `retool_adapters.eval_cli` (also `retool-env eval`), over the library `retool_env.evaluation`.

    # Offline CPU smoke run: a tiny random Qwen2 on procedural problems (training/configs/eval_tiny_cpu.yaml, the
    # default config); every flag applies on top of it
    python training/eval.py --limit 2

    # The paper's protocol on AIME 2024: 32 samples per problem, T=1.0, top-p 0.7, up to 16384 tokens, vLLM
    python training/eval.py --config training/configs/eval_qwen3_4b_aime24.yaml --model runs/sft-qwen3-4b-retool

`python training/eval.py --help` lists the arguments.
"""

from retool_adapters.eval_cli import main

if __name__ == "__main__":
    main()
