"""The dialect step of `bench/env_step.py`, two checkouts side by side in small alternating batches.

On a shared VM a machine's speed drifts from minute to minute, so two runs one after the other can differ by more
than the change being measured. Here two worker processes (one per checkout, each with its own Python and
`PYTHONPATH`) build the same environments as `env_step.py --dialects` (100-token actions, the instant sandbox) and
take turns, 20 steps at a time, alternating which goes first; the medians are over every step of every round.

    python bench/env_step_side_by_side.py --baseline /path/to/other/checkout [--baseline-python PY] [--rounds 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import env_step as B
from retool_env import Problem, ToolEnvironment
from retool_env.coldstart import template_turn_ids
from retool_env.offline import qwen_tokenizer
base, envs = qwen_tokenizer(), {}
filler = "Let me think about the product step by step and check it. " * 600
def get(dialect):
    if dialect not in envs:
        tok = B.family_tokenizer(base, B.DIALECT_TEMPLATES[dialect])
        env = ToolEnvironment(tok, [Problem("What is 123 * 456?", "56088", id="p")], sandbox=B.InstantSandbox(),
                              max_completion_tokens=16384)
        env.reset(options={"index": 0})
        pad = tok.decode(tok.encode(filler)[:60])
        call = template_turn_ids(env, "", f"# {pad}\nprint(123 * 456)")
        answer = template_turn_ids(env, tok.decode(tok.encode(filler)[:80]) + " The answer is \\boxed{56088}.", None)
        envs[dialect] = (env, {"tool call": call, "final answer": answer})
    return envs[dialect]
print("ready", flush=True)
for line in sys.stdin:
    dialect, kind, n = json.loads(line)
    env, actions = get(dialect)
    times = []
    for _ in range(n):
        env.reset(options={"index": 0})
        start = time.perf_counter()
        env.step(actions[kind])
        times.append(time.perf_counter() - start)
    print(json.dumps([len(actions[kind]), times]), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", required=True, help="the other checkout (its root goes first on PYTHONPATH)")
    parser.add_argument("--baseline-python", default=sys.executable)
    parser.add_argument("--dialects", default="hermes,qwen3_coder,llama3_json,glm45,openai")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--out", default="bench/results/env_step_side_by_side.json")
    args = parser.parse_args()
    bench = str(Path(__file__).resolve().parent)
    workers = {}
    for name, python, path in (("baseline", args.baseline_python, args.baseline), ("this", sys.executable, None)):
        env = dict(os.environ)
        if path:
            env["PYTHONPATH"] = path
        workers[name] = subprocess.Popen([python, "-c", WORKER, bench], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, env=env, cwd="/tmp")
        assert workers[name].stdout.readline().strip() == "ready"
    dialects = args.dialects.split(",")
    times: dict[tuple[str, str, str], list[float]] = {}
    tokens: dict[tuple[str, str], int] = {}
    for round_ in range(args.rounds):
        for dialect in dialects:
            for kind in ("tool call", "final answer"):
                for name in ("baseline", "this") if round_ % 2 else ("this", "baseline"):
                    workers[name].stdin.write(json.dumps([dialect, kind, 20]) + "\n")
                    workers[name].stdin.flush()
                    n, batch = json.loads(workers[name].stdout.readline())
                    tokens[(dialect, kind)] = n
                    times.setdefault((name, dialect, kind), []).extend(batch)
    rows = []
    for dialect in dialects:
        for kind in ("tool call", "final answer"):
            base, this = (statistics.median(times[(n, dialect, kind)]) * 1e6 for n in ("baseline", "this"))
            gen = tokens[(dialect, kind)] / 5000 * 1e6
            rows.append({"dialect": dialect, "turn": kind, "tokens": tokens[(dialect, kind)],
                         "baseline_us": round(base, 1), "this_us": round(this, 1), "vllm_generate_us": round(gen),
                         "baseline_share_pct": round(100 * base / gen, 2),
                         "this_share_pct": round(100 * this / gen, 2)})
            r = rows[-1]
            print(f"{dialect:<12} {kind:<13} {r['tokens']:>4} baseline {base:8.0f} us "
                  f"({r['baseline_share_pct']:.1f}%)  "
                  f"this {this:8.0f} us ({r['this_share_pct']:.1f}%)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    baseline = subprocess.run(["git", "-C", args.baseline, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()  # the commit, not the machine's path to it
    Path(args.out).write_text(json.dumps({"baseline": baseline, "rounds": args.rounds, "steps_per_batch": 20,
                                          "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
