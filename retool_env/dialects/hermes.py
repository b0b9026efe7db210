"""hermes: Qwen2.5/Qwen3/Qwen3-VL and Hermes models, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Several calls per turn, one JSON object per block; results are `tool` messages the template renders as
`<tool_response>` blocks in a user turn. vLLM: `--tool-call-parser hermes`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from retool_env.dialects.base import Dialect, FunctionCall, Scan, read_json_call, scan_blocks


class Hermes(Dialect):
    name = "hermes"
    end_tokens = ("<|im_end|>", "<|endoftext|>")
    call_blocks = (("<tool_call>", "</tool_call>"),)

    def _scan(self, text: str) -> Scan:
        return scan_blocks(text, "<tool_call>", "</tool_call>", lambda body: [read_json_call(body)])

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        return "\n".join(f'<tool_call>\n{{"name": "{call.name}", "arguments": '
                         f'{json.dumps(call.arguments, ensure_ascii=False)}}}\n</tool_call>' for call in calls)
