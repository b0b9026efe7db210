"""Model turns for the differential test of the dialects against vLLM's tool parsers (`test_tool_parser_parity`).

Hand-written edge cases per class of disagreement, plus generated calls (several per turn, every JSON type, unicode,
quotes, newlines, long code) written as each family's template writes them (`Dialect.call_text`). Pure Python: the
cases are built without vLLM.
"""

from __future__ import annotations

import json
import random
from typing import Any

from retool_env.dialects import FunctionCall, get_dialect

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "code_interpreter", "description": "Run Python.", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {
        "type": "object", "properties": {
            "query": {"type": "string"}, "limit": {"type": "integer"}, "scale": {"type": "number"},
            "exact": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}},
            "filters": {"type": "object"}, "page": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "ratio": {"type": "float"}},
        "required": ["query"]}}},
]

_STRINGS = ["plain", "ünïcødé ✓ 中文", 'a "quoted" word', "it's", "back\\slash", "line\nbreak\ttab", "",
            "</tool_call> inside", "{\"json\": [1, 2]}", "emoji 🚀", " spaced "]
_CODE = ["print(6 * 7)", "import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve(x**2 - 4, x))",
         'print("a \\"quoted\\" \\\\ value")\nfor i in range(3):\n    print(i)',
         "\n".join(f"v{i} = {i} ** 2  # line {i}" for i in range(120))]


