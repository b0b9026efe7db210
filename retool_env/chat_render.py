"""Chat template rendering on the step path: the text `tokenizer.apply_chat_template(messages, tools=...,
tokenize=False)` gives, without the work it repeats on every call.

Every tool call renders the episode's whole conversation (`retool_env.chat.Conversation`), and in transformers
about half of that render's cost is not the template's own work: each call converts and copies every message, the
tools and the special tokens, and the Jinja sandbox re-checks each attribute access (raising an `AttributeError` for
every `message.role` before reading the item). `ChatRenderer` renders transformers' own compiled template with the
same inputs, prepared the same way: a message of plain JSON data by a copy without its `None` values (what
transformers' converters make of it), any other message by those converters themselves; the tools and the template
variables (special tokens, `chat_template_kwargs`) once, when a renderer first renders. It renders in an overlay of
transformers' sandbox that decides alike, faster (`retool_env.internals.jinja_sandbox`: attribute checks remembered,
the tools' `tojson` written once for the one frozen copy of each tool list). A renderer whose owner never changes a
message once given (`Conversation`, `messages_frozen`) copies each message for the template once.

The fast path is taken only for a Hugging Face tokenizer whose `apply_chat_template` is transformers' own, with a
transformers that has the helpers used here (5.20 and later; `retool_env.internals.transformers_chat`). The first
renders of each (tokenizer, template, tools, options) are compared with `apply_chat_template`; any difference turns
the fast path off for them, with a warning. A render the fast path cannot do (it raises) is done by
`apply_chat_template`, so errors are transformers'. Any other tokenizer (the `retool_env.tokens.Tokenizer`
protocol) renders through its own `apply_chat_template`.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from typing import Any

from retool_env.internals.jinja_sandbox import remembering_overlay
from retool_env.internals.transformers_chat import chat_template_helpers
from retool_env.tokens import Tokenizer

__all__ = ["ChatRenderer"]

VERIFIED_RENDERS = 8
"""Renders of each (tokenizer, template, tools, options) checked against `apply_chat_template` before trusting the
fast path alone: the first episode's prompt and tool turns (a few renders per process)."""

_COPIES_LIMIT = 512  # template copies of messages kept per renderer (an episode's conversation)

# tokenizer -> {(template, tools, options): renders found equal so far, or -1 when the fast path is off}
_checks: weakref.WeakKeyDictionary[Any, dict[tuple[str, str, str], int]] = weakref.WeakKeyDictionary()


@functools.lru_cache(maxsize=64)
def _fast_template(template: str) -> Any:
    """transformers' compiled template, recompiled in an overlay of its sandbox whose attribute checks are
    remembered (see the module docstring and `retool_env.internals.jinja_sandbox`)."""
    helpers = chat_template_helpers()
    assert helpers is not None, "only called when the fast path is available"
    return remembering_overlay(template, helpers.compile(template), _frozen_json)


# The plain copy of each tool list (by its repr), shared by every render: no template can change it (the sandbox
# is immutable) and nothing else holds it, so its JSON is written once (`_frozen_json`: id -> (object, texts)).
_frozen_tools: dict[str, Any] = {}
_frozen_json: dict[int, tuple[Any, dict[Any, str]]] = {}
_FROZEN_LIMIT = 64


def _frozen(tools: Any) -> Any:
    """The one frozen copy of these plain tools (or `tools` itself once many distinct lists were seen)."""
    key = repr(tools)
    if key in _frozen_tools:
        return _frozen_tools[key]
    if tools is None or len(_frozen_tools) >= _FROZEN_LIMIT:
        return tools
    _frozen_tools[key] = tools
    for value in [tools, *(tools if isinstance(tools, (list, tuple)) else [])]:
        _frozen_json[id(value)] = (value, {})
    return tools


