"""hermes: Qwen2.5/Qwen3/Qwen3-VL and Hermes models, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Several calls per turn, one JSON object per block; results are `tool` messages the template renders as
`<tool_response>` blocks in a user turn. vLLM: `--tool-call-parser hermes`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from retool_env.dialects.base import Dialect, FunctionCall, Scan, example_call, read_json_call, scan_blocks

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class Hermes(Dialect):
    name = "hermes"
    markers = (("<tool_call>",),)
    detect_after = ("qwen3_coder", "glm45")
    calls_as_text = True
    end_tokens = ("<|im_end|>", "<|endoftext|>")
    call_blocks = (("<tool_call>", "</tool_call>"),)

    def _scan(self, text: str) -> Scan:
        scan = scan_blocks(text, OPEN, CLOSE, lambda body: [read_json_call(body)])
        if scan.unfinished:  # the last call's JSON complete, its </tool_call> left out: read it, as vLLM does
            call = read_json_call(text[text.rfind(OPEN) + len(OPEN):])
            if call.error is None and text.rstrip().endswith("}"):
                scan.calls.append(call)
                scan.unfinished = False
        return scan

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        return "\n".join(f"{OPEN}\n{_call_json(call)}\n{CLOSE}" for call in calls)

    def fault(self, what: str, tools: Sequence[dict[str, Any]] | None = None) -> str:
        """The example without its `<tool_call>` markers: they are special tokens of Qwen's vocabulary, which a
        framework that tokenizes the observation's text (GEM, OpenRLHF, SkyRL) would read back as the special token,
        not as the characters the environment encodes."""
        return f"{what}. Write {_call_json(example_call(tools))} as the tool call's JSON."


def _call_json(call: FunctionCall) -> str:
    return f'{{"name": "{call.name}", "arguments": {json.dumps(call.arguments, ensure_ascii=False)}}}'


Hermes.register()