def generated_calls(seed: int, count: int) -> list[list[FunctionCall]]:
    """Turns of 1-3 calls with arguments of every JSON type the search tool declares."""
    rng = random.Random(seed)
    turns = []
    for _ in range(count):
        calls = []
        for _ in range(rng.choice([1, 1, 2, 3])):
            if rng.random() < 0.4:
                calls.append(FunctionCall("code_interpreter", {"code": rng.choice(_CODE)}))
                continue
            arguments: dict[str, Any] = {"query": rng.choice(_STRINGS)}
            if rng.random() < 0.6:
                arguments["limit"] = rng.choice([0, 7, -3, 10**6])
            if rng.random() < 0.5:
                arguments["scale"] = rng.choice([0.5, -2.25, 1e-7, 3.0])
            if rng.random() < 0.5:
                arguments["exact"] = rng.choice([True, False])
            if rng.random() < 0.5:
                arguments["tags"] = rng.sample(_STRINGS, rng.randint(0, 3))
            if rng.random() < 0.4:
                arguments["filters"] = {"lang": rng.choice(_STRINGS), "n": [1, 2.5, None, {"deep": True}]}
            calls.append(FunctionCall("search", arguments))
        turns.append(calls)
    return turns


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# Hand-written turns per dialect: the classes of disagreement found against vLLM, and the usual mistakes.
EDGE_CASES: dict[str, list[str]] = {
    "hermes": [
        'Let me compute.\n<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"}}\n</tool_call>',
        '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"}}',  # no </tool_call> at the end
        '<tool_call>{"name": "search", "arguments": {"query": "q", "limit": 3}}</tool_call>\n<tool_call>'
        '{"name": "code_interpreter", "arguments": {"code": "x"}}</tool_call>',
        '<tool_call>\n{"name": "search", "arguments": "{\\"query\\": \\"as a string\\"}"}\n</tool_call>',
        'No call here, just an answer: \\boxed{42}.',
        '<tool_call>\n{"name": "search", "arguments": {"query": "ünï \\u00e9", "tags": []}}\n</tool_call>after',
    ],
    "qwen3_coder": [
        "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n<parameter=page>\n5\n</parameter>\n"
        "</function>\n</tool_call>",  # anyOf [integer, null]
        "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n"
        "</function>\n</tool_call>",  # the "float" type
        "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n"
        "</parameter>\n<parameter=filters>\n{\"k\": 1}\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=search>\n<parameter=query>\nDallas\n<parameter=limit>\n3\n</parameter>\n"
        "</function>\n</tool_call>",  # a missing </parameter>
        "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n<parameter=page>\nnull\n</parameter>\n"
        "</function>\n</tool_call>",
        "<function=code_interpreter>\n<parameter=code>\nprint(1)\n</parameter>\n</function>",  # no wrapper
        "Before.\n<tool_call>\n<function=code_interpreter>\n<parameter=code>\nif a < b:\n    print('<x>')\n"
        "</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n<parameter=exact>\nTrue\n"
        "</parameter>\n<parameter=scale>\n2\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=code_interpreter>\n<parameter=code>\nprint('<parameter=x>')\n</parameter>\n"
        "</function>\n</tool_call>",
        "<tool_call>\n<function=code_interpreter>\n<parameter=code>\nprint('</function>')\n</parameter>\n"
        "</function>\n</tool_call>",
    ],
    "llama3_json": [
        '{"name": "code_interpreter", "parameters": {"code": "print(1)"}}',
        '<|python_tag|>{"name": "search", "parameters": {"query": "q", "limit": 2}}',
        'Here is the call: {"name": "code_interpreter", "parameters": {"code": "print(1)"}}',  # prose first
        '{"name": "search", "parameters": {"query": "a"}}; {"name": "search", "parameters": {"query": "b"}}',
        '{"name": "search", "arguments": {"query": "arguments key"}}',
        'The answer is \\boxed{7}.',
    ],
    "mistral": [
        '[TOOL_CALLS]code_interpreter[ARGS]{"code": "print(1)"}',
        '[TOOL_CALLS]search[ARGS]{"query": "a"}[TOOL_CALLS]search[ARGS]{"query": "b"}',
        '[TOOL_CALLS][{"name": "search", "arguments": {"query": "q"}}]',
        '[TOOL_CALLS][{"name": "search", "arguments": {"query": "a"}}][TOOL_CALLS][{"name": "search", '
        '"arguments": {"query": "b"}}]',  # a repeated [TOOL_CALLS] (pre-v11)
        '[TOOL_CALLS]{"name": "search", "arguments": {"query": "bare object"}}',  # a bare object (pre-v11)
        '[TOOL_CALLS]search{"query": "no ARGS"}',  # name{json} without [ARGS]
        '[TOOL_CALLS]search[ARGS]{"query": "q"} and then some text',  # text after the call
        '[TOOL_CALLS][{"name": "search", "arguments": {"query": "ok"}}, {"junk": 1}]',  # a junk entry
        'Let me search.[TOOL_CALLS]search[ARGS]{"query": "q", "limit": 5}',
    ],
    "lfm2": [
        "<|tool_call_start|>[code_interpreter(code='print('hi')')]<|tool_call_end|>",  # raw quotes (LFM2.5's first)
        "<|tool_call_start|>[code_interpreter(code='x = f('a', 'b')\nprint(x)')]<|tool_call_end|>",
        "<|tool_call_start|>[search(query='sed -n '1,9p' f.py')]<|tool_call_end|>",
        "<|tool_call_start|>[search(query=\"say \"hi\" now\", limit=3)]<|tool_call_end|>",
        "<|tool_call_start|>[search(query='q', limit=07)]<|tool_call_end|>",  # a zero-padded integer
        "<|tool_call_start|>[search(query='q', limit=007, scale=07.5, page=00)]<|tool_call_end|>",
        "<|tool_call_start|>[search(query='it's', limit=08)]<|tool_call_end|>",  # both: the zeros sit in the string
        "<|tool_call_start|>[search(query='1'2', exact='3')]<|tool_call_end|>",  # two closing quotes read
        "<|tool_call_start|>[search(query='a'b'c', tags=['x', 'y'])]<|tool_call_end|>",
        "<|tool_call_start|>[search(query='q', tags=['it's'])]<|tool_call_end|>",
    ],
    "openai": [
        ' to=functions.search<|channel|>commentary json<|message|>{"query": "q", "limit": 3}<|call|>',
        ' to=search<|channel|>commentary json<|message|>{"query": "bare recipient"}<|call|>',
        '<|channel|>commentary to=functions.search <|constrain|>json<|message|>{"query": "q"}<|call|>',
        ' to=python<|channel|>commentary code<|message|>print(6 * 7)<|call|>',  # gpt-oss's built-in tools
        '<|channel|>commentary to=browser.search json<|message|>{"query": "q"}<|call|>',
        ' to=container.exec<|channel|>commentary json<|message|>{"cmd": ["ls"]}<|call|>',
        ' to=functions.<|channel|>commentary json<|message|>{}<|call|>',
        ' to=assistant<|channel|>commentary json<|message|>{}<|call|>',
        '<|channel|>analysis<|message|>Let me search.<|end|><|start|>assistant to=functions.search<|channel|>'
        'commentary json<|message|>{"query": "after reasoning"}<|call|>',
        '<|channel|>commentary<|message|>Preamble.<|end|><|start|>assistant to=functions.search<|channel|>'
        'commentary json<|message|>{"query": "q"}<|call|>',
        ' to=functions.search<|channel|>commentary json<|message|>{"query": "cut off',
        ' to=functions.search<|channel|>commentary json<|message|>not json<|call|>',
        '<|channel|>final<|message|>The answer is \\boxed{42}.<|return|>',
        '<|channel|>analysis<|message|>6 * 7<|end|><|start|>assistant<|channel|>final The answer is 42.<|return|>',
    ],
}
# Harmony turns whose content vLLM gives back, compared besides the calls (its end token aside).
HARMONY_CONTENT = [text for text in EDGE_CASES["openai"] if "final" in text or "Preamble" in text]


def turns(dialect: str, seed: int = 0, count: int = 200) -> list[str]:
    """The edge cases, then `count` generated turns written as the dialect's family writes them."""
    write = get_dialect(dialect).call_text
    generated = [write(calls) for calls in generated_calls(seed, count)
                 if get_dialect(dialect).multiple_calls or len(calls) == 1]
    return [*EDGE_CASES.get(dialect, []), *generated]
