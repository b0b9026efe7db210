"""kimi_k2: Kimi K2, calls with an id `functions.NAME:INDEX` inside a tool-calls section.

    <|tool_calls_section_begin|><|tool_call_begin|>functions.code_interpreter:0<|tool_call_argument_begin|>
    {"code": "print(6 * 7)"}<|tool_call_end|><|tool_calls_section_end|>

(one line, wrapped here).

vLLM: `--tool-call-parser kimi_k2`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from retool_env.dialects.base import (
    MAX_CALLS,
    Dialect,
    FunctionCall,
    RawCall,
    Scan,
    arguments_object,
    find_blocks,
    scan_blocks,
)

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGUMENTS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def read_kimi_call(body: str) -> RawCall:
    call_id, sep, arguments = body.partition(ARGUMENTS)
    if not sep:
        return RawCall(None, error=f"a call needs {ARGUMENTS} between its id and its arguments")
    name, colon, index = call_id.strip().removeprefix("functions.").rpartition(":")
    if not colon or not index.isdigit() or not name:
        return RawCall(None, error=f"a call's id is functions.NAME:INDEX, not {call_id.strip()[:60]!r}")
    return RawCall(name, *arguments_object(arguments.strip(), "arguments"))


class KimiK2(Dialect):
    name = "kimi_k2"
    markers = (("<|tool_calls_section_begin|>",),)
    end_tokens = ("<|im_end|>",)
    call_blocks = ((SECTION_BEGIN, SECTION_END), (CALL_BEGIN, CALL_END))

    def _scan(self, text: str) -> Scan:
        scan = Scan()
        for before, section, closed in find_blocks(text, SECTION_BEGIN, SECTION_END):
            scan.content.append(before)
            if section is None:
                break
            calls = scan_blocks(section, CALL_BEGIN, CALL_END, lambda body: [read_kimi_call(body)])
            scan.calls += calls.calls
            scan.unfinished = scan.unfinished or calls.unfinished
            if len(scan.calls) > MAX_CALLS:
                return scan
            if not closed:  # an open section ends the turn: its calls count, and more may have been cut off
                scan.unfinished = scan.unfinished or not section.rstrip().endswith(CALL_END)
                break
        return scan

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        body = "".join(f"{CALL_BEGIN}functions.{call.name}:{index}{ARGUMENTS}"
                       f"{json.dumps(call.arguments, ensure_ascii=False)}{CALL_END}"
                       for index, call in enumerate(calls))
        return f"{SECTION_BEGIN}{body}{SECTION_END}"


KimiK2.register()
