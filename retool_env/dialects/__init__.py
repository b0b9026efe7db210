"""Tool-call dialects: how each model family writes tool calls, read back from a turn's text.

One module per dialect, named as vLLM's `--tool-call-parser` names it (`atem` excepted: vLLM has none), which
registers it (`Dialect.register`); importing this package imports them all. Every dialect parses a turn into
`ParsedCall`s typed by the tools' JSON Schemas (`Dialect.parse`), writes calls as its family's template renders them
(`Dialect.call_text`), and says what stops a turn of calls (`stop_strings`). `detect_dialect` picks the dialect a
chat template teaches, by each dialect's `markers`; `tool_system_prompt` writes the tool schemas and the call format
for templates that do not render `tools` themselves (`renders_tools`).

    >>> from retool_env.dialects import get_dialect
    >>> turn = get_dialect("qwen3_coder").parse("<tool_call>\\n<function=f>\\n<parameter=n>\\n7\\n</parameter>\\n"
    ...                                         "</function>\\n</tool_call>")
    >>> turn.calls[0].name, turn.calls[0].arguments
    ('f', {'n': '7'})
"""

from __future__ import annotations

import functools
import importlib
import json
import pkgutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from retool_env.dialects.base import (
    ALIASES,
    DIALECTS,
    Dialect,
    FunctionCall,
    ParsedCall,
    ParsedTurn,
    example_call,
    tool_functions,
)

__all__ = ["ALIASES", "DIALECTS", "CallShape", "Dialect", "FunctionCall", "ParsedCall", "ParsedTurn",
           "detect_dialect", "get_dialect", "renders_tool_calls", "renders_tools", "tool_call_shape",
           "tool_system_prompt"]

for _module in pkgutil.iter_modules(__path__):  # every module here but base.py registers its dialect
    importlib.import_module(f"{__name__}.{_module.name}")


def get_dialect(name: str) -> Dialect:
    """The dialect of a vLLM `--tool-call-parser` name (or one of its aliases)."""
    dialect = DIALECTS.get(ALIASES.get(name, name))
    if dialect is None:
        raise ValueError(f"unknown tool-call dialect {name!r}; choose one of {sorted(DIALECTS)}")
    return dialect


def detection_order() -> list[Dialect]:
    """The dialects in the order `detect_dialect` tries their markers: each after those it names in
    `detect_after` (whose templates write its markers too), else in the order they registered."""
    placed: dict[str, Dialect] = {}
    waiting = list(DIALECTS.values())
    while waiting:
        ready = next((d for d in waiting if all(n in placed or n not in DIALECTS for n in d.detect_after)), None)
        if ready is None:
            raise ValueError(f"the dialects' detect_after form a loop: {[d.name for d in waiting]}")
        placed[ready.name] = ready
        waiting.remove(ready)
    return list(placed.values())


def detect_dialect(chat_template: str) -> str:
    """The dialect a chat template renders tool calls in (for `tool_format="auto"`), read from the call syntax
    the template writes (each dialect's `markers`); raises when it writes none (then name a dialect, and see
    `tool_system_prompt`)."""
    for dialect in detection_order():
        if any(all(marker in chat_template for marker in group) for group in dialect.markers):
            return dialect.name
    raise ValueError("the chat template writes no tool-call syntax this package knows (it may not support tool "
                     f"calls); name a dialect explicitly, one of {sorted(DIALECTS)}")


_PROBE = "retool_probe_function"
_PROBE_TOOL = {"type": "function", "function": {"name": _PROBE, "description": "probe", "parameters": {
    "type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}


def _render(chat_template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
            add_generation_prompt: bool = False) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{k: v for k, v in m.items() if v is not None} for m in messages]  # as apply_chat_template does
    rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=chat_template,
                                        add_generation_prompt=add_generation_prompt, bos_token="", eos_token="")
    return rendered[0]


def renders_tools(chat_template: str) -> bool:
    """Whether the template shows the tool schemas passed as `tools` (rendered with a probe tool). When it does not
    (DeepSeek-V3, DeepSeek-R1-Distill), put `tool_system_prompt(...)` in the system message."""
    return _PROBE in _render(chat_template, [{"role": "user", "content": "u"}], [_PROBE_TOOL])


@dataclass(frozen=True)
class CallShape:
    """How a chat template reads an assistant message's `tool_calls`: the arguments as a mapping or as a JSON
    string (DeepSeek-V3's original template), and the content of a message that only calls ("" or None)."""

    arguments_as_string: bool
    content: str | None


@functools.lru_cache(maxsize=64)
def tool_call_shape(chat_template: str, dialect: str) -> CallShape | None:
    """The message shape under which the template renders a call that `dialect` parses back to the same call, or
    None when no shape does: the template drops `tool_calls` (LFM2's first template; DeepSeek-R1-Distill's, which
    renders calls only when the content is None, a key `apply_chat_template` drops), so the model's calls must stay
    in the message's content as it wrote them."""
    parser = get_dialect(dialect)
    probe = FunctionCall(_PROBE, {"x": "y"})
    user = [{"role": "user", "content": "u"}]
    history = _render(chat_template, user, [_PROBE_TOOL])
    prompt = _render(chat_template, user, [_PROBE_TOOL], add_generation_prompt=True)
    for shape in (CallShape(False, ""), CallShape(True, ""), CallShape(False, None), CallShape(True, None)):
        message = parser.tool_call_message(shape.content, [probe], arguments_as_string=shape.arguments_as_string)
        try:
            rendered = _render(chat_template, [*user, message], [_PROBE_TOOL])
        except Exception:  # a template that cannot render this shape
            continue
        # What the model wrote: the render after the generation prompt (after the history alone where the prompt
        # prefills text the render replaces, as R1-Distill's `<think>`).
        written = rendered[len(prompt if rendered.startswith(prompt) else history):]
        calls = parser.parse(written).calls
        if [(c.name, c.arguments) for c in calls] == [(probe.name, probe.arguments)]:
            return shape
    return None


def renders_tool_calls(chat_template: str, dialect: str) -> bool:
    """Whether the template renders an assistant message's `tool_calls` in `dialect` (see `tool_call_shape`)."""
    return tool_call_shape(chat_template, dialect) is not None


def tool_system_prompt(dialect: str | Dialect, tools: Sequence[dict[str, Any]]) -> str:
    """The system-prompt text that shows the tools' schemas and how to call them in `dialect`, for a chat template
    that does not render `tools` (see `renders_tools`)."""
    dialect = get_dialect(dialect) if isinstance(dialect, str) else dialect
    schemas = "\n".join(json.dumps({"type": "function", "function": function}, ensure_ascii=False)
                        for function in tool_functions(tools).values())
    several = ("You may call several functions in one turn, one after another." if dialect.multiple_calls else
               "Call one function per turn.")
    return (f"# Tools\n\nYou may call the following functions, described by their JSON Schema:\n{schemas}\n\n"
            f"To call a function, write exactly this form, with the function's name and arguments:\n"
            f"{dialect.call_text([example_call(tools)])}\n\n{several} The result comes back in the next message.")
