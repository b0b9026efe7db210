"""Answer extraction: which part of a model's text is its final answer.

See the package docstring for the policy. Everything here runs on model output in the trainer's process, so every
pattern is linear-time on hostile text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from retool_env.reasoning import split_reasoning

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
# One `\s*` before the colon, never two in a row: "answer" and a run of spaces would backtrack quadratically. The
# pattern starts at "answer" (a leading optional "final" made the engine try a match at every position).
_ANSWER_LINE = re.compile(r"(?i)answer(?:\s*\*\*)?\s*[:：]\s*(?:\*\*)?[ \t]*(?P<value>[^\n]*)")  # word start: below
_SPACE_RUN = re.compile(r"[ \t]{2,}")
# Where the model's turn ends: another role's turn starts, or the text ends (base models run on into them).
_TURN_BOUNDARY = re.compile(
    r"<\|im_start\|>[ \t\n]*(?:user|system|tool)\b|<\|start_header_id\|>[ \t\n]*(?:user|system|ipython|tool)\b"
    r"|<\|start\|>[ \t\n]*(?:user|system|developer|functions)\b|<start_of_turn>[ \t\n]*user\b"
    r"|<\|(?:user|system|endoftext|return)\|>|<｜(?:User|end▁of▁sentence)｜>|</s>"
)
_SEPARATOR_CHARS = " \t\n,;.\"'`"
_SENTENCE_END = re.compile(r"\.\s+(?=[A-Z])")  # "7.78. I hope it is correct." ends after 7.78
_PROSE_VERB = re.compile(r"\b(?:is|are|equals)\b:?\s*")
_DOLLAR_RUN = re.compile(r"\${3,}")  # LaTeX has no "$$$": a run backtracks in _MATH_SPAN at every start
_MATH_SPAN = re.compile(r"(?<!\\)\$+((?:[^$\\]|\\.)+?)(?<!\\)\$+")  # "\\$" is a dollar sign, not math
# A leading character class lets the engine skip to the next backslash or brace (an alternation makes it try every
# position); a backslash alone (not a box, not an escaped brace) is skipped.
_BOX_OR_BRACE = re.compile(r"(?P<char>[\\{}])(?:(?<=\\)(?P<box>(?:boxed|fbox)\s*\{)|(?<=\\)(?P<escaped>[{}]))?")


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


def _boxes(text: str) -> list[tuple[int, str]]:
    """(position, content) of each closed outermost `\\boxed{}`/`\\fbox{}`, in one linear scan from the first box
    (braces before it cannot close it): an unclosed (truncated) box is skipped, a box inside a box is content."""
    first = min((i for i in (text.find("\\boxed"), text.find("\\fbox")) if i >= 0), default=-1)
    if first < 0:
        return []
    found: list[tuple[int, int, int]] = []  # (position, content start, content end); sliced once at the end
    opened: list[tuple[int, int] | None] = []  # per open brace: a box's (position, content start), else None
    for match in _BOX_OR_BRACE.finditer(text, first):
        char = match.group("char")
        if match.group("box"):
            opened.append((match.start(), match.end()))
        elif char == "{":
            opened.append(None)
        elif char == "}" and opened:
            box = opened.pop()
            if box is not None:
                while found and found[-1][0] > box[0]:
                    found.pop()  # closed inside this box: content, not an answer of its own
                found.append((box[0], box[1], match.start()))
    return [(position, text[start:end].strip()) for position, start, end in found]


def _joined(contents: list[str]) -> str | None:
    """Several boxes are one answer, as math-verify reads them: `\\boxed{1} and \\boxed{2}` is "1, 2". Repeats of
    one value count once; different values are never alternatives to choose from (a one-part gold fails)."""
    distinct: dict[str, str] = {}
    for content in filter(None, contents):
        distinct.setdefault("".join(content.split()).strip("$").rstrip("."), content)
    return ", ".join(distinct.values()) or None


def _last(matches: Iterator[re.Match[str]]) -> re.Match[str] | None:
    last = None
    for last in matches:  # noqa: B007 - only the last one is wanted
        pass
    return last


def _line_value(line: str) -> str | None:
    """The value an `Answer:` line states: `The largest $n$ is 34. I hope it is correct.` states 34."""
    line = _DOLLAR_RUN.sub("$$", line[: MAX_ANSWER_CHARS + 1]).strip().strip("*").strip()  # longer: rejected
    line = _SENTENCE_END.split(line, maxsplit=1)[0]
    if line[:1].isalpha():  # prose: the value follows its last "is"
        stated = _last(_PROSE_VERB.finditer(line))
        if stated is not None and line[stated.end() :].strip():
            line = line[stated.end() :]
    spans = list(_MATH_SPAN.finditer(line))
    edges = [0, *(i for span in spans for i in span.span()), len(line)]
    gaps = [line[start:end] for start, end in zip(edges[::2], edges[1::2], strict=True)]
    if len(spans) > 1 and all(gap.strip(_SEPARATOR_CHARS) in ("", "and") for gap in gaps):
        line = ", ".join(span.group(1).strip() for span in spans)  # "$12 $ and $13 $" states 12, 13, as boxes do
    elif spans:
        line = spans[0].group(1)
    return line.strip().rstrip(".").strip() or None


def _word_char_before(text: str, start: int) -> bool:
    return start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_")


def _says_final(text: str, start: int) -> bool:
    """Whether "final" and whitespace come just before `start` (the "answer" of an answer line)."""
    before = text[max(0, start - 64) : start]
    word = before.rstrip()
    return (len(word) < len(before) and word[-5:].lower() == "final"
            and (len(word) == 5 or not (word[-6].isalnum() or word[-6] == "_")))


def _final_answer(text: str) -> str | None:
    """The last stated final answer of `text`: its boxes, unless a final-answer line comes after the last box."""
    boxes = _boxes(text)
    boxed = _joined([content for _, content in boxes])
    line = _last(m for m in _ANSWER_LINE.finditer(text) if not _word_char_before(text, m.start()))
    if line is not None and (boxed is None or line.start() > boxes[-1][0]):
        stated = _line_value(line.group("value"))
        before = text[text.rfind("\n", 0, line.start()) + 1 : line.start()]
        # "Final Answer:", or "Answer:" opening a line
        final = _says_final(text, line.start()) or not before.strip(" \t>#*_-")
        if stated and (boxed is None or final):  # "...completes the answer: we are done" does not beat a box
            return stated
    return boxed


def extract_answer(text: str) -> str | None:
    """The model's final answer (the policy is in the package docstring): inside the last `<answer>` block when
    there is one, its boxes, or the `Answer:` line stated after them, else None. Only the model's turn is read (up
    to another role's turn or an end-of-text token), and only its content after a reasoning block (`</think>`).
    Code blocks, `<interpreter>` output and special tokens are ignored."""
    boundary = _TURN_BOUNDARY.search(text)
    text = split_reasoning(text[: boundary.start()] if boundary else text)[1]
    text = _SPACE_RUN.sub(" ", text)  # no rule reads a run of spaces, and hostile runs made every scan long
    text = SPECIAL_TOKEN.sub("", _NOT_ANSWER_TEXT.sub("\n", text))
    blocks = _ANSWER_BLOCK.findall(text)
    if blocks:
        block = blocks[-1]
        found = _final_answer(block)
        if found:
            return found
        bare = block.strip()
        if bare and len(bare) <= MAX_ANSWER_CHARS and "\\boxed" not in bare:
            return _line_value(bare.replace("\n", " "))
    return _final_answer(text)


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
