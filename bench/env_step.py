"""Environment overhead per step, outside the sandbox and generation, with Qwen's real tokenizer.

Each step is timed from `env.step(action)` to its return, for a tool-call turn (parse, render the observation
through the chat template, append) and for a final-answer turn (parse, grade, reward). The sandbox is replaced by
one that answers instantly, so only the environment's own work is measured. The budget it is compared with is
the time vLLM would take to generate the same action at 5,000 tokens/s.

    python bench/env_step.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from retool_env import Problem, ToolEnvironment
from retool_env.chat import chat_template_names
from retool_env.offline import qwen_tokenizer
from retool_env.sandbox import ExecResult, Sandbox

VLLM_TOKENS_PER_S = 5000


class InstantSandbox(Sandbox):
    """Answers every call at once, so the benchmark sees only the environment's own cost."""

    async def _run(self, code, *, timeout, session, stdin, memory_mb) -> ExecResult:
        return ExecResult(status="ok", stdout="56088\n", exit_code=0)


def action_of(tok, n_tokens: int, tail: str, think: bool = False) -> list[int]:
    """Reasoning filler of n_tokens in all (inside a think block for a thinking template), ending with `tail` and
    <|im_end|>."""
    filler = tok.encode("Let me think about the product step by step and check it. " * (n_tokens // 8 + 2))
    end = tok.encode(("\n</think>\n\n" if think else "") + tail) + [tok.convert_tokens_to_ids("<|im_end|>")]
    start = tok.encode("<think>\n") if think else []
    return start + filler[: n_tokens - len(end) - len(start)] + end


def time_steps(env, action, repeats: int) -> float:
    """Median microseconds of one step of `action` from a fresh episode."""
    times = []
    for _ in range(repeats):
        env.reset(options={"index": 0})
        start = time.perf_counter()
        env.step(action)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default="bench/results/env_step.json")
    args = parser.parse_args()
    tok = qwen_tokenizer()
    call = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(123 * 456)"}}\n</tool_call>'
    rows = []
    # The tokenizer's own (Qwen3-Instruct-2507), and Qwen3's thinking template (TRL's copy) in both sample modes.
    setups = [("instruct-2507", {}, False)]
    if "qwen3" in chat_template_names():
        setups += [("qwen3 episode", {"chat_template": "qwen3"}, True),
                   ("qwen3 turn", {"chat_template": "qwen3", "sample_mode": "turn"}, True)]
    for template, config, think in setups:
        env = ToolEnvironment(tok, [Problem("What is 123 * 456?", "56088", id="p")], sandbox=InstantSandbox(),
                              max_completion_tokens=16384, **config)
        for n in (100, 1000, 4000):
            for kind, tail in (("tool call", call), ("final answer", "The answer is \\boxed{56088}.")):
                us = time_steps(env, action_of(tok, n, tail, think), args.repeats)
                gen_us = n / VLLM_TOKENS_PER_S * 1e6
                rows.append({"template": template, "tokens": n, "turn": kind, "step_us": round(us, 1),
                             "vllm_generate_us": round(gen_us), "share_pct": round(100 * us / gen_us, 2)})
    print(f"{'template':<14} {'tokens':>7} {'turn':<13} {'step (us)':>10} {'vLLM @5k tok/s (us)':>20} {'share':>7}")
    for r in rows:
        print(f"{r['template']:<14} {r['tokens']:>7} {r['turn']:<13} {r['step_us']:>10.1f} "
              f"{r['vllm_generate_us']:>20} {r['share_pct']:>6.2f}%")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": platform.platform(), "processor": platform.processor(),
                                          "repeats": args.repeats, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
