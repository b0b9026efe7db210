"""What the trajectory options cost next to a GRPO step: RoC down-sampling, sign-safe shaping, the void-turn and
accuracy filters, and the episode records, timed inside real GRPOTrainer steps on the miniature's batch shape
(4 problems x 8 episodes), with the tiny offline tool-calling Qwen generating through Hugging Face `generate`.

The options' own work (`ReToolRollout.training_plan`, `write_records`, the `retool/*` metrics) is timed where it
runs, in the same steps whose wall time is the baseline, so load on the machine hits both alike.

    python bench/tir_options.py --steps 3   # writes bench/results/tir_options.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "tir_options.json"))
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import retool_adapters.trl.rollout as trl_adapter
    from retool_adapters.trl import REWARD_FUNCS, REWARD_WEIGHTS, ReToolRollout, problems_to_dataset
    from retool_adapters.trl.testing import build_tool_calling_qwen
    from retool_env.data import load_problems

    torch.set_num_threads(1)
    spent = {"training_plan": 0.0, "write_records": 0.0, "episode_metrics": 0.0}
    calls = {"rollouts": 0, "episodes": 0}

    def timed(name, fn):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - start
        return wrapper

    class Timed(ReToolRollout):
        training_plan = timed("training_plan", ReToolRollout.training_plan)
        write_records = timed("write_records", ReToolRollout.write_records)

        def __call__(self, prompts, trainer):
            calls["rollouts"] += 1
            calls["episodes"] += len(prompts)
            return super().__call__(prompts, trainer)

    trl_adapter.episode_metrics = timed("episode_metrics", trl_adapter.episode_metrics)
    problems = load_problems("arith", split="train", limit=4)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tool_calling_qwen(Path(tmp) / "model", problems)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        rollout = Timed(problems, max_tool_calls=2, mask_void_turns=True, accuracy_filter=(0.1, 0.9),
                        roc_down_sample=4, sign_safe_shaping=True, records_path=Path(tmp) / "records.jsonl",
                        reward_kwargs={"tool_call_cost": 0.05, "tool_success_reward": 0.02})
        config = GRPOConfig(output_dir=tmp, use_cpu=True, bf16=False, seed=0, max_steps=args.steps,
                            per_device_train_batch_size=32, num_generations=8, max_completion_length=96,
                            temperature=1.0, learning_rate=1e-4, logging_steps=1, save_strategy="no",
                            report_to="none", disable_tqdm=True, reward_weights=list(REWARD_WEIGHTS))
        trainer = GRPOTrainer(model=str(model_dir), reward_funcs=list(REWARD_FUNCS), args=config,
                              train_dataset=problems_to_dataset(problems), processing_class=tokenizer,
                              rollout_func=rollout)
        start = time.perf_counter()
        trainer.train()
        train_seconds = time.perf_counter() - start
        records = len((Path(tmp) / "records.jsonl").read_text().splitlines())
    options = sum(spent.values())
    result = {
        "machine": platform.platform(), "cpus": os.cpu_count(),
        "note": "2 CPU cores shared with other jobs (loaded); baseline and options timed in the same steps",
        "steps": args.steps, "episodes_per_step": calls["episodes"] // max(calls["rollouts"], 1),
        "records_written": records,
        "grpo_step_seconds": round(train_seconds / args.steps, 3),
        "options_seconds_per_step": {k: round(v / args.steps, 5) for k, v in spent.items()},
        "options_share_of_step": round(options / train_seconds, 5),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