class ChatRenderer:
    """Renders conversations through a tokenizer's chat template with fixed tools and template options: the text
    `tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=...,
    **chat_template_kwargs)` gives, fast for a Hugging Face tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, tools: list[dict[str, Any]] | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.tools = tools
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._source: Any = None  # the tokenizer's chat_template the fast path was prepared for
        self._prepared: tuple[Any, Any, dict[str, Any], tuple[str, str, str]] | None = None
        self._tools_seen: Any = None
        self._own_checks: dict[tuple[str, str, str], int] = {}
        self._trusted: Any = None  # the prepared fast path once its renders were checked
        # Messages this renderer's owner never changes once given (`Conversation`'s): their template copies, made
        # once each (by id, the message kept alive beside its copy).
        self.messages_frozen = False
        self._copies: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def slow_render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The rendering by the tokenizer's own `apply_chat_template`."""
        return self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  **self.chat_template_kwargs)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The template's text for `messages`: `fast_render`'s once its first renders matched `slow_render`'s."""
        prepared = self._prepare()
        if prepared is None:
            return self.slow_render(messages, add_generation_prompt)
        if prepared is self._trusted:
            try:
                return self._fast(prepared, messages, add_generation_prompt)
            except Exception:  # the template refuses these messages: transformers says so in its words
                return self.slow_render(messages, add_generation_prompt)
        try:
            checks = _checks.setdefault(self.tokenizer, {})
        except TypeError:  # a tokenizer that cannot be weakly referenced: its renderers check on their own
            checks = self._own_checks
        verified = checks.get(prepared[3], 0)
        if verified < 0:
            return self.slow_render(messages, add_generation_prompt)
        try:
            text = self._fast(prepared, messages, add_generation_prompt)
        except Exception:  # the template refuses these messages: transformers says so in its words
            return self.slow_render(messages, add_generation_prompt)
        if verified < VERIFIED_RENDERS:
            expected = self.slow_render(messages, add_generation_prompt)
            if text != expected:
                checks[prepared[3]] = -1
                warnings.warn("the fast chat template rendering differs from apply_chat_template for this tokenizer "
                              "(another transformers version?); rendering through apply_chat_template",
                              stacklevel=2)
                return expected
            checks[prepared[3]] = verified + 1
        else:
            self._trusted = prepared
        return text

    def fast_render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str | None:
        """The fast path's text for `messages`, unchecked; None for a tokenizer it does not serve."""
        prepared = self._prepare()
        return None if prepared is None else self._fast(prepared, messages, add_generation_prompt)

    def _fast(self, prepared: tuple[Any, Any, dict[str, Any], Any], messages: list[dict[str, Any]],
              add_generation_prompt: bool) -> str:
        if not messages:
            raise ValueError("no messages")  # apply_chat_template's own error follows
        template, tools, variables, _ = prepared
        if self.messages_frozen:
            copies = self._copies
            if len(copies) > _COPIES_LIMIT:
                copies.clear()
            shown = []
            for message in messages:
                known = copies.get(id(message))
                if known is None or known[0] is not message:
                    known = copies[id(message)] = (message, _template_messages([message])[0])
                shown.append(known[1])
        else:
            shown = _template_messages(messages)
        return template.render(messages=shown, tools=tools, documents=None,
                               add_generation_prompt=add_generation_prompt, **variables)

    def _prepare(self) -> tuple[Any, Any, dict[str, Any], tuple[str, str, str]] | None:
        """The compiled template, tools and template variables of the fast path, or None where it is not taken."""
        tokenizer: Any = self.tokenizer  # a Hugging Face tokenizer where the fast path is taken
        source = getattr(tokenizer, "chat_template", None)
        if source is self._source and self.tools is self._tools_seen:
            return self._prepared
        self._source, self._tools_seen, self._prepared = source, self.tools, None
        helpers = chat_template_helpers()
        if (helpers is None or not isinstance(tokenizer, helpers.base_class)
                or type(tokenizer).apply_chat_template is not helpers.base_class.apply_chat_template
                or not set(self.chat_template_kwargs).isdisjoint(helpers.apply_parameters)
                or (self.tools is not None and not all(isinstance(t, dict) for t in self.tools))):
            return None
        try:
            template = tokenizer.get_chat_template(None, self.tools)
            variables = helpers.plain({**tokenizer.special_tokens_map, **self.chat_template_kwargs})
            tools = _frozen(helpers.plain(list(self.tools) if self.tools is not None else None))
            key = (template, repr(tools), repr(variables))
            self._prepared = (_fast_template(template), tools, variables, key)
        except Exception:  # no template, or one that does not compile: apply_chat_template raises its own error
            return None
        return self._prepared



def _template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as transformers hands them to the template: plain data, `None` values dropped, reasoning under
    each of its names."""
    helpers = chat_template_helpers()
    assert helpers is not None, "only called when the fast path is available"
    prepared = []
    for message in messages:
        plain: Any = _plain_json(message) if type(message) is dict else _NOT_PLAIN
        if plain is _NOT_PLAIN:  # objects, subclasses, media: transformers' own converters
            plain = helpers.plain(helpers.normalize([message]))[0]
        else:
            plain = {key: value for key, value in plain.items() if value is not None}
        prepared.append(plain)
    return helpers.alias(prepared)


_NOT_PLAIN = object()
_SCALARS = (str, int, float, bool, type(None))


def _plain_json(value: Any, depth: int = 0) -> Any:
    """A copy of JSON data built of exact dicts, lists and scalars (what transformers' converters make of it), or
    `_NOT_PLAIN` for anything else."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if depth > 32:
        return _NOT_PLAIN
    if kind is dict:
        copied = {}
        for key, item in value.items():
            item = _plain_json(item, depth + 1)
            if type(key) is not str or item is _NOT_PLAIN:
                return _NOT_PLAIN
            copied[key] = item
        return copied
    if kind is list:
        items = [_plain_json(item, depth + 1) for item in value]
        return _NOT_PLAIN if any(item is _NOT_PLAIN for item in items) else items
    return _NOT_PLAIN
