"""Where a step's time goes: timers around the pieces of `ToolEnvironment.step`, in process, per dialect.

The environments and actions of `env_step.py --dialects` (100-token actions, the instant sandbox), each step right
after a reset, as the bench times it (the wrappers add about a microsecond per piece). Each piece is timed by
wrapping the method that does it (`perf_counter_ns`); a piece's median is over every step, and nested pieces are
inside their parents (the render is inside the tool turn's observation). `--cprofile` prints cProfile's top
functions for one dialect instead.

    python bench/env_step_profile.py [--steps 300] [--dialects hermes,qwen3_coder] [--cprofile qwen3_coder]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import inspect
import pstats
import statistics
import time
from pathlib import Path

import env_step as B

from retool_env import Problem, ToolEnvironment, chat, chat_render, env, formats, tool_runner
from retool_env.coldstart import template_turn_ids
from retool_env.offline import qwen_tokenizer

# (owner, attribute, label): the pieces timed
PIECES = [
    (env.ToolEnvironment, "_take_action", "take action (split, append, parse)"),
    (formats.ToolFormat, "parse", "  parse (hermes)"),
    (formats.DialectFormat, "parse", "  parse (dialect)"),
    (formats, "decode", "    decode (Rust)"),
    (tool_runner.ToolRunner, "run_turn", "run the call (instant sandbox)"),
    (tool_runner.ToolRunner, "_record", "  record (clip the output)"),
    (env.ToolEnvironment, "_observe", "observe (render, encode, append, info)"),
    (chat.Conversation, "after_tools", "  after tools"),
    (chat_render.ChatRenderer, "render", "    render the conversation"),
    (chat.Conversation, "encode_rendered", "    encode the appended text"),
    (env, "agrade", "grade"),
    (env.ToolEnvironment, "_finish", "finish (reward, info)"),
    (env.ToolEnvironment, "astep", "astep"),
]


_timing = [False]  # only while a step runs (a reset renders too)


def _wrap(owner, name, label, times):
    original = inspect.getattr_static(owner, name)
    function = original.__func__ if isinstance(original, staticmethod) else original
    if inspect.iscoroutinefunction(function):
        @functools.wraps(function)
        async def timed(*args, **kwargs):
            start = time.perf_counter_ns()
            try:
                return await function(*args, **kwargs)
            finally:
                if _timing[0]:
                    times.setdefault(label, []).append(time.perf_counter_ns() - start)
    else:
        @functools.wraps(function)
        def timed(*args, **kwargs):
            start = time.perf_counter_ns()
            try:
                return function(*args, **kwargs)
            finally:
                if _timing[0]:
                    times.setdefault(label, []).append(time.perf_counter_ns() - start)
    setattr(owner, name, staticmethod(timed) if isinstance(original, staticmethod) else timed)
    return original


def build(base, dialect):
    tok = B.family_tokenizer(base, B.DIALECT_TEMPLATES[dialect])
    environment = ToolEnvironment(tok, [Problem("What is 123 * 456?", "56088", id="p")], sandbox=B.InstantSandbox(),
                                  max_completion_tokens=16384)
    environment.reset(options={"index": 0})
    filler = "Let me think about the product step by step and check it. " * 600
    pad = tok.decode(tok.encode(filler)[:60])
    call = template_turn_ids(environment, "", f"# {pad}\nprint(123 * 456)")
    answer = template_turn_ids(environment, tok.decode(tok.encode(filler)[:80]) + " The answer is \\boxed{56088}.",
                               None)
    return environment, {"tool call": call, "final answer": answer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--dialects", default=",".join(B.DIALECT_TEMPLATES))
    parser.add_argument("--cprofile", default=None, help="a dialect: print cProfile's top functions instead")
    parser.add_argument("--out", default=None, help="write the medians as JSON here")
    args = parser.parse_args()
    base = qwen_tokenizer()
    if args.cprofile:
        environment, actions = build(base, args.cprofile)
        for kind, action in actions.items():
            profile = cProfile.Profile()
            for _ in range(args.steps):
                environment.reset(options={"index": 0})
                profile.enable()
                environment.step(action)
                profile.disable()
            print(f"=== {args.cprofile}, {kind}")
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    rows = {}
    for dialect in args.dialects.split(","):
        environment, actions = build(base, dialect)
        for kind, action in actions.items():
            for _ in range(20):  # warm: the fast render's checks, the pieces' caches
                environment.reset(options={"index": 0})
                environment.step(action)
            times: dict[str, list[int]] = {}
            originals = [(owner, name, _wrap(owner, name, label, times)) for owner, name, label in PIECES]
            try:
                for _ in range(args.steps):
                    environment.reset(options={"index": 0})
                    _timing[0] = True
                    start = time.perf_counter_ns()
                    environment.step(action)
                    times.setdefault("step", []).append(time.perf_counter_ns() - start)
                    _timing[0] = False
            finally:
                for owner, name, original in originals:
                    setattr(owner, name, original)
            row = {label: round(statistics.median(values) / 1000, 1) for label, values in times.items()}
            rows[f"{dialect} {kind}"] = row
            print(f"=== {dialect}, {kind}: {len(action)} tokens, step {row['step']:.0f} us (median of {args.steps})")
            for _, _, label in PIECES:
                if label in row:
                    print(f"  {label:<44} {row[label]:>8.1f} us")
    if args.out:
        import json

        Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
