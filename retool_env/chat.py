"""Chat templates: which one renders an episode, and what the model sees after each tool call.

The model's tokens are appended verbatim; only what the template adds after them is tokenized, and the tool results
in it as untrusted text (`retool_env.tokens.encode_text`): interpreter output never becomes a special token. Some
templates rewrite earlier turns once more messages follow (Qwen3 drops an empty `<think></think>` block from a turn
that is no longer the last; DeepSeek-R1-Distill strips reasoning from history). `Conversation` renders the real
conversation after every tool call and tells the two cases apart: the new context either extends the old one
(append-only: one training sample goes on) or it does not (the template rewrote history: the next generation sees a
new context).

`retool_env` never imports TRL: a template name is looked up among the templates shipped here, then among those in
TRL's package folder, found without importing TRL. Picking TRL's prefix-preserving training version of a template
is the adapters' job (`retool_adapters.chat_templates.training_env_kwargs`).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import secrets
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool_env.chat_render import ChatRenderer
from retool_env.tokens import Tokenizer, encode_pieces, encode_text, has_added_token_text

__all__ = ["Conversation", "NextContext", "chat_template_names", "resolve_chat_template", "with_chat_template"]

SHIPPED_TEMPLATES = Path(__file__).parent / "chat_templates"
SAMPLE_MODES = ("episode", "turn")
_THINK = "<think>\n"
_END_THINK = "</think>"


def _at_first_think_end(text: str, opened: bool) -> tuple[str, str]:
    """(reasoning, content) split at the first `</think>`, for a caller that knows no call blocks."""
    reasoning, marker, content = text.partition(_END_THINK)
    return (reasoning, content) if marker else ("", text)


def template_folders() -> list[Path]:
    """Where template names are looked up: this package's templates, then TRL's (when TRL is installed)."""
    folders = [SHIPPED_TEMPLATES]
    trl = importlib.util.find_spec("trl")  # finds the package without importing it
    for location in (trl.submodule_search_locations or []) if trl else []:
        folders.append(Path(location) / "chat_templates")
    return folders


def chat_template_names() -> list[str]:
    return sorted({p.stem for folder in template_folders() if folder.is_dir() for p in folder.glob("*.jinja")})


def resolve_chat_template(spec: str) -> str:
    """The text of a chat template given as a name (`qwen3`, `qwen3_training`), a path to a file, or the text."""
    if "{{" in spec or "{%" in spec:
        return spec
    path = Path(spec).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    for folder in template_folders():
        if (folder / f"{spec}.jinja").is_file():
            return (folder / f"{spec}.jinja").read_text(encoding="utf-8")
    raise ValueError(f"chat_template {spec!r} is not a file, a Jinja template or a known name; known names: "
                     f"{', '.join(chat_template_names())}")


def with_chat_template(tokenizer: Tokenizer, chat_template: str | None) -> Tokenizer:
    """The tokenizer rendering with `chat_template`: a shallow copy, so the caller's tokenizer (often shared with
    a trainer) keeps its own template."""
    if chat_template is None:
        return tokenizer
    tokenizer = copy.copy(tokenizer)
    tokenizer.chat_template = resolve_chat_template(chat_template)
    return tokenizer


@dataclass(frozen=True)
class NextContext:
    """What the next generation sees after a tool call.

    `appended` are the tokens that follow the model's turn when the template kept the context append-only;
    `rewritten` is the whole new context (as the template renders it) when it rewrote an earlier turn, else None.
    `appended` is filled either way: in the `episode` sample mode the environment keeps the token stream going.
    """

    appended: list[int]
    rewritten: list[int] | None = None


class Conversation:
    """An episode's chat messages and the text the template renders for them. A message is never changed once
    added (each turn adds new dicts), so its copy for the template is made once (`ChatRenderer.messages_frozen`)."""

    def __init__(self, tokenizer: Tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 turn_end: str, chat_template_kwargs: dict[str, Any] | None = None,
                 split_turn: Callable[[str, bool], tuple[str, str]] | None = None) -> None:
        self.tokenizer = tokenizer
        self.split_turn = split_turn or _at_first_think_end  # the step's (`ToolFormat.split_reasoning`)
        self.tools = tools
        self.turn_end = turn_end
        self.chat_template_kwargs = dict(chat_template_kwargs or {})  # e.g. enable_thinking, in every render
        self.renderer = ChatRenderer(tokenizer, tools, self.chat_template_kwargs)
        self.renderer.messages_frozen = True  # messages are never changed once added: each turn makes new ones
        self.messages = list(messages)
        self.text = self.render(self.messages)  # the context of the next generation, as text
        self.reasoning_field: bool | None = None  # see assistant_message
        # Placeholders no model text or tool output can spell: a fresh nonce per episode.
        nonce = secrets.token_hex(8)
        self._marker = f"\x00retool-env-turn-{nonce}\x00"
        self._tool_marker = f"\x00retool-env-tool-{nonce}-{{}}\x00"

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The template's text for `messages` (`apply_chat_template(..., tokenize=False)`'s, see `ChatRenderer`)."""
        return self.renderer.render(messages, add_generation_prompt)

    def call_message(self, model_text: str, tool_message: dict[str, Any] | None, split: bool | None
                     ) -> dict[str, Any]:
        """The model's call turn as a message: its text (`assistant_message`), or, for a template that reads calls
        from `tool_calls`, its reasoning kept as `assistant_message` keeps it and `tool_message`'s content and calls."""
        if tool_message is None:
            return self.assistant_message(model_text, split)
        reasoning_end = self.reasoning_end(model_text)
        reasoning = model_text[: reasoning_end + len(_END_THINK)] if reasoning_end >= 0 else ""
        content = tool_message.get("content")
        message = self.assistant_message(reasoning + (content or ""), split)
        if content is None and message.get("content") == "":
            return {**tool_message, **message, "content": None, "tool_calls": tool_message["tool_calls"]}
        return {**tool_message, **message, "tool_calls": tool_message["tool_calls"]}

    def reasoning_end(self, text: str) -> int:
        """The index of the model's own `</think>` in `text` as the step reads it (outside its call blocks), or -1."""
        reasoning, content = self.split_turn(text, False)
        split = len(reasoning) + len(_END_THINK) + len(content) == len(text) and text.startswith(_END_THINK,
                                                                                                 len(reasoning))
        return len(reasoning) if split else -1

    def assistant_message(self, model_text: str, reasoning_field: bool | None = None) -> dict[str, str]:
        """The model's turn as a message. Its text follows the think block the generation prompt opened, if any
        (Qwen3.5+, DeepSeek-R1-Distill). Templates read reasoning either inside the content (Qwen3, R1) or from a
        `reasoning_content` field (Qwen3.8): the form under which the template gave back the model's own tokens
        is kept for the episode (`reasoning_field`)."""
        text = (_THINK if self.text.endswith(_THINK) else "") + model_text
        split = self.reasoning_field if reasoning_field is None else reasoning_field
        reasoning_end = self.reasoning_end(text) if split else -1
        if reasoning_end >= 0:
            reasoning, content = text[:reasoning_end], text[reasoning_end + len(_END_THINK):]
            return {"role": "assistant", "content": content.lstrip("\n"),
                    "reasoning_content": reasoning.removeprefix(_THINK).strip("\n")}
        return {"role": "assistant", "content": text}

    def after_tools(self, model_text: str, closing_ids: tuple[int, ...], tool_messages: list[dict[str, Any]],
                    tool_message: dict[str, Any] | None = None, end_text: str | None = None) -> NextContext:
        """Add the model's turn (its text without the end token) and the tool results; return what follows.

        One rendering of the real conversation settles the usual case: it starts with the old context, the model's
        text and the turn's end (`end_text`, the template's turn end by default), so the context stayed
        append-only. Otherwise the template rewrote history, and what it renders after a turn is found with a
        placeholder in place of the turn's content (or, for a turn given as `tool_message`, the template's calls,
        as the difference between the rendering with the results and the one without).
        """
        head = self.text + model_text + (self.turn_end if end_text is None else end_text)
        rendered = []
        for split in [self.reasoning_field] if self.reasoning_field is not None else [False, True]:
            messages = [*self.messages, self.call_message(model_text, tool_message, split), *tool_messages]
            rendered.append((messages, self.render(messages)))
            if rendered[-1][1].startswith(head):
                self.reasoning_field = split
                self.messages, self.text = rendered[-1]
                # Text after a special token (the turn's end) tokenizes on its own, whatever came before it.
                appended = self.encode_rendered(messages, self.text, len(head), tool_messages)
                return NextContext([*closing_ids, *appended])
        if tool_message is None:
            marked_messages = [*self.messages, self.assistant_message(self._marker), *tool_messages]
            marked = self.render(marked_messages)
            end = marked.index(self._marker) + len(self._marker)
            if not marked.startswith(self.turn_end, end):
                raise ValueError(f"the chat template does not end an assistant turn with {self.turn_end!r} (it "
                                 f"renders {marked[end:end + 40]!r}); tool results cannot follow the model's turn")
            appended = self.encode_rendered(marked_messages, marked, end + len(self.turn_end), tool_messages)
        else:  # the template's own rendering of the calls replaced the model's: what it renders after the turn
            marked_messages, marked = rendered[0]
            before = self.render(marked_messages[: len(marked_messages) - len(tool_messages)], False)
            end = next((i for i, (a, b) in enumerate(zip(before, marked, strict=False)) if a != b),
                       min(len(before), len(marked)))
            appended = self.encode_rendered(marked_messages, marked, end, tool_messages)
        self.messages, self.text = rendered[0]
        every_tool_message = [m for m in self.messages if m.get("role") == "tool"]
        return NextContext([*closing_ids, *appended],
                           rewritten=self.encode_rendered(self.messages, self.text, 0, every_tool_message))

    def encode_rendered(self, messages: list[dict[str, Any]], text: str, start: int, untrusted: list[dict[str, Any]]
               ) -> list[int]:
        """Token ids of `text[start:]`, where `text` renders `messages`, with every tool result encoded as untrusted
        text: interpreter output that spells a special token stays characters. When none of the `untrusted`
        messages could spell one (the usual case), that is the plain encoding of the text."""
        if not any(has_added_token_text(self.tokenizer, str(m.get("content", ""))) for m in untrusted):
            return encode_pieces(self.tokenizer, text[start:])
        segments = self._segments(messages, text)
        if segments is None:  # the template changes tool results beyond recognition: split everything
            warnings.warn("the chat template changes tool results in a way the environment cannot locate, so the "
                          "whole tool turn is encoded with special tokens split", stacklevel=3)
            return encode_text(self.tokenizer, text[start:])
        ids, offset = [], 0
        for piece, trusted in segments:
            cut = piece[max(0, start - offset):]
            offset += len(piece)
            if cut:
                ids.extend(encode_pieces(self.tokenizer, cut) if trusted else encode_text(self.tokenizer, cut))
        return ids

    def _segments(self, messages: list[dict[str, Any]], text: str) -> list[tuple[str, bool]] | None:
        """`text` (the rendering of `messages`) cut into the template's own pieces (True) and tool results (False),
        found by rendering markers in place of the results; None if the results are not where the markers are."""
        contents: list[str] = []
        marked_messages: list[dict[str, Any]] = []
        for message in messages:
            if message.get("role") == "tool":
                marked_messages.append({**message, "content": self._tool_marker.format(len(contents))})
                contents.append(str(message.get("content", "")))
            else:
                marked_messages.append(message)
        marked, pieces, position, as_json = self.render(marked_messages), [], 0, []
        for index in range(len(contents)):
            raw = self._tool_marker.format(index)
            # as given, or as a JSON string's body (gpt-oss and Llama 3.1 render results with `tojson`)
            candidates = ((raw, False), (json.dumps(raw)[1:-1], True))
            found, marker, encoded = next(((at, m, e) for m, e in candidates if (at := marked.find(m, position)) >= 0),
                                          (-1, raw, False))
            if found < 0:
                return None
            pieces.append(marked[position:found])
            position = found + len(marker)
            as_json.append(encoded)
        pieces.append(marked[position:])
        for shown in (contents, [c.strip() for c in contents]):  # as given, or trimmed by the template
            shown = [json.dumps(c, ensure_ascii=False)[1:-1] if encoded else c
                     for c, encoded in zip(shown, as_json, strict=True)]
            segments = [(pieces[0], True)]
            for content, piece in zip(shown, pieces[1:], strict=True):
                segments += [(content, False), (piece, True)]
            if "".join(piece for piece, _ in segments) == text:
                return segments
        return None
