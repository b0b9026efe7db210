"""Environment overhead per step, outside the sandbox and generation, with Qwen's real tokenizer.

Each step is timed from `env.step(action)` to its return, for a tool-call turn (parse, render the observation
through the chat template, append) and for a final-answer turn (parse, grade, reward). The sandbox is replaced by
one that answers instantly, so only the environment's own work is measured. The budget it is compared with is
the time vLLM would take to generate the same action at 5,000 tokens/s.

Hostile actions (`--hostile-tokens`): shapes that were quadratic or recursive on the step path (repeated
`<tool_call>` openers, a code fence followed by spaces, `answer` followed by spaces, nested JSON, nested boxes...),
each one action of the given length, with `max_tool_calls=0` so no call runs. The goal: every step under 50 ms at
4,000 tokens. To compare with another checkout, run this file with that checkout first on PYTHONPATH (a small
`--hostile-tokens`: the old patterns take seconds to minutes per step), with `--skip-regular`.

Per dialect (`--dialects`, default hermes and four non-hermes dialects; "" skips): each dialect on its family's
TRL template (Qwen's offline vocabulary plus the template's special tokens, as the parity tests build it), the
actions rendered by the template itself (`retool_env.coldstart.template_turn_ids`): a call whose code is padded with
a comment to the action's length, and an answer. hermes runs the same way on the tokenizer's own template, side by
side in the same run.

    python bench/env_step.py [--repeats 30] [--hostile-tokens 4000] [--skip-regular] [--dialects hermes,openai]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from retool_env import Problem, ToolEnvironment
from retool_env.chat import chat_template_names, resolve_chat_template
from retool_env.coldstart import template_turn_ids
from retool_env.offline import qwen_tokenizer
from retool_env.sandbox import ExecResult, Sandbox

VLLM_TOKENS_PER_S = 5000


class InstantSandbox(Sandbox):
    """Answers every call at once, so the benchmark sees only the environment's own cost; each answer a new number,
    as real outputs differ (nothing remembered from an earlier step's output helps)."""

    calls = 0

    async def _run(self, code, *, timeout, session, stdin, memory_mb) -> ExecResult:
        InstantSandbox.calls += 1
        return ExecResult(status="ok", stdout=f"{56088 + InstantSandbox.calls}\n", exit_code=0)


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


HOSTILE = {  # (prefix, unit, suffix): the unit repeated between them to about the action's length
    "tool_call openers": ("", "<tool_call>", ""),
    "fence then spaces": ('<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "```python\\nx', " ",
                          '"}}\n</tool_call>'),
    "answer then spaces": ("", "answer" + " " * 500, ""),
    "final answer spaces": ("", "Final " + " " * 100 + "answer" + " " * 100, ""),
    "nested boxes": ("", "\\boxed{", ""),
    "dollars": ("Answer: ", "$", ""),
    "nested json": ("<tool_call>", "[", "</tool_call>"),
    "code openers": ("", "<code>", ""),
    "many calls": ("", '<tool_call>{"name": "code_interpreter", "arguments": {"code": "1"}}</tool_call>', ""),
    "forged turns": ("", "<|im_start|>user\n\\boxed{1}", ""),
}


def hostile_action(tok, shape: str, n_tokens: int) -> list[int]:
    """About `n_tokens` tokens of the shape, the suffix kept (a closed call is parsed, an open one is not)."""
    prefix, unit, suffix = HOSTILE[shape]
    per_unit = len(tok.encode(unit * 1000)) / 1000
    repeats = max(1, int((n_tokens - len(tok.encode(prefix + suffix))) / per_unit))
    return tok.encode(prefix + unit * repeats + suffix)[:n_tokens]


def hostile_rows(tok, n_tokens: int, repeats: int) -> list[dict]:
    rows = []
    for tool_format in ("hermes", "retool"):
        env = ToolEnvironment(tok, [Problem("What is 6 * 7?", "42", id="p")], sandbox=InstantSandbox(),
                              tool_format=tool_format, max_tool_calls=0, max_completion_tokens=10 * n_tokens)
        for shape in HOSTILE:
            action = hostile_action(tok, shape, n_tokens)
            times, error = [], None
            for _ in range(repeats):
                env.reset(options={"index": 0})
                start = time.perf_counter()
                try:
                    env.step(action)
                except Exception as exc:  # a step that raises drops the episode: reported, not hidden
                    error = type(exc).__name__
                times.append(time.perf_counter() - start)
            rows.append({"format": tool_format, "shape": shape, "tokens": len(action), "raised": error,
                         "median_ms": round(statistics.median(times) * 1e3, 2), "max_ms": round(max(times) * 1e3, 2)})
            print(f"{tool_format:<7} {shape:<22} {len(action):>6} tokens  median {rows[-1]['median_ms']:>9.2f} ms  "
                  f"max {rows[-1]['max_ms']:>9.2f} ms{'  raised ' + error if error else ''}", flush=True)
    return rows


# dialect -> the TRL template that teaches it (None: the Qwen tokenizer's own, Qwen3-Instruct-2507's)
DIALECT_TEMPLATES = {"hermes": None, "qwen3_coder": "qwen3_6_training", "llama3_json": "llama3_1",
                     "glm45": "glm4moe_training", "openai": "gptoss_training", "lfm2": "lfm2_v2_training"}


def family_tokenizer(base, template_name: str | None):
    """Qwen's vocabulary with the template's special tokens (one token each, as in the family's tokenizer)."""
    import copy
    import re

    if template_name is None:
        return base
    template = resolve_chat_template(template_name)
    tok = copy.deepcopy(base)
    markup = re.compile(r"<\|[A-Za-z0-9_\"]+\|?>|<[A-Za-z0-9_]+\|>")
    extra = sorted({t for t in markup.findall(template) if t not in tok.get_added_vocab()})
    if extra:
        tok.add_special_tokens({"additional_special_tokens": extra})
    tok.eos_token = next(t for t in ("<|return|>", "<|eot_id|>", "<|endoftext|>") if t in template or
                         t in tok.get_added_vocab())
    tok.chat_template = template
    return tok


def dialect_rows(base, dialects: list[str], sizes: tuple[int, ...], repeats: int) -> list[dict]:
    """Step time per dialect, the actions as each template renders them."""
    rows = []
    filler = "Let me think about the product step by step and check it. " * 600
    for dialect in dialects:
        template = DIALECT_TEMPLATES[dialect]
        if template is not None and template not in chat_template_names():
            print(f"skipping {dialect}: TRL's {template} template is not installed")
            continue
        tok = family_tokenizer(base, template)
        env = ToolEnvironment(tok, [Problem("What is 123 * 456?", "56088", id="p")], sandbox=InstantSandbox(),
                              max_completion_tokens=16384)
        assert env.format.name == dialect, env.format.name
        for n in sizes:
            env.reset(options={"index": 0})
            pad = tok.decode(tok.encode(filler)[: max(0, n - 40)])
            call = template_turn_ids(env, "", f"# {pad}\nprint(123 * 456)")
            answer = template_turn_ids(env, tok.decode(tok.encode(filler)[: max(0, n - 20)]) +
                                       " The answer is \\boxed{56088}.", None)
            for kind, action in (("tool call", call), ("final answer", answer)):
                us = time_steps(env, action, repeats)
                gen_us = len(action) / VLLM_TOKENS_PER_S * 1e6
                rows.append({"dialect": dialect, "template": template or "instruct-2507", "tokens": len(action),
                             "turn": kind, "step_us": round(us, 1), "vllm_generate_us": round(gen_us),
                             "share_pct": round(100 * us / gen_us, 2)})
                r = rows[-1]
                print(f"{dialect:<12} {r['template']:<17} {r['tokens']:>6} {kind:<13} {r['step_us']:>10.1f} us "
                      f"{r['vllm_generate_us']:>8} us {r['share_pct']:>6.2f}%", flush=True)
        env.close()
    return rows


def _code() -> str:
    """The commit that ran (side-by-side runs put another checkout first on PYTHONPATH); no machine path."""
    import subprocess

    import retool_env

    root = Path(retool_env.__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return head.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--hostile-tokens", type=int, default=4000, help="length of the hostile actions (0: skip)")
    parser.add_argument("--hostile-repeats", type=int, default=5)
    parser.add_argument("--skip-regular", action="store_true", help="only the hostile actions")
    parser.add_argument("--dialects", default=",".join(DIALECT_TEMPLATES),
                        help=f"comma-separated dialects to time, of {', '.join(DIALECT_TEMPLATES)} ('' skips)")
    parser.add_argument("--dialect-tokens", default="100,1000,4000", help="action lengths of the dialect rows")
    parser.add_argument("--out", default="bench/results/env_step.json")
    args = parser.parse_args()
    tok = qwen_tokenizer()
    hostile = hostile_rows(tok, args.hostile_tokens, args.hostile_repeats) if args.hostile_tokens else []
    dialects = dialect_rows(tok, [d for d in args.dialects.split(",") if d],
                            tuple(int(n) for n in args.dialect_tokens.split(",")), args.repeats)
    if args.skip_regular:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"machine": platform.platform(), "code": _code(), "hostile": hostile,
                                              "dialects": dialects, "repeats": args.repeats}, indent=2))
        return
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
    Path(args.out).write_text(json.dumps({"machine": platform.platform(), "code": _code(),
                                          "processor": platform.processor(),
                                          "repeats": args.repeats, "rows": rows, "hostile": hostile,
                                          "dialects": dialects}, indent=2))


if __name__ == "__main__":
    main()
