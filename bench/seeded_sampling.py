"""What reproducible sampling costs: the miniature's held-out evaluation with unseeded and with seeded sampling,
side by side in one run, on the same model, problems and sandbox.

Unseeded, `HFGenerator` batches whatever arrives together and samples with torch's global generator, so the tokens
depend on how requests happened to batch. Seeded, every request draws keyed Gumbel noise and every batch is computed
with the same shapes (prompts padded to a multiple of 64, the batch filled to `max_batch_size` rows): the cost is
the compute on padding. The runs alternate (unseeded, seeded, unseeded, ...) so drift on the machine hits both.

    python bench/seeded_sampling.py --run runs/final-5seeds/seed0   # a miniature seed: its SFT model, its test set
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from retool_adapters.generators import HFGenerator
from retool_env.data import load_problems
from retool_env.evaluation import evaluate
from retool_env.rollout import SamplingParams

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="A miniature seed folder (runs/<name>/seed<N>): its tool arm's "
                                                     "SFT model and its held-out problems")
    parser.add_argument("--per_level", type=int, default=16, help="The first problems of each level")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64, help="Episodes in flight (and max_batch_size)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pad_multiple", type=int, default=64, help="HFGenerator's pad_multiple (seeded requests)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "seeded_sampling.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)

    model_dir = Path(args.run) / "tool" / "sft"
    taken: dict[str, int] = {}
    problems = []
    for problem in load_problems(str(Path(args.run) / "test.jsonl")):
        taken[problem.level] = taken.get(problem.level, 0) + 1
        if taken[problem.level] <= args.per_level:
            problems.append(problem)
    env = {"tool_format": "retool", "prompt": "plain", "max_tool_calls": 2, "max_completion_tokens": 160,
           "max_observation_tokens": 48, "max_turn_tokens": 48}
    timings: dict[str, list[float]] = {"unseeded": [], "seeded": []}
    accuracy: dict[str, list[float]] = {"unseeded": [], "seeded": []}
    tokens: dict[str, list[float]] = {"unseeded": [], "seeded": []}
    for _ in range(args.repeats):
        for name, seed in (("unseeded", None), ("seeded", 0)):
            generator = HFGenerator.from_pretrained(model_dir, max_batch_size=args.concurrency,
                                                    pad_multiple=args.pad_multiple)
            start = time.perf_counter()
            metrics = evaluate(problems, generator, generator.tokenizer, n_samples=args.samples,
                               sampling=SamplingParams(temperature=1.0, seed=seed), concurrency=args.concurrency,
                               progress=False, **env)
            timings[name].append(time.perf_counter() - start)
            accuracy[name].append(metrics[f"mean@{args.samples}"])
            tokens[name].append(metrics["mean_completion_tokens"])
    result = {
        "command": " ".join(sys.argv),
        "machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}",
        "episodes": len(problems) * args.samples, "concurrency": args.concurrency, "pad_multiple": args.pad_multiple,
        "seconds": timings, "accuracy": accuracy, "mean_completion_tokens": tokens,
        "median_seconds": {k: statistics.median(v) for k, v in timings.items()},
        "seeded_over_unseeded": statistics.median(timings["seeded"]) / statistics.median(timings["unseeded"]),
        "seeded_runs_identical": len(set(accuracy["seeded"])) == 1 and len(set(tokens["seeded"])) == 1,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
