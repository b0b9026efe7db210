"""hermes: Qwen2.5/Qwen3/Qwen3-VL and Hermes models, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Several calls per turn, one JSON object per block; results are `tool` messages the template renders as
`<tool_response>` blocks in a user turn. vLLM: `--tool-call-parser hermes`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from retool_env.dialects.base import Dialect, FunctionCall, RawCall, Scan, loads_json, scan_blocks


def read_json_call(body: str, name_keys: tuple[str, ...] = ("name",),
                   argument_keys: tuple[str, ...] = ("arguments", "parameters")) -> RawCall:
    """A call written as one JSON object with a name and its arguments (an object, or a string holding one)."""
    call, error = loads_json(body.strip())
    if error is not None:
        return RawCall(None, error=f"the tool call is {error}")
    if not isinstance(call, dict):
        return RawCall(None, error=f"the tool call must be a JSON object, not {type(call).__name__}")
    return named_arguments(call, name_keys, argument_keys)


def named_arguments(call: dict, name_keys: tuple[str, ...], argument_keys: tuple[str, ...]) -> RawCall:
    name = next((call[k] for k in name_keys if k in call), None)
    if not isinstance(name, str):
        return RawCall(None, error=f"the tool call needs a {name_keys[0]!r} string")
    arguments = next((call[k] for k in argument_keys if k in call), None)
    return RawCall(name, *arguments_object(arguments, argument_keys[0]))


def arguments_object(arguments: object, what: str = "arguments") -> tuple[dict | None, str | None]:
    """Arguments as a mapping: an object as is, a string decoded as JSON (OpenAI's wire form)."""
    for _ in range(2):  # a JSON string holding the object; twice where a template encoded a string again
        if isinstance(arguments, str):
            arguments, error = loads_json(arguments)
            if error is not None:
                return None, f"the {what} string is {error}"
    if not isinstance(arguments, dict):
        return None, f"{what!r} must be a JSON object"
    return arguments, None


class Hermes(Dialect):
    name = "hermes"
    end_tokens = ("<|im_end|>", "<|endoftext|>")

    def _scan(self, text: str) -> Scan:
        return scan_blocks(text, "<tool_call>", "</tool_call>", lambda body: [read_json_call(body)])

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        return "\n".join(f'<tool_call>\n{{"name": "{call.name}", "arguments": '
                         f'{json.dumps(call.arguments, ensure_ascii=False)}}}\n</tool_call>' for call in calls)
