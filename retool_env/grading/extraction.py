"""Answer extraction: which part of a model's text is its final answer.

See the package docstring for the policy. Everything here runs on model output in the trainer's process, so every
pattern is linear-time on hostile text.
"""

from __future__ import annotations

import re

MAX_ANSWER_CHARS = 1000
"""Longer predictions are rejected unread: no MATH-500 answer is over 160 characters, and sympy can choke on them."""

BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"\\[{}]|[{}]")  # an escaped brace is content, not structure
SPECIAL_TOKEN = re.compile(r"<\|[^|<>]{1,40}\|>")
# Program text and tool output are not the model's answer: code that prints "\\boxed{42}" must not score.
_NOT_ANSWER_TEXT = re.compile(
    r"```.*?(?:```|\Z)|<(code|interpreter|tool_call|tool_response)>.*?(?:</\1>|\Z)", re.DOTALL | re.IGNORECASE
)
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.DOTALL | re.IGNORECASE)
_ANSWER_LINE = re.compile(r"(?i)\banswer\s*(?:\*\*)?\s*[:：]\s*(?:\*\*)?[ \t]*([^\n]*)")
_MATH_SPAN = re.compile(r"(?<!\\)\$+((?:[^$\\]|\\.)+?)(?<!\\)\$+")  # "\\$" is a dollar sign, not math
_MAX_UNBALANCED_BOXES = 8  # bounds the work on hostile text full of unclosed "\boxed{"


def braced_content(text: str, start: int) -> str | None:
    """The text from `start` (just after an opening brace) to its matching closing brace, or None if unclosed."""
    depth = 1
    for match in _BRACE.finditer(text, start):
        token = match.group()
        if token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            if depth == 0:
                return text[start : match.start()]
    return None


def _last_box(text: str) -> str | None:
    """Content of the last closed `\\boxed{}`/`\\fbox{}`; an unclosed (truncated) box is skipped."""
    starts = [m.end() for m in BOX_OPEN.finditer(text)]
    for start in reversed(starts[-_MAX_UNBALANCED_BOXES:]):
        content = braced_content(text, start)
        if content is not None:
            return content.strip()
    return None


def _answer_line(text: str) -> str | None:
    """The last `Answer: X` line (DAPO's prompt asks for one), with `$...$` and markdown stripped."""
    matches = _ANSWER_LINE.findall(text)
    if not matches:
        return None
    line = matches[-1][: MAX_ANSWER_CHARS + 1].strip().strip("*").strip()  # longer is rejected anyway
    span = _MATH_SPAN.search(line)
    if span:
        line = span.group(1)
    line = line.strip().rstrip(".").strip()
    return line or None


def extract_answer(text: str) -> str | None:
    """The model's final answer: last `\\boxed{}`/`\\fbox{}` (inside the last `<answer>` block when there is one),
    else the last `Answer:` line, else None. Code blocks, `<interpreter>` output and special tokens are ignored."""
    text = SPECIAL_TOKEN.sub("", _NOT_ANSWER_TEXT.sub("\n", text))
    blocks = _ANSWER_BLOCK.findall(text)
    if blocks:
        block = blocks[-1]
        found = _last_box(block) or _answer_line(block)
        if found:
            return found
        bare = block.strip()
        if bare and len(bare) <= MAX_ANSWER_CHARS and "\\boxed" not in bare:
            return _answer_line("Answer: " + bare.replace("\n", " "))
    return _last_box(text) or _answer_line(text)


def strict_box_correct(text: str, gold: str) -> bool:
    """verl/slime `math_dapo.compute_score(..., strict_box_verify=True)` exactly: the last `\\boxed{` within the last
    100 characters, braces counted without escapes, compared to the gold as an exact string (no strip)."""
    tail = text[-100:]
    start = tail.rfind("\\boxed{")
    extracted = "[INVALID]"  # verl's placeholder for "no box"; kept so the comparison is byte-for-byte theirs
    if start >= 0:
        depth = 0
        for i in range(start, len(tail)):
            if tail[i] == "{":
                depth += 1
            elif tail[i] == "}":
                depth -= 1
                if depth == 0:
                    extracted = tail[start + len("\\boxed{") : i]
                    break
    return extracted == str(gold)
