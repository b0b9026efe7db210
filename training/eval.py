"""Evaluate a tool-using math model with ReTool-Env, with and without the tool: mean@n with 95% intervals, pass@k,
maj@k, tool statistics and parse failures, per benchmark and level.

The command line of `retool_adapters.eval_cli` (also `retool-env eval`), over the library `retool_env.evaluation`.

    # Offline CPU smoke run: a tiny random Qwen2 on procedural problems (retool_env/configs/eval_tiny_cpu.yaml, read
    # when neither --config, --model nor --protocol is given); every flag applies on top of it
    python training/eval.py --limit 2

    # A published protocol (paper, verl, matharena, aster) on the 2026 benchmarks, vLLM on one GPU
    python training/eval.py --protocol matharena --backend vllm --model runs/grpo --dataset aime26,hmmt_feb25

    # The recipe's config: AIME 2024 with the paper's settings
    python training/eval.py --config training/configs/eval_qwen3_4b_aime24.yaml --model runs/sft-qwen3-4b-retool

`python training/eval.py --help` lists the arguments.
"""

from retool_adapters.eval_cli import main

if __name__ == "__main__":
    main()
