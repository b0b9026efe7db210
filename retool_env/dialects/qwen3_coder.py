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

from retool_env.dialects.base import MAX_CALLS, Dialect, Finder, FunctionCall, RawCall, Scan

FUNCTION, FUNCTION_END, PARAMETER, PARAMETER_END = "<function=", "</function>", "<parameter=", "</parameter>"
OPEN, CLOSE = "<tool_call>", "</tool_call>"


class _BlockEnds:
    """Where each `<tool_call>` block of one text ends, as vLLM reads it: at the first `</tool_call>` that follows
    a `</function>` (a value may hold the text `</tool_call>`), else at the first `</tool_call>`. Linear over the
    blocks of the text: once no such pair is left, none is searched for again."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pairs_left = True

    def close(self, start: int) -> int:
        """The index of the `</tool_call>` that ends the block whose inside starts at `start`, or -1."""
        text = self.text
        if self.pairs_left:
            function_end = text.find(FUNCTION_END, start)
            while function_end >= 0:
                after = function_end + len(FUNCTION_END)
                while after < len(text) and text[after] in " \t\r\n":
                    after += 1
                if text.startswith(CLOSE, after):
                    return after
                function_end = text.find(FUNCTION_END, after)
            self.pairs_left = False
        return text.find(CLOSE, start)


_last_ends: list[_BlockEnds] = [_BlockEnds("")]  # the text `block_end` last read: its blocks are asked in order


def block_end(text: str, start: int) -> int:
    """The end of the `<tool_call>` block opening at `start` (-1: it runs to the end of the text)."""
    if _last_ends[0].text is not text:
        _last_ends[0] = _BlockEnds(text)
    close = _last_ends[0].close(start + len(OPEN))
    return close + len(CLOSE) if close >= 0 else -1


def _strip_layout(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def read_function(body: str) -> list[RawCall]:
    """The `<function=NAME>` elements of one `<tool_call>` block (a block normally holds one). Read in order, as
    vLLM reads them: a value runs to the first `</parameter>`, `<parameter=` or `</function>` after it."""
    calls: list[RawCall] = []
    finder, position = Finder(body), 0
    while len(calls) <= MAX_CALLS:
        start = finder.find(FUNCTION, position)
        if start < 0:
            break
        head_end = body.find(">", start)
        if head_end < 0:
            calls.append(RawCall(None, error=f"{FUNCTION} is not closed with >"))
            break
        name = body[start + len(FUNCTION):head_end].strip()
        arguments, position, error = _read_parameters(body, finder, head_end + 1)
        end = finder.find(FUNCTION_END, position)
        if error is None and end < 0:
            error = f"{FUNCTION}{name}> is not closed with {FUNCTION_END}"
        if error is not None:
            calls.append(RawCall(name, error=error))
            break
        calls.append(RawCall(name, arguments, text_valued=True))
        position = end + len(FUNCTION_END)
    return calls or [RawCall(None, error=f"a <tool_call> block holds no {FUNCTION}NAME> element")]


def _read_parameters(body: str, finder: Finder, position: int) -> tuple[dict[str, str], int, str | None]:
    """The `<parameter=KEY>VALUE</parameter>` elements from `position` on, up to the first other text."""
    arguments: dict[str, str] = {}
    while True:
        while position < len(body) and body[position] in " \t\r\n":
            position += 1
        if not body.startswith(PARAMETER, position):
            return arguments, position, None
        head_end = body.find(">", position)
        if head_end < 0:
            return arguments, position, f"{PARAMETER} is not closed with >"
        key = body[position + len(PARAMETER):head_end].strip()
        close = finder.find(PARAMETER_END, head_end)
        # A value whose </parameter> is missing ends at the next parameter or at </function>, as vLLM reads it
        unclosed = [i for i in (finder.find(PARAMETER, head_end), finder.find(FUNCTION_END, head_end))
                    if i >= 0 and (close < 0 or i < close)]
        if unclosed:
            close = min(unclosed)
            value, position = body[head_end + 1:close].rstrip(), close
        elif close < 0:
            value, position = body[head_end + 1:].rstrip(), len(body)
        else:
            value, position = body[head_end + 1:close], close + len(PARAMETER_END)
        if key in arguments:
            return arguments, position, f"the parameter {key!r} is given twice"
        arguments[key] = _strip_layout(value)


def parameter_text(value: object) -> str:
    """A value as the Qwen3.5 template writes it: strings as they are, containers as JSON, scalars via str()."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


class Qwen3Coder(Dialect):
    name = "qwen3_coder"
    markers = (("<function=", "<parameter="),)
    aliases = ("qwen3_xml",)
    end_tokens = ("<|im_end|>", "<|endoftext|>")
    call_blocks = ((OPEN, block_end), (FUNCTION, FUNCTION_END))

    def _scan(self, text: str) -> Scan:
        if OPEN not in text and FUNCTION in text:  # the wrapper forgotten, as vLLM accepts
            start = text.find(FUNCTION)
            return Scan(calls=read_function(text[start:]), content=[text[:start]])
        scan, ends, position = Scan(), _BlockEnds(text), 0
        while True:
            opened = text.find(OPEN, position)
            if opened < 0:
                scan.content.append(text[position:])
                return scan
            scan.content.append(text[position:opened])
            inside = opened + len(OPEN)
            closed = ends.close(inside)
            if closed < 0:
                scan.unfinished = True
                return scan
            scan.calls.extend(read_function(text[inside:closed]))
            if len(scan.calls) > MAX_CALLS:
                return scan
            position = closed + len(CLOSE)

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        blocks = []
        for call in calls:
            parameters = "".join(f"<parameter={key}>\n{parameter_text(value)}\n</parameter>\n"
                                 for key, value in call.arguments.items())
            blocks.append(f"<tool_call>\n<function={call.name}>\n{parameters}</function>\n</tool_call>")
        return "\n".join(blocks)


Qwen3Coder.register()
