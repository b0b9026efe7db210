"""lfm2: LiquidAI LFM2/LFM2.5, a Python list of calls between `<|tool_call_start|>` and `<|tool_call_end|>`.

    <|tool_call_start|>[code_interpreter(code="print(6 * 7)")]<|tool_call_end|>

The first LFM2 template drops `tool_calls` (the model writes the block in its content); LFM2.5's first template
quotes strings raw ('...' with no escaping), so code holding a quote or a backslash does not survive it; later
templates write values as JSON, as `call_text` does. vLLM: `--tool-call-parser lfm2`.
"""

from __future__ import annotations

from collections.abc import Sequence

from retool_env.dialects.base import Dialect, FunctionCall, Scan, find_blocks, scan_blocks
from retool_env.dialects.pythonic import python_call_list, read_python_calls

CALL_START, CALL_END = "<|tool_call_start|>", "<|tool_call_end|>"


class Lfm2(Dialect):
    name = "lfm2"
    markers = (("<|tool_call_start|>",), ("<|tool_list_start|>",))
    end_tokens = ("<|im_end|>",)
    call_blocks = ((CALL_START, CALL_END),)

    def _scan(self, text: str) -> Scan:
        scan = scan_blocks(text, CALL_START, CALL_END, read_python_calls)
        # LFM2 may echo a call list right after its block: vLLM drops the echo from the content, and so does this
        blocks = [body for _, body, closed in find_blocks(text, CALL_START, CALL_END) if body is not None and closed]
        for index, body in enumerate(blocks[:len(scan.content) - 1]):
            after = scan.content[index + 1]
            if body.strip() and after.lstrip().startswith(body.strip()):
                scan.content[index + 1] = after.lstrip()[len(body.strip()):]
        return scan

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        return f"{CALL_START}{python_call_list(calls)}{CALL_END}"


Lfm2.register()
