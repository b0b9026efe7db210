"""atem: Muse Glimmer's ATEM protocol, each call a message to the tool holding an `<atem:function_calls>` block.

    <|start|>assistant to=code_interpreter<|message|><atem:function_calls>
    <atem:invoke name="code_interpreter">
    <atem:parameter name="code">print(6 * 7)</atem:parameter>
    </atem:invoke>
    </atem:function_calls><|eot|>

The generation prompt ends with `<|start|>assistant`, so the model's text begins inside the first message's header.
Values are text as written (lists and objects as JSON), typed by the tool's schema; messages to `self` are
reasoning, messages to `user` the content. No vLLM parser exists; the name is the protocol's.
"""

from __future__ import annotations

from collections.abc import Sequence

from retool_env.dialects.base import MAX_CALLS, Dialect, FunctionCall, RawCall, Scan, scan_blocks, value_text

BLOCK_START, BLOCK_END = "<atem:function_calls>", "</atem:function_calls>"
INVOKE, INVOKE_END = '<atem:invoke name="', "</atem:invoke>"
PARAMETER, PARAMETER_END = '<atem:parameter name="', "</atem:parameter>"
_ENDS = ("<|eom|>", "<|eot|>")


def _named(piece: str) -> tuple[str | None, str]:
    """The name of `name="...">rest`, and the rest."""
    name, quote, rest = piece.partition('">')
    return (name, rest) if quote else (None, piece)


def read_atem_block(body: str) -> list[RawCall]:
    calls = []
    for piece in body.split(INVOKE)[1:MAX_CALLS + 2]:
        name, rest = _named(piece)
        if name is None:
            calls.append(RawCall(None, error=f'write {INVOKE}NAME">'))
            continue
        inside, closed, _ = rest.partition(INVOKE_END)
        if not closed:
            calls.append(RawCall(name, error=f'<atem:invoke name="{name}"> is not closed with {INVOKE_END}'))
            continue
        arguments: dict[str, str] = {}
        for parameter in inside.split(PARAMETER)[1:]:
            key, value_rest = _named(parameter)
            value, value_closed, _ = value_rest.partition(PARAMETER_END)
            if key is None or not value_closed:
                calls.append(RawCall(name, error=f'write {PARAMETER}KEY">VALUE{PARAMETER_END}'))
                break
            arguments[key] = value
        else:
            calls.append(RawCall(name, arguments, text_valued=True))
    return calls or [RawCall(None, error=f"an {BLOCK_START} block holds no {INVOKE}NAME\"> element")]


class Atem(Dialect):
    name = "atem"
    markers = (("<atem:function_calls>",),)
    aliases = ("muse_glimmer",)
    end_tokens = ("<|eot|>", "<|eom|>")
    think_tags = False  # reasoning is a message to `self`

    def split_reasoning(self, text: str, opened: bool = False) -> tuple[str, str]:
        """(reasoning, content): the messages to `self` are the reasoning; the content is the rest of the turn, its
        markup kept, where calls and the answer (the message to `user`) are read."""
        if "to=self" not in text or "<|message|>" not in text:
            return "", text
        reasoning, content = [], []
        for index, message in enumerate(text.split("<|start|>")):
            header, marker, body = message.partition("<|message|>")
            if marker and "to=self" in header:
                reasoning.append(body[:min((i for i in (body.find(end) for end in _ENDS) if i >= 0),
                                           default=len(body))])
            else:
                content.append(("<|start|>" if index else "") + message)
        return "\n".join(reasoning), "".join(content)

    def _scan(self, text: str) -> Scan:
        scan = Scan()
        messages = text.split("<|start|>") if "<|message|>" in text else [text]
        for message in messages:
            if len(scan.calls) > MAX_CALLS:
                break
            header, marker, body = message.partition("<|message|>")
            if not marker:
                header, body = "", header
            cut = min((i for i in (body.find(end) for end in _ENDS) if i >= 0), default=len(body))
            body = body[:cut]
            if "to=self" in header:
                continue
            blocks = scan_blocks(body, BLOCK_START, BLOCK_END, read_atem_block)
            if "to=" not in header or "to=user" in header:
                scan.content += blocks.content
            scan.calls += blocks.calls
            scan.unfinished = scan.unfinished or blocks.unfinished
        return scan

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        messages = []
        for call in calls:
            parameters = "".join(f'{PARAMETER}{key}">'
                                 f'{value_text(value)}'
                                 f'{PARAMETER_END}\n' for key, value in call.arguments.items())
            messages.append(f"<|start|>assistant to={call.name}<|message|>{BLOCK_START}\n{INVOKE}{call.name}\">\n"
                            f"{parameters}{INVOKE_END}\n{BLOCK_END}")
        return "<|eom|>".join(messages)


Atem.register()
