"""qwen3_coder: Qwen3-Coder, Qwen3.5/3.6/3.8 and Nemotron 3, XML calls with one element per parameter.

    <tool_call>
    <function=code_interpreter>
    <parameter=code>
    print(6 * 7)
    </parameter>
    </function>
    </tool_call>

Values are text (code needs no JSON escaping): one newline after `<parameter=...>` and one before `</parameter>`
belong to the layout, and non-string values are typed by the tool's schema. Several calls per turn.
vLLM: `--tool-call-parser qwen3_coder` (`qwen3_xml` reads the same text).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from retool_env.dialects.base import MAX_CALLS, Dialect, FunctionCall, RawCall, Scan, scan_blocks


def _strip_layout(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def read_function(body: str) -> list[RawCall]:
    """The `<function=NAME>` elements of one `<tool_call>` block (a block normally holds one)."""
    pieces = body.split("<function=")
    if len(pieces) == 1:
        return [RawCall(None, error="a <tool_call> block holds no <function=NAME> element")]
    calls = []
    for piece in pieces[1:MAX_CALLS + 2]:
        head_end = piece.find(">")
        if head_end < 0:
            calls.append(RawCall(None, error="<function= is not closed with >"))
            continue
        name = piece[:head_end].strip()
        inside, closer, _ = piece[head_end + 1:].partition("</function>")
        if not closer:
            calls.append(RawCall(name, error=f"<function={name}> is not closed with </function>"))
            continue
        calls.append(_read_parameters(name, inside))
    return calls


def _read_parameters(name: str, inside: str) -> RawCall:
    arguments: dict[str, str] = {}
    for piece in inside.split("<parameter=")[1:]:
        head_end = piece.find(">")
        if head_end < 0:
            return RawCall(name, error="<parameter= is not closed with >")
        key = piece[:head_end].strip()
        value, closer, _ = piece[head_end + 1:].partition("</parameter>")
        if not closer:  # the next <parameter= or </function> ends an unclosed value, as vLLM reads it
            value = value.rstrip()
        if key in arguments:
            return RawCall(name, error=f"the parameter {key!r} is given twice")
        arguments[key] = _strip_layout(value)
    return RawCall(name, arguments, text_valued=True)


def parameter_text(value: object) -> str:
    """A value as the Qwen3.5 template writes it: strings as they are, containers as JSON, scalars via str()."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


class Qwen3Coder(Dialect):
    name = "qwen3_coder"
    end_tokens = ("<|im_end|>", "<|endoftext|>")

    def _scan(self, text: str) -> Scan:
        return scan_blocks(text, "<tool_call>", "</tool_call>", read_function)

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        blocks = []
        for call in calls:
            parameters = "".join(f"<parameter={key}>\n{parameter_text(value)}\n</parameter>\n"
                                 for key, value in call.arguments.items())
            blocks.append(f"<tool_call>\n<function={call.name}>\n{parameters}</function>\n</tool_call>")
        return "\n".join(blocks)
