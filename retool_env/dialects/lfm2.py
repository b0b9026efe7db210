"""lfm2: LiquidAI LFM2/LFM2.5, a Python list of calls between `<|tool_call_start|>` and `<|tool_call_end|>`.

    <|tool_call_start|>[code_interpreter(code="print(6 * 7)")]<|tool_call_end|>

The first LFM2 template drops `tool_calls` (the model writes the block in its content); LFM2.5's first template
quotes strings raw ('...' with no escaping), so code holding a quote or a backslash does not survive it; later
templates write values as JSON, as `call_text` does. A list that does not read is repaired as vLLM's parser repairs
it: zero-padded integers (`month=07`), then raw same-style quotes inside a string (`'print('hi')'`), closed at the
only closing quote after which the list reads. vLLM: `--tool-call-parser lfm2`.
"""

from __future__ import annotations

from collections.abc import Sequence

from retool_env.dialects.base import Dialect, FunctionCall, RawCall, Scan, find_blocks, scan_blocks, string_end
from retool_env.dialects.pythonic import python_call_list, read_python_calls

CALL_START, CALL_END = "<|tool_call_start|>", "<|tool_call_end|>"
MAX_QUOTE_CLOSES = 16  # closing quotes tried for one broken string: each try reads the list again
_FOLLOWERS = frozenset(",)]}:")  # what may follow a string's closing quote


def _read(text: str) -> list[RawCall] | None:
    calls = read_python_calls(text)
    return calls if all(call.error is None for call in calls) else None


def without_leading_zeros(text: str) -> str:
    """Zero-padded integer literals (`07`) outside strings written without their zeros, as vLLM's
    `normalize_leading_zero_ints` does; floats, exponents, `0x` prefixes and names are left alone. One pass."""
    out, i, n = [], 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            end = string_end(text, i + 1, ch)
            end = n if end < 0 else end
            out.append(text[i:end])
            i = end
        elif ch.isalpha() or ch == "_":
            end = i
            while end < n and (text[end].isalnum() or text[end] == "_"):
                end += 1
            out.append(text[i:end])
            i = end
        elif ch.isdigit():
            end = i
            while end < n and (text[end].isdigit() or text[end] == "_"):
                end += 1
            digits = text[i:end].replace("_", "")
            padded = digits[0] == "0" and digits.strip("0") and not (i and text[i - 1] == ".")
            out.append(str(int(digits)) if padded and text[end:end + 1] not in (".", "e", "E", "j", "J")
                       else text[i:end])
            i = end
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _closes(text: str, quote_at: int) -> bool:
    """Whether the quote at `quote_at` can close a string: what follows it (spaces skipped) is one of `,)]}:`."""
    after = quote_at + 1
    while after < len(text) and text[after].isspace():  # runs after different quotes never overlap: linear
        after += 1
    return after < len(text) and text[after] in _FOLLOWERS


def _escaped(text: str, at: int) -> bool:
    """Whether the character at `at` follows an odd run of backslashes."""
    start = at
    while start and text[start - 1] == "\\":
        start -= 1
    return (at - start) % 2 == 1


def _escape_quotes(inside: str, quote: str) -> str:
    """`inside` with each unescaped `quote` escaped."""
    out, i = [], 0
    while (at := inside.find(quote, i)) >= 0:
        out.append(inside[i:at] + ("" if _escaped(inside, at) else "\\") + quote)
        i = at + 1
    return "".join(out) + inside[i:]


def with_nested_quotes_closed(text: str) -> list[RawCall] | None:
    """The calls, read with the first string whose first closing quote cannot close it (no `,)]}:` after it)
    closed at the one later quote after which the whole list reads, its inner quotes escaped (vLLM's
    `escape_nested_quotes_in_strings`); None when no quote or several do, or there are too many to try."""
    i = 0
    while True:
        opened = min((at for at in (text.find("'", i), text.find('"', i)) if at >= 0), default=-1)
        if opened < 0:
            return None
        quote = text[opened]
        first = string_end(text, opened + 1, quote)
        if first < 0:
            return None
        if _closes(text, first - 1):
            i = first
            continue
        closes: list[int] = []
        at = first - 1
        while at >= 0 and len(closes) <= MAX_QUOTE_CLOSES:
            if not _escaped(text, at) and _closes(text, at):
                closes.append(at)
            at = text.find(quote, at + 1)
        if len(closes) > MAX_QUOTE_CLOSES:
            return None
        found = []
        for close in closes:
            calls = _read(text[:opened + 1] + _escape_quotes(text[opened + 1:close], quote) + text[close:])
            if calls is not None:
                found.append(calls)
        return found[0] if len(found) == 1 else None


def read_lfm2_calls(body: str) -> list[RawCall]:
    """LFM2's call list: as written, else repaired as vLLM repairs it (the first repair that reads wins)."""
    calls = read_python_calls(body)
    if all(call.error is None for call in calls):
        return calls
    unpadded = without_leading_zeros(body)
    return (unpadded != body and _read(unpadded)) or with_nested_quotes_closed(unpadded) or calls


class Lfm2(Dialect):
    name = "lfm2"
    markers = (("<|tool_call_start|>",), ("<|tool_list_start|>",))
    end_tokens = ("<|im_end|>",)
    call_blocks = ((CALL_START, CALL_END),)

    def _scan(self, text: str) -> Scan:
        scan = scan_blocks(text, CALL_START, CALL_END, read_lfm2_calls)
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
