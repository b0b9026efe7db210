"""Parse time per tool-call dialect: a typical turn (reasoning text, then a ~100-token code_interpreter call), and
a hostile 1 MB turn per dialect, side by side with the hermes format's parse of the typical turn (the text part of
`DialectFormat.parse`, after decoding) as the baseline.

The budget a parse must stay under is 2% of the time vLLM takes to generate the 100-token call at 5,000 tokens/s
(20 ms), so 0.4 ms.

    python bench/dialects.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from retool_env.dialects import DIALECTS, FunctionCall, get_dialect
from retool_env.formats import CODE_INTERPRETER_TOOL, make_format
from retool_env.offline import tiny_tokenizer

CODE = ("import sympy as sp\nx = sp.symbols('x')\nroots = sp.solve(x**3 - 6*x**2 + 11*x - 6, x)\n"
        "print(roots)\nprint(sum(r**2 for r in roots))\nfor k in range(1, 6):\n    print(k, k**3 % 7)\n")
REASONING = "Let me find the roots first, then sum their squares; a quick check with code is safest.\n"
TOOLS = [CODE_INTERPRETER_TOOL]


def hostile_inputs(size: int) -> dict[str, str]:
    """Openers without closers and deep nesting, as in tests/test_dialects.py: what makes a naive parser slow."""
    return {
        "open tags": "<tool_call>" * (size // 11),
        "deep brackets": "<tool_call>" + "[" * size + "</tool_call>",
        "deep json": '<tool_call>{"name": "f", "arguments": ' + '{"a": ' * (size // 6) + "</tool_call>",
        "python calls": "[" + "f(a=1), " * (size // 8) + "]",
        "unclosed strings": "[f(a='" + "x" * size + ")]",
        "harmony messages": "<|start|>assistant to=functions.f<|channel|>commentary<|message|>{" * (size // 60),
        "mistral": "[TOOL_CALLS]" * (size // 12),
        "gemma": "<|tool_call>call:f{" + '<|"|>a<|"|>:' * (size // 12),
        "atem": "<atem:function_calls>" + '<atem:invoke name="f">' * (size // 22),
        "unary minus": "[f(a=" + "-" * size + "1)]",
        "deepseek calls": "<｜tool▁calls▁begin｜>" + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n" * (size // 40),
        "json calls": '{"name": "f", "parameters": {}}; ' * (size // 34),
        "deep braces": "{" * size,
    }


def median_time(repeats: int, fn) -> float:
    """Median seconds per call over `repeats` runs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    call = FunctionCall("code_interpreter", {"code": CODE})
    hermes_text = REASONING + get_dialect("hermes").call_text([call])
    hermes_format = make_format("hermes", tiny_tokenizer())
    baseline = median_time(args.repeats, lambda: hermes_format._parse_text(hermes_text, True))
    results = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
               "baseline_hermes_format_ms": round(baseline * 1e3, 4), "dialects": {}}
    hostile = hostile_inputs(1_000_000)
    for name in sorted(DIALECTS):
        dialect = get_dialect(name)
        text = (REASONING if name not in ("llama3_json", "pythonic", "openai") else "") + dialect.call_text([call])
        assert dialect.parse(text, TOOLS).calls[0].arguments == {"code": CODE}, name
        typical = median_time(args.repeats, lambda d=dialect, t=text: d.parse(t, TOOLS))
        worst = max(median_time(1, lambda d=dialect, t=t: d.parse(t, TOOLS)) for t in hostile.values())
        results["dialects"][name] = {"typical_ms": round(typical * 1e3, 4),
                                     "worst_hostile_1MB_ms": round(worst * 1e3, 1)}
        print(f"{name:14s} typical {typical * 1e3:7.4f} ms   worst hostile 1 MB {worst * 1e3:8.1f} ms")
    print(f"baseline (the hermes format's parse) {baseline * 1e3:.4f} ms; budget 0.4 ms")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
