"""Where a turn's reasoning ends: what the environment reads tool calls from and what the grader reads.

As vLLM's reasoning parsers (`deepseek_r1`, `qwen3`) and verl's grader split a thinking model's output, the text up
to the model's `</think>` is reasoning and the rest is the turn's content, with one difference: a `</think>` inside
a tool call (a code string, an argument) is the call's text, not the end of the reasoning. Each format names its
call blocks (opener, closer); a block left open runs to the end of the text. Without a `</think>` of its own, the
whole turn is reasoning when a think block is open (opened by the generation prompt, as Qwen3.5+ and
DeepSeek-R1-Distill templates do, or at the turn's start), and content otherwise (a model that does not think).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

THINK = "<think>"
END_THINK = "</think>"

# (opener, closer) of each kind of call block. The closer is a string, None (the block runs to the end of the text),
# or a function of (text, opener's index) giving the block's end: -1 when it runs to the end, the opener's own end
# when the opener starts no call there (a `[` that is an interval, not a call list).
CallBlocks = Sequence[tuple[str, str | Callable[[str, int], int] | None]]


def reasoning_end(text: str, call_blocks: CallBlocks = ()) -> int:
    """The index of the first `</think>` outside every call block, or -1. Linear: blocks never nest, and each
    needle is searched again only once the scan has passed its last match."""
    position, end = 0, text.find(END_THINK)
    next_opener = {opener: text.find(opener) for opener, _ in call_blocks}
    while end >= 0:
        for opener, found in next_opener.items():
            if 0 <= found < position:
                next_opener[opener] = text.find(opener, position)
        block = min(((found, opener, closer) for opener, closer in call_blocks
                     if 0 <= (found := next_opener[opener]) < end), default=None)
        if block is None:
            return end
        found, opener, closer = block
        if closer is None or isinstance(closer, str):
            closed = -1 if closer is None else text.find(closer, found + len(opener))
            position = closed + len(closer or "")
        else:
            closed = position = closer(text, found)
        if closed < 0:
            return -1  # the block runs to the end of the text: every later `</think>` is inside it
        position = max(position, found + len(opener))
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
