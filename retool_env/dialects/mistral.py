"""mistral: Mistral and Mixtral, calls after `[TOOL_CALLS]`.

Tokenizer v11 and later write `[TOOL_CALLS]NAME[ARGS]{json}` once per call (`[CALL_ID]id` may sit before `[ARGS]`);
earlier ones a JSON list `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`. Both are read; calls are written in the
v11 form. vLLM: `--tool-call-parser mistral`.
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
    arguments_object,
    json_depth_ok,
    json_error,
    named_arguments,
    read_json_call,
)

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_DECODER = json.JSONDecoder()


def _read_list(text: str) -> list[RawCall]:
    if not json_depth_ok(text):
        return [RawCall(None, error=f"the calls nest deeper than {MAX_DEPTH} levels")]
    try:
        calls, _ = _DECODER.raw_decode(text)
    except ValueError as exc:  # JSONDecodeError, or a number json cannot hold
        return [RawCall(None, error=f"the {TOOL_CALLS} list is not valid JSON ({json_error(exc)})")]
    if not isinstance(calls, list) or not all(isinstance(call, dict) for call in calls):
        return [RawCall(None, error=f"{TOOL_CALLS} must be followed by a JSON list of call objects")]
    return [named_arguments(call, ("name",), ("arguments", "parameters")) for call in calls]


def _read_v11(piece: str) -> tuple[RawCall, str]:
    """One `NAME[ARGS]{json}` call (`NAME{json}` too, as vLLM reads it), and the text after its arguments."""
    head, sep, arguments = piece.partition(ARGS)
    if not sep:
        brace = piece.find("{")
        if brace < 0:
            return RawCall(None, error=f"write {TOOL_CALLS}NAME{ARGS}{{...}} for each call"), ""
        head, arguments = piece[:brace], piece[brace:]
    name = head.partition(CALL_ID)[0].strip()
    arguments = arguments.strip()
    after = ""
    if arguments.startswith("{") and json_depth_ok(arguments):
        try:  # the object, and any text the model wrote after it (content, as vLLM reads it)
            _, end = _DECODER.raw_decode(arguments)
            arguments, after = arguments[:end], arguments[end:]
        except ValueError:
            pass
    return RawCall(name, *arguments_object(arguments, "arguments")), after


class Mistral(Dialect):
    name = "mistral"
    markers = (("[TOOL_CALLS]",),)
    end_tokens = ("</s>",)
    call_blocks = ((TOOL_CALLS, None),)

    def _scan(self, text: str) -> Scan:
        pieces = text.split(TOOL_CALLS)
        scan = Scan(content=[pieces[0]])
        for piece in pieces[1:MAX_CALLS + 2]:
            if piece.lstrip().startswith("["):
                scan.calls.extend(_read_list(piece.strip()))
            elif piece.lstrip().startswith("{"):  # a bare call object (pre-v11)
                scan.calls.append(read_json_call(piece))
            else:
                call, after = _read_v11(piece)
                scan.calls.append(call)
                scan.content.append(after)
        return scan

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        return "".join(f"{TOOL_CALLS}{call.name}{ARGS}{json.dumps(call.arguments, ensure_ascii=False)}"
                       for call in calls)


Mistral.register()
