"""Where a turn's reasoning ends: what the environment reads tool calls from and what the grader reads.

As vLLM's reasoning parsers (`deepseek_r1`, `qwen3`) and verl's grader split a thinking model's output, the text up
to the model's `</think>` is reasoning and the rest is the turn's content, with one difference: a `</think>` inside
a tool call (a code string, an argument) is the call's text, not the end of the reasoning. Each format names its
call blocks (opener, closer); a block left open runs to the end of the text. Without a `</think>` of its own, the
whole turn is reasoning when a think block is open (opened by the generation prompt, as Qwen3.5+ and
DeepSeek-R1-Distill templates do, or at the turn's start), and content otherwise (a model that does not think).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

THINK = "<think>"
END_THINK = "</think>"

# (opener, closer) of each kind of call block. The opener is a string or a pattern (searched, never backtracking
# over the text); the closer a string, None (the block runs to the end of the text), or a function of (text, the
# opener's index) giving the block's end: -1 when it runs to the end, the opener's index when no call opens there.
CallBlocks = Sequence[tuple[str | re.Pattern[str], str | Callable[[str, int], int] | None]]


def _find(opener: str | re.Pattern[str], text: str, position: int) -> tuple[int, int]:
    """(index, length) of the opener's first match from `position`, or (-1, 0)."""
    if isinstance(opener, str):
        return text.find(opener, position), len(opener)
    match = opener.search(text, position)
    return (match.start(), match.end() - match.start()) if match else (-1, 0)


def reasoning_end(text: str, call_blocks: CallBlocks = ()) -> int:
    """The index of the first `</think>` outside every call block, or -1. Linear: blocks never nest, and each
    needle is searched again only once the scan has passed its last match."""
    position, end = 0, text.find(END_THINK)
    next_opener = [_find(opener, text, 0) for opener, _ in call_blocks]
    while end >= 0:
        for index, (found, _) in enumerate(next_opener):
            if 0 <= found < position:
                next_opener[index] = _find(call_blocks[index][0], text, position)
        block = min(((found, length, index) for index, (found, length) in enumerate(next_opener)
                     if 0 <= found < end), default=None)
        if block is None:
            return end
        found, length, index = block
        closer = call_blocks[index][1]
        if closer is None or isinstance(closer, str):
            closed = -1 if closer is None else text.find(closer, found + length)
            position = closed + len(closer or "")
        else:
            closed = position = closer(text, found)
        if closed < 0:
            return -1  # the block runs to the end of the text: every later `</think>` is inside it
        position = max(position, found + length)
        if end < position:
            end = text.find(END_THINK, position)
    return -1


def split_reasoning(text: str, opened: bool = False, call_blocks: CallBlocks = ()) -> tuple[str, str]:
    """(reasoning, content) of a model turn; `opened`: the context before the turn opened a think block;
    `call_blocks`: the format's tool-call blocks, inside which a `</think>` is text."""
    end = reasoning_end(text, call_blocks)
    if end >= 0:
        return text[:end], text[end + len(END_THINK) :]
    if opened or text.lstrip().startswith(THINK):
        return text, ""
    return "", text


def graded_text(content: str) -> str:
    """`content` as handed to a grader that splits off reasoning again (`split_reasoning`, no call blocks), so it
    reads exactly `content`: behind a `</think>` when the content holds one of its own or opens a think block."""
    return content if split_reasoning(content)[1] == content else END_THINK + content
