"""Raw problem text: strip the instruction wrappers datasets ship with, and find or repair lost LaTeX backslashes.

The environment renders its own prompt around a raw problem, so a dataset's templated prompt must be unwrapped once,
here, or the model would see two sets of instructions.
"""

from __future__ import annotations

import re
from typing import Any

# DAPO-Math-17k's original wording, slime's `\boxed{$Answer}` wording; both share the suffix.
_DAPO_PREFIX = re.compile(
    r"\ASolve the following math problem step by step\. The last line of your response should be of the form "
    r"Answer: (?:\$Answer \(without quotes\)|\\boxed\{\$Answer\}) where \$Answer is the answer to the problem\.\s*"
)
# Suffixes appended by DAPO, by verl's retool recipe (`answer_format`) and by common verl preprocessing scripts.
_SUFFIXES = [
    re.compile(r"\s*Remember to put your answer on its own line after \"Answer:\"\.?\s*\Z"),
    re.compile(r"\s*The answer format must be: \\boxed\{'The final answer goes here\.'\}\s*\Z"),
    re.compile(r"\s*Please reason step by step, and put your final answer within \\boxed\{\}\.?\s*\Z"),
]
# The ReTool paper's instruction: everything up to "*user question:*", then the answer-format reminder.
_RETOOL_MARKER = "*user question:*"
_RETOOL_LEAD = re.compile(
    r"\A\s*Answer the following Math Problem and put the answer in the format of \\boxed\{answer\}\s*")
_RETOOL_SUFFIX = re.compile(r"\s*Remember to place the final answer in the last part using the format:.*\Z", re.DOTALL)

# C0 control characters other than newline, tab and CRLF never belong in a problem statement.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\r(?!\n)")
# A tab where a LaTeX command starting with `\t` was (`\triangle` written as "\triangle" in a Python string).
_T_COMMANDS = r"(?:riangle|frac|dfrac|imes|heta|ext|extbf|extit|an|au|ilde|op|o)\b"
_TAB_COMMAND = re.compile(r"\t(?=" + _T_COMMANDS + ")")
# Python string escapes that swallowed a backslash: "\f" (form feed) from "\frac", "\b" from "\binom", and so on.
_ESCAPES = {"\x07": "a", "\x08": "b", "\x0b": "v", "\x0c": "f", "\r": "r", "\t": "t"}
_REPAIRABLE = re.compile(r"\\?(?:[\x07\x08\x0b\x0c]|\r(?=[a-zA-Z])|\t(?=" + _T_COMMANDS + "))")


def message_text(prompt: Any) -> str:
    """The user text of a prompt given as a string or as a chat message list (DAPO stores a one-message list)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict):
        return str(prompt.get("content", ""))
    users = [m for m in prompt if m.get("role", "user") == "user"]
    if not users:
        raise ValueError(f"prompt has no user message: {prompt!r:.200}")
    return str(users[-1]["content"])


def strip_dapo_template(text: str | list[dict[str, str]]) -> str:
    """The raw problem inside a DAPO-style prompt (original or slime wording, verl suffixes); other text unchanged."""
    text = message_text(text)
    text = _DAPO_PREFIX.sub("", text, count=1)
    for suffix in _SUFFIXES:
        text = suffix.sub("", text, count=1)
    return text.strip()


def strip_retool_template(text: str | list[dict[str, str]]) -> str:
    """The raw problem inside the ReTool paper's instruction (after "*user question:*", without the format reminder)."""
    text = message_text(text)
    start = text.find(_RETOOL_MARKER)
    if start != -1:
        text = text[start + len(_RETOOL_MARKER):]
    text = _RETOOL_LEAD.sub("", text, count=1)
    return _RETOOL_SUFFIX.sub("", text, count=1).strip()


def find_control_chars(text: str) -> list[str]:
    """Suspicious characters in a problem: C0 controls besides newline/tab, and tabs that ate a LaTeX `\\t...`."""
    found = _CONTROL.findall(text) + _TAB_COMMAND.findall(text)
    return sorted(set(found))


def repair_control_chars(text: str) -> str:
    """Restore a LaTeX backslash a Python escape swallowed: form feed + "rac" -> "\\frac", tab + "imes" -> "\\times"."""
    return _REPAIRABLE.sub(lambda m: "\\" + _ESCAPES[m.group()[-1]], text)
