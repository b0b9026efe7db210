"""openai: gpt-oss's harmony format, a call is a message addressed to `functions.NAME` on the commentary channel.

    <|start|>assistant to=functions.code_interpreter<|channel|>commentary json<|message|>{"code": "..."}<|call|>

The generation prompt ends with `<|start|>assistant`, so the model's text begins inside the first message's header.
A turn is a sequence of messages (`analysis` reasoning, `commentary` calls, `final` answer); the content is the
text of the final channel and of commentary preambles, joined by newlines. Read as vLLM's `HarmonyParser` reads it:
a bare recipient (`to=NAME`) is a function too, but not one of gpt-oss's built-in tools (`python`, `browser.*`,
`container.*`); a message whose header never reaches `<|message|>` is kept as text. Generation stops at `<|call|>`
after a call, so a turn holds one call. vLLM: `--tool-call-parser openai`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from retool_env.dialects.base import MAX_CALLS, Dialect, FunctionCall, RawCall, Scan, arguments_object

_ENDS = ("<|end|>", "<|call|>", "<|return|>")


_BUILTIN_TOOLS = frozenset(("python", "browser", "container"))  # vLLM's BUILTIN_TOOL_TO_MCP_SERVER_LABEL


def _body(message: str) -> str:
    """A message's body: from `<|message|>` to its end marker (or the end of the text)."""
    cut = min((i for i in (message.find(end) for end in _ENDS) if i >= 0), default=len(message))
    return message[:cut]


def _recipient(header: str) -> str | None:
    at = header.find("to=")
    if at < 0:
        return None
    rest = header[at + 3:]
    stop = min((i for i in (rest.find(c) for c in (" ", "<|", "\n")) if i >= 0), default=len(rest))
    return rest[:stop]


def _function(recipient: str) -> str | None:
    """The function a recipient addresses, as vLLM's `is_function_recipient` reads it: `functions.NAME`, or a bare
    `NAME` that is no built-in tool and not the assistant; None for any other recipient."""
    if recipient.startswith("functions."):
        return recipient.removeprefix("functions.") or None
    if not recipient or recipient.startswith("<|") or recipient == "assistant":
        return None
    return None if recipient.split(".", 1)[0] in _BUILTIN_TOOLS else recipient


class OpenAIHarmony(Dialect):
    name = "openai"
    markers = (("<|start|>assistant to=", "<|channel|>"),)
    aliases = ("gpt_oss", "harmony")
    end_tokens = ("<|return|>", "<|end|>")
    stop_strings = ("<|call|>",)
    multiple_calls = False
    think_tags = False  # reasoning is the analysis channel

    def split_reasoning(self, text: str, opened: bool = False) -> tuple[str, str]:
        """(reasoning, content): the analysis messages are the reasoning, as vLLM's `HarmonyParser` reads them; the
        content is the rest of the turn, its markup kept, where calls and the final answer are read."""
        if "<|channel|>analysis" not in text:
            return "", text
        reasoning, content = [], []
        for index, segment in enumerate(text.split("<|start|>")):
            header, marker, message = segment.partition("<|message|>")
            if marker and "<|channel|>analysis" in header and _recipient(header) is None:
                reasoning.append(_body(message))
            else:
                content.append(("<|start|>" if index else "") + segment)
        return "\n".join(reasoning), "".join(content)

    def _scan(self, text: str) -> Scan:
        if "<|message|>" not in text:  # no harmony markup at all: plain text is the answer
            return Scan(content=[text])
        scan, content = Scan(), []
        for index, segment in enumerate(text.split("<|start|>")):
            if len(scan.calls) > MAX_CALLS:
                break
            header, marker, message = segment.partition("<|message|>")
            if not marker:  # a header cut off before `<|message|>`: its raw text, as vLLM recovers it
                content.append(("<|start|>" if index else "") + segment if segment else "")
                continue
            body, recipient = _body(message), _recipient(header)
            if recipient is None:
                if "<|channel|>final" in header or "<|channel|>commentary" in header:  # the answer, a preamble
                    content.append(body)
                continue
            function = _function(recipient)
            if function is None:
                what = ("gpt-oss's built-in tool, not a function here" if recipient.split(".", 1)[0] in _BUILTIN_TOOLS
                        else "not a function")
                scan.calls.append(RawCall(recipient or None, error=f"the recipient {recipient!r} is {what}; address "
                                                                   f"a call to=functions.NAME"))
                continue
            arguments, error = arguments_object(body.strip() or "{}", "message")
            scan.calls.append(RawCall(function, arguments, error))
        scan.content.append("\n".join(part for part in content if part))  # vLLM joins the messages' texts
        return scan

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        return "".join(f"<|start|>assistant to=functions.{call.name}<|channel|>commentary json<|message|>"
                       f"{json.dumps(call.arguments, ensure_ascii=False)}<|call|>" for call in calls)


OpenAIHarmony.register()
