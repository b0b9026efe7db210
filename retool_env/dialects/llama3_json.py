"""llama3_json: Llama 3.1/3.2/3.3, the whole turn is one JSON object `{"name": ..., "parameters": {...}}`.

The templates render one call per assistant turn (the model may write several separated by `;`, as vLLM reads
them) and the result as an `ipython` turn. A turn that does not start with `{` (or `<|python_tag|>`) holds no call.
vLLM: `--tool-call-parser llama3_json`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from retool_env.dialects.base import (
    MAX_CALLS,
    MAX_DEPTH,
    Dialect,
    FunctionCall,
    RawCall,
    Scan,
    bracket_end,
    json_depth_ok,
    json_error,
    named_arguments,
)

_DECODER = json.JSONDecoder()


def read_json_sequence(text: str, separator: str = ";") -> list[RawCall]:
    """JSON call objects one after another, separated by `separator` (whitespace around it allowed)."""
    if not json_depth_ok(text):
        return [RawCall(None, error=f"the call nests deeper than {MAX_DEPTH} levels")]
    calls: list[RawCall] = []
    position = 0
    while position < len(text):
        try:
            call, end = _DECODER.raw_decode(text, position)
        except ValueError as exc:  # JSONDecodeError, or a number json cannot hold
            return [*calls, RawCall(None, error=f"the tool call is not valid JSON ({json_error(exc)})")]
        if not isinstance(call, dict):
            return [*calls, RawCall(None, error="the tool call must be a JSON object")]
        calls.append(named_arguments(call, ("name",), ("parameters", "arguments")))
        if len(calls) > MAX_CALLS:
            return calls
        position = end
        while position < len(text) and text[position] in " \t\r\n":
            position += 1
        if position < len(text) and text[position] == separator:
            position += 1
            while position < len(text) and text[position] in " \t\r\n":
                position += 1
        elif position < len(text):
            return [*calls, RawCall(None, error=f"unexpected text after the tool call: {text[position:][:40]!r}")]
    return calls


class Llama3Json(Dialect):
    name = "llama3_json"
    markers = (('"parameters": ',), ("<|python_tag|>",))
    detect_after = ("atem", "mistral", "pythonic")
    end_tokens = ("<|eot_id|>", "<|eom_id|>")
    stop_strings = ("<|eom_id|>",)
    multiple_calls = False
    call_blocks = (("<|python_tag|>", None), ('{"name"', bracket_end))  # a call object, read string-aware
    whole_turn_call = ("{", "<|python_tag|>")

    def _scan(self, text: str) -> Scan:
        body = text.strip()
        body = body.removeprefix("<|python_tag|>").lstrip()
        if body.startswith("{"):
            return Scan(calls=read_json_sequence(body))
        start = body.find("{")  # prose first: vLLM reads a call object that follows it
        if start < 0 or not json_depth_ok(body[start:]):
            return Scan(content=[text])
        try:
            call, _ = _DECODER.raw_decode(body, start)
        except ValueError:
            return Scan(content=[text])
        if not isinstance(call, dict) or "name" not in call:
            return Scan(content=[text])
        return Scan(calls=read_json_sequence(body[start:]), content=[body[:start]])

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        return "; ".join(json.dumps({"name": call.name, "parameters": call.arguments}, ensure_ascii=False)
                         for call in calls)


Llama3Json.register()
