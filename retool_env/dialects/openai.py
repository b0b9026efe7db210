"""openai: gpt-oss's harmony format, a call is a message addressed to `functions.NAME` on the commentary channel.

    <|start|>assistant to=functions.code_interpreter<|channel|>commentary json<|message|>{"code": "..."}<|call|>

The generation prompt ends with `<|start|>assistant`, so the model's text begins inside the first message's header.
A turn is a sequence of messages (`analysis` reasoning, `commentary` calls, `final` answer); the content is the
text of the final channel. Generation stops at `<|call|>` after a call, so a turn holds one call.
vLLM: `--tool-call-parser openai`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from retool_env.dialects.base import MAX_CALLS, Dialect, FunctionCall, RawCall, Scan, arguments_object

_ENDS = ("<|end|>", "<|call|>", "<|return|>")


def _split_body(segment: str) -> tuple[str, str]:
    """A message's header and body: the body runs from `<|message|>` to its end marker (or the end of the text)."""
    header, marker, body = segment.partition("<|message|>")
    if not marker:
        return header, ""
    cut = min((i for i in (body.find(end) for end in _ENDS) if i >= 0), default=len(body))
    return header, body[:cut]


def _recipient(header: str) -> str | None:
    at = header.find("to=")
    if at < 0:
        return None
    rest = header[at + 3:]
    stop = min((i for i in (rest.find(c) for c in (" ", "<|", "\n")) if i >= 0), default=len(rest))
    return rest[:stop]


class OpenAIHarmony(Dialect):
    name = "openai"
    markers = (("<|start|>assistant to=", "<|channel|>"),)
    aliases = ("gpt_oss", "harmony")
    end_tokens = ("<|return|>", "<|end|>")
    stop_strings = ("<|call|>",)
    multiple_calls = False
    think_tags = False  # reasoning is the analysis channel

    def _scan(self, text: str) -> Scan:
        if "<|message|>" not in text:  # no harmony markup at all: plain text is the answer
            return Scan(content=[text])
        scan = Scan()
        for segment in text.split("<|start|>"):
            if len(scan.calls) > MAX_CALLS:
                break
            header, body = _split_body(segment)
            recipient = _recipient(header)
            if recipient is None:
                if "<|channel|>final" in header or "<|channel|>commentary" in header:  # the answer, a preamble
                    scan.content.append(body)
                continue
            if not recipient.startswith("functions."):
                scan.calls.append(RawCall(recipient, error=f"the recipient {recipient!r} is not a function; address "
                                                           f"a call to=functions.NAME"))
                continue
            arguments, error = arguments_object(body.strip() or "{}", "message")
            scan.calls.append(RawCall(recipient.removeprefix("functions."), arguments, error))
        return scan

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        return "".join(f"<|start|>assistant to=functions.{call.name}<|channel|>commentary json<|message|>"
                       f"{json.dumps(call.arguments, ensure_ascii=False)}<|call|>" for call in calls)


OpenAIHarmony.register()
