"""pythonic: Llama 3.2/4 and others, the turn is a Python list of calls `[name(key=value, ...), ...]`.

Values are Python literals (JSON is accepted too). Llama 4 may wrap the list in `<|python_start|>...<|python_end|>`.
The list is read by a single scan that finds each value's extent (quotes and brackets, nesting bounded) and
decodes only that value, never the whole text with `ast`. vLLM: `--tool-call-parser pythonic`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from retool_env.dialects.base import (
    MAX_CALLS,
    MAX_DEPTH,
    Dialect,
    FunctionCall,
    RawCall,
    Scan,
    bracket_end,
    loads_literal,
    string_end,
)

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _skip_space(s: str, i: int, end: int) -> int:
    while i < end and s[i] in " \t\r\n":
        i += 1
    return i


def _name_end(s: str, i: int, end: int) -> int:
    while i < end and s[i] in _NAME_CHARS:
        i += 1
    return i


_SYNTAX = re.compile(r"[\"'()\[\]{},]")


def value_end(s: str, i: int, end: int) -> int | None:
    """Where the literal starting at `i` ends: the first `,` or `)` outside strings and brackets. None when the
    text ends first or brackets nest deeper than MAX_DEPTH. One pass that jumps between syntax characters."""
    depth = 0
    while True:
        match = _SYNTAX.search(s, i, end)
        if match is None:
            return None
        i, ch = match.start(), match.group()
        if ch in "\"'":
            quote = ch * 3 if s.startswith(ch * 3, i) else ch
            i = string_end(s, i + len(quote), quote, end)
            if i < 0:
                return None
            continue
        if ch in "([{":
            depth += 1
            if depth > MAX_DEPTH:
                return None
        elif ch in ")]}":
            if depth == 0:
                return i if ch == ")" else None
            depth -= 1
        elif depth == 0:  # a comma between arguments
            return i
        i += 1


def read_python_calls(text: str) -> list[RawCall]:
    """The calls of a Python list `[name(key=value, ...), ...]`; a fault ends the list with an error call."""
    s = text.strip()
    if not (s.startswith("[") and s.endswith("]")):
        return [RawCall(None, error="the calls must be a Python list: [name(key=value, ...)]")]
    calls: list[RawCall] = []
    i, end = 1, len(s) - 1
    while True:
        i = _skip_space(s, i, end)
        if i >= end:
            return calls
        name_end = _name_end(s, i, end)
        name = s[i:name_end]
        if not name or name_end >= end or s[name_end] != "(":
            return [*calls, RawCall(name or None, error=f"expected name( at {s[i:i + 30]!r}")]
        i = name_end + 1
        arguments: dict[str, object] = {}
        while True:
            i = _skip_space(s, i, end)
            if i < end and s[i] == ")":
                i += 1
                break
            key_end = _name_end(s, i, end)
            key, equals = s[i:key_end], _skip_space(s, key_end, end)
            if not key or equals >= end or s[equals] != "=":
                return [*calls, RawCall(name, error=f"{name}(...) takes keyword arguments key=value, "
                                                    f"found {s[i:i + 30]!r}")]
            start = _skip_space(s, equals + 1, end)
            stop = value_end(s, start, end)
            if stop is None:
                return [*calls, RawCall(name, error=f"the value of {key!r} is not closed (or nests deeper than "
                                                    f"{MAX_DEPTH} levels)")]
            value, error = loads_literal(s[start:stop])
            if error is not None:
                return [*calls, RawCall(name, error=f"the value of {key!r}: {error}")]
            arguments[key] = value
            i = stop + 1 if s[stop] == "," else stop
        calls.append(RawCall(name, arguments))
        if len(calls) > MAX_CALLS:
            return calls
        i = _skip_space(s, i, end)
        if i < end and s[i] == ",":
            i += 1
        elif i < end:
            return [*calls, RawCall(None, error=f"expected , between calls at {s[i:i + 30]!r}")]


CALL_LIST = re.compile(r"\[[ \t\r\n]*[A-Za-z_][A-Za-z0-9_.\-]*\(")  # `[name(`: no backtracking across a `[`


def python_call_list(calls: Sequence[FunctionCall]) -> str:
    """Calls as a Python list with JSON values (what LFM2's later templates render, valid Python for strings)."""
    written = (f"{call.name}("
               f"{', '.join(f'{k}={json.dumps(v, ensure_ascii=False)}' for k, v in call.arguments.items())})"
               for call in calls)
    return "[" + ", ".join(written) + "]"


class Pythonic(Dialect):
    name = "pythonic"
    markers = (("<|python_start|>",),)
    end_tokens = ("<|eot|>", "<|eom|>", "<|eot_id|>", "<|eom_id|>")
    call_blocks = (("<|python_start|>", "<|python_end|>"), (CALL_LIST, bracket_end))
    whole_turn_call = ("[", "<|python_start|>")

    def _scan(self, text: str) -> Scan:
        body = text.strip()
        wrapped = body.startswith("<|python_start|>")
        body = body.removeprefix("<|python_start|>").removesuffix("<|python_end|>").strip()
        if not (wrapped or (body.startswith("[") and body.endswith("]") and "(" in body)):
            return Scan(content=[text])
        return Scan(calls=read_python_calls(body))

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        return python_call_list(calls)


Pythonic.register()
