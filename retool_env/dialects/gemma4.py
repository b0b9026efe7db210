"""gemma4: Gemma 4 (and DiffusionGemma), `<|tool_call>call:NAME{key:value,...}<tool_call|>`.

    <|tool_call>call:code_interpreter{code:<|"|>print(6 * 7)<|"|>}<tool_call|>

Keys are bare, strings are delimited by `<|"|>` (nothing inside is escaped), other values are JSON-like. Several
calls per turn; the model then writes `<|tool_response>` and the result follows inside its turn (the first Gemma 4
release template uses a `tool` turn instead). vLLM: `--tool-call-parser gemma4`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from retool_env.dialects.base import Dialect, FunctionCall, RawCall, Scan, loads_json, scan_blocks

CALL_START, CALL_END, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_WORD_CHARS = _WORD | frozenset("0123456789-.")
_NUMBER_START, _NUMBER_CHARS = frozenset("-0123456789"), frozenset("0123456789.eE+-")


def gemma_to_json(text: str) -> tuple[str | None, str | None]:
    """Gemma's argument syntax as JSON text: `<|"|>` strings JSON-quoted, bare keys quoted; one pass."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith(QUOTE, i):
            close = text.find(QUOTE, i + len(QUOTE))
            if close < 0:
                return None, f"a {QUOTE} string is not closed with {QUOTE}"
            out.append(json.dumps(text[i + len(QUOTE):close], ensure_ascii=False))
            i = close + len(QUOTE)
        elif text[i] in _NUMBER_START:  # a number keeps its exponent: 2.5e-14
            j = i + 1
            while j < n and text[j] in _NUMBER_CHARS:
                j += 1
            out.append(text[i:j])
            i = j
        elif text[i] in _WORD:
            j = i
            while j < n and text[j] in _WORD_CHARS:
                j += 1
            word = text[i:j]
            out.append(word if word in ("true", "false", "null") else json.dumps(word))
            i = j
        else:
            out.append(text[i])
            i += 1
    return "".join(out), None


def read_gemma_call(body: str) -> list[RawCall]:
    head, brace, rest = body.partition("{")
    head = head.strip()
    name = head.removeprefix("call:").removeprefix(":").strip()  # `:NAME{` as some models write it, vLLM reads it
    if not head.startswith(("call:", ":")) or not brace or not name:
        return [RawCall(None, error=f"write {CALL_START}call:NAME{{key:value}}{CALL_END}")]
    converted, error = gemma_to_json("{" + rest)
    if error is None and converted is not None:
        arguments, error = loads_json(converted)
        if error is None and not isinstance(arguments, dict):
            error = "the arguments must be an object {key:value,...}"
    return [RawCall(name, None if error else arguments, error and f"the arguments of {name} are {error}")]


def gemma_value(value: object) -> str:
    """A value as the Gemma 4 template's `format_argument` writes a call's arguments (keys bare)."""
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{gemma_value(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(gemma_value(v) for v in value) + "]"
    return "null" if value is None else str(value)


class Gemma4(Dialect):
    name = "gemma4"
    markers = (("<|tool_call>call:",),)
    end_tokens = ("<turn|>",)
    stop_strings = ("<|tool_response>",)
    call_blocks = ((CALL_START, CALL_END),)

    def _scan(self, text: str) -> Scan:
        return scan_blocks(text, CALL_START, CALL_END, read_gemma_call)

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        return "".join(f"{CALL_START}call:{call.name}{{"
                       + ",".join(f"{key}:{gemma_value(value)}" for key, value in sorted(call.arguments.items()))
                       + f"}}{CALL_END}" for call in calls)


Gemma4.register()
