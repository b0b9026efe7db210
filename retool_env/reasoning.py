"""Where a turn's reasoning ends: what the environment reads tool calls from and what the grader reads.

As vLLM's reasoning parsers (`deepseek_r1`, `qwen3`) and verl's grader split a thinking model's output: everything
up to the first `</think>` is reasoning, the rest is the turn's content. Without a `</think>`, the whole turn is
reasoning when a think block is open (opened by the generation prompt, as Qwen3.5+ and DeepSeek-R1-Distill
templates do, or at the turn's start), and content otherwise (a model that does not think).
"""

from __future__ import annotations

THINK = "<think>"
END_THINK = "</think>"


def split_reasoning(text: str, opened: bool = False) -> tuple[str, str]:
    """(reasoning, content) of a model turn; `opened`: the context before the turn opened a think block."""
    end = text.find(END_THINK)
    if end >= 0:
        return text[:end], text[end + len(END_THINK) :]
    if opened or text.lstrip().startswith(THINK):
        return text, ""
    return "", text
