"""Tool-call formats: the contract (`ToolFormat`), the chat dialects' one format (`DialectFormat`), and the paper's.

A format owns both directions. Reading: it never re-tokenizes the model's action; it parses the decoded text, then
produces only the tokens the environment appends (a closing token the model did not emit, and the observation), all
with mask 0. Writing: `call_text`, `answer_text` and `model_turns` give the text a model writes in the format, which
cold-start data replays through the environment and adapters hand to their frameworks.

Every chat dialect (hermes `<tool_call>` JSON, Qwen3.5+ XML, gpt-oss harmony, ...: `retool_env.dialects`, where a new
one goes) is read through `DialectFormat`, its results `tool` turns the tokenizer's chat template renders. `retool`
is the ReTool paper's format: code in `<code>```python ...```</code>` (generation stops at `</code>`), the result
inline as `<interpreter>...</interpreter>` in the same assistant turn, the answer in `<answer>\\boxed{...}</answer>`.
A format unlike both subclasses `ToolFormat` (`_parse_text`, `observation_ids`, `call_text`). Parsers read hostile
text in linear time, and a malformed call becomes a `ToolCall` whose `error` tells the model what was wrong.
"""

from __future__ import annotations

import functools
import logging
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from retool_env.chat import Conversation
from retool_env.chat_render import ChatRenderer
from retool_env.dialects import (
    DIALECTS,
    Dialect,
    FunctionCall,
    ParsedCall,
    detect_dialect,
    get_dialect,
    renders_tools,
    tool_call_shape,
    tool_system_prompt,
)
from retool_env.reasoning import THINK, CallBlocks, split_reasoning
from retool_env.tokens import Tokenizer, encode_text, has_added_token_text
from retool_env.tokens import clip_tokens as clip_tokens  # also importable from here
from retool_env.tokens import decode as decode
from retool_env.tokens import encode as encode

logger = logging.getLogger(__name__)

TOOL_NAME = "code_interpreter"
CODE_INTERPRETER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Run Python code in a sandbox and return what it prints (the value of a trailing expression "
                       "is printed too). numpy and sympy are available.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
    },
}

_FENCE = "```"
_FENCE_LANGUAGES = ("", "python", "python3", "py")


def strip_code_fences(code: str) -> str:
    """Remove a markdown fence around the code (```python ... ```), which models often put inside tool calls.

    Linear in the code's length: the opening fence's line and the last fence are found with string scans (a regex
    for the same shape backtracks quadratically on runs of spaces)."""
    stripped = code.lstrip()
    newline = stripped.find("\n")
    if not stripped.startswith(_FENCE) or newline < 0:
        return code.strip("\n")
    if stripped[len(_FENCE) : newline].strip(" \t").lower() not in _FENCE_LANGUAGES:
        return code.strip("\n")
    body = stripped[newline + 1 :].rstrip()
    if not body.endswith(_FENCE):
        return code.strip("\n")
    body = body[: -len(_FENCE)].rstrip(" \t")
    return body.removesuffix("\n")


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an action: the code to run, or why the call was rejected (shown to the model)."""

    code: str | None
    error: str | None = None


@dataclass(frozen=True)
class ParsedAction:
    """What an action asks for.

    `closing_ids` are tokens the environment appends (mask 0) to close the model's turn when the generator stopped
    before the end token (at a stop string), or ended it with another end token than the template's; `complete` is
    False when the turn was cut off (no end token, no call); `in_call` is True when it stopped inside a tool call
    that never closed: such a turn is no answer. `text` is the whole turn, `content` what follows its reasoning
    (`retool_env.reasoning`), where calls are read (unless the format runs code inside reasoning, as `retool`).
    """

    tool_calls: tuple[ToolCall, ...]
    closing_ids: tuple[int, ...] = ()
    complete: bool = True
    in_call: bool = False
    text: str = ""  # the model's text of the turn, its end token excluded
    content: str = ""  # the text after the turn's reasoning block
    thinking: bool = False  # the turn ends inside its reasoning (a think block opened, no `</think>` of its own)
    end_text: str | None = None  # the text of the end token (and closing tokens) after `text`; None: the turn end
    tool_message: dict[str, Any] | None = None  # the call turn as the template reads it (None: `text` as content)

    def replace(self, **changes: Any) -> ParsedAction:
        """`dataclasses.replace(self, **changes)` without its per-field work (twice on every step's path)."""
        unknown = changes.keys() - self.__dict__.keys()
        if unknown:
            raise TypeError(f"ParsedAction has no field(s) {sorted(unknown)}")
        new = object.__new__(ParsedAction)
        new.__dict__.update(self.__dict__, **changes)
        return new

    @property
    def is_final(self) -> bool:
        return not self.tool_calls

    @property
    def is_answer(self) -> bool:
        """The turn may be graded as the final answer: it neither calls a tool nor stopped inside a call."""
        return not self.tool_calls and not self.in_call


class ToolFormat(ABC):
    """Parses actions and renders observations for one tool-calling convention and tokenizer, and writes the text a
    model produces in it (`call_text`, `answer_text`, `model_turns`; these need no tokenizer: call them on the
    class)."""

    name: str
    default_prompt: str
    call_glue: str  # between a turn's text and its tool call
    call_ends_turn: bool  # the model ends its turn after a tool call (else generation stops at a stop string)
    tool_turns: bool  # results are chat turns the template renders (`tool_messages`), else inline in the model's turn
    calls_in_reasoning: bool = False  # calls are read inside a think block too (else only from the content after it)
    call_blocks: CallBlocks = ()  # the blocks inside which a `</think>` is the call's text (`retool_env.reasoning`)
    turn_end_id: int | None = None  # the template's end-of-turn token, inserted when a call turn ends otherwise
    turn_end: str | None = None  # its text, for formats whose results are chat turns (`tool_turns`)
    system_prompt: str | None = None  # tool schemas and call format, for a template that does not render `tools`

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        ends = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
        ends = [i for i in [tokenizer.eos_token_id, *ends] if isinstance(i, int) and i != tokenizer.unk_token_id]
        self.end_token_ids: list[int] = list(dict.fromkeys(ends))
        if not self.end_token_ids:
            raise ValueError("the tokenizer has no end-of-turn token (eos_token or <|im_end|>)")

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The tool schemas the prompt advertises (None: the prompt itself explains the format)."""
        return None

    @property
    def stop_strings(self) -> list[str]:
        return []

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self.end_token_ids)

    def encode(self, text: str) -> list[int]:
        return encode(self.tokenizer, text)

    def parse(self, action_ids: list[int], reasoning_open: bool = False) -> ParsedAction:
        """Split off the end token and the reasoning, then let the format read the content the model wrote.
        `reasoning_open`: the context before the turn opened a think block (the generation prompt ends in one)."""
        ended = bool(action_ids) and action_ids[-1] in self.end_token_ids
        body = action_ids[:-1] if ended else action_ids
        text = decode(self.tokenizer, body)
        reasoning, content = self.split_reasoning(text, reasoning_open)
        parsed = self._parse_text(text if self.calls_in_reasoning else content, ended)
        if (ended and parsed.tool_calls and self.call_ends_turn and self.turn_end_id is not None
                and action_ids[-1] != self.turn_end_id and not parsed.closing_ids):
            # e.g. <|endoftext|> after a call: the template's turn end follows it, so the tool turn renders in place
            parsed = parsed.replace(closing_ids=(self.turn_end_id,))
        return parsed.replace(text=text, content=content,
                              thinking=self._still_thinking(text, reasoning_open, reasoning))

    def split_reasoning(self, text: str, opened: bool = False) -> tuple[str, str]:
        """(reasoning, content) of a turn: the reasoning ends at the model's own `</think>` outside any tool call."""
        return split_reasoning(text, opened, self.call_blocks)

    @staticmethod
    def _still_thinking(text: str, opened: bool, reasoning: str) -> bool:
        return (opened or text.lstrip().startswith(THINK)) and reasoning == text

    @abstractmethod
    def _parse_text(self, text: str, ended: bool) -> ParsedAction:
        """Read the tool calls of a turn's text (its end token excluded; `ended`: the model emitted one)."""

    @abstractmethod
    def observation_ids(self, outputs: list[str]) -> list[int]:
        """Tokens that follow the model's turn: the rendered interpreter outputs, ready for the next generation."""

    def tool_messages(self, outputs: list[str]) -> list[dict[str, Any]]:
        """The tool results as chat messages, for formats whose results are turns the template renders."""
        raise NotImplementedError(f"the {self.name} format renders tool results inline, not as chat turns")

    @staticmethod
    @abstractmethod
    def call_text(code: str) -> str:
        """One tool call running `code`, as the model writes it."""

    @staticmethod
    def answer_text(answer: str) -> str:
        """The final answer (`\\boxed{...}`), as the model writes it."""
        return answer

    @classmethod
    def sft_conversation(cls, segments: Iterable[Any], question: str) -> dict[str, Any]:
        """A worked solution (segments with a `kind` and `content`, as `retool_env.data.sft.Segment`) as SFT data in
        this format: the messages, and which parts are trained."""
        raise ValueError(f"the {cls.name} format writes no SFT conversation; use retool or hermes")

    @classmethod
    def model_turns(cls, segments: Iterable[Any], end_of_turn: str) -> list[str]:
        """The text of each model turn of a worked solution (segments with a `kind` and `content`, as
        `retool_env.data.sft.Segment`), split after every tool call; interpreter segments are the environment's
        part. A turn that calls the tool ends as the format's generation stops there; the last one, the answer,
        with `end_of_turn`."""
        turns: list[str] = []
        text: list[str] = []
        for segment in segments:
            if segment.kind == "code":
                body = "\n\n".join(text)
                call = (cls.call_glue if body else "") + cls.call_text(segment.content)
                turns.append(body + call + (end_of_turn if cls.call_ends_turn else ""))
                text = []
            elif segment.kind == "answer":
                text.append(cls.answer_text(segment.content))
            elif segment.kind == "text":
                text.append(segment.content)
        turns.append("\n\n".join(text) + end_of_turn)
        return turns


class ReToolFormat(ToolFormat):
    """The ReTool paper's inline format: `<code>` blocks, `<interpreter>` results, `<answer>` at the end."""

    name = "retool"
    default_prompt = "retool"
    call_glue = "\n\n"
    call_ends_turn = False
    tool_turns = False
    calls_in_reasoning = True  # the paper's model runs code while it reasons
    call_blocks = (("<code>", "</code>"),)

    @property
    def stop_strings(self) -> list[str]:
        return ["</code>"]

    def _parse_text(self, text: str, ended: bool) -> ParsedAction:
        stripped = text.rstrip()
        start = stripped.rfind("<code>")
        closed = stripped.endswith("</code>")
        if start < 0 or ended:  # as in the paper's loop, a turn the model ended itself is its final answer
            return ParsedAction((), complete=ended)
        body = stripped[start + len("<code>"):]
        if closed:
            body = body[: -len("</code>")]
        elif not body.rstrip().endswith("```"):  # an open block that is not a finished fence: cut off mid-code
            return ParsedAction((), complete=False, in_call=True)
        code = strip_code_fences(body)
        call = ToolCall(code) if code.strip() else ToolCall(None, "the code block is empty.")
        closing = () if closed else tuple(self.encode("</code>"))
        return ParsedAction((call,), closing_ids=closing)

    def observation_ids(self, outputs: list[str]) -> list[int]:
        """The `<interpreter>` block, its output encoded as untrusted text (no special token from model code)."""
        (output,) = outputs
        if not has_added_token_text(self.tokenizer, output):
            return self.encode(self.interpreter_text(output))
        before, after = self.interpreter_text("\x00").split("\x00")
        return [*self.encode(before), *encode_text(self.tokenizer, output.rstrip("\n")), *self.encode(after)]

    @classmethod
    def sft_conversation(cls, segments: Iterable[Any], question: str) -> dict[str, Any]:
        """One assistant string, `chunks` in order with a `trainable` flag, and the untrained spans. Interpreter
        output carries its surrounding newlines, `"\\n<interpreter>\\n...\\n</interpreter>\\n\\n"`, which is
        exactly what the environment inserts after `</code>`, so the trained text is what the model generates there."""
        pieces: list[tuple[str, bool]] = []
        for segment in segments:
            if segment.kind == "interpreter":
                pieces.append((cls.interpreter_text(segment.content), False))
                continue
            if pieces and pieces[-1][1]:  # blank line between model-written pieces
                pieces[-1] = (pieces[-1][0] + "\n\n", True)
            write = {"code": cls.call_text, "answer": cls.answer_text}.get(segment.kind, str)
            pieces.append((write(segment.content), True))
        chunks: list[dict[str, Any]] = []
        for text, trainable in pieces:
            if chunks and chunks[-1]["trainable"] == trainable:
                chunks[-1]["text"] += text
            else:
                chunks.append({"text": text, "trainable": trainable})
        content, masked_spans, start = "", [], 0
        for chunk in chunks:
            content += chunk["text"]
            if not chunk["trainable"]:
                masked_spans.append((start, len(content)))
            start = len(content)
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": content}]
        return {"messages": messages, "chunks": chunks, "masked_spans": masked_spans}

    @staticmethod
    def interpreter_text(output: str) -> str:
        """The interpreter's answer as the environment inserts it after `</code>`."""
        return "\n<interpreter>\n" + output.rstrip("\n") + "\n</interpreter>\n\n"

    @staticmethod
    def call_text(code: str) -> str:
        return f"<code>\n```python\n{code}\n```\n</code>"

    @staticmethod
    def answer_text(answer: str) -> str:
        return f"<answer>\n{answer}\n</answer>"


_CONTENT_PROBE = "<<retool-env-dummy>>"  # an assistant message's content, found again in the template's render


class DialectFormat(ToolFormat):
    """Tool calls in one of `retool_env.dialects` (hermes, qwen3_coder XML, gpt-oss harmony, Llama 3 JSON, GLM-4.5,
    ...), results as `tool` turns rendered by the tokenizer's chat template, the code interpreter the one tool.

    The template renders everything around the model's tokens: the call turn is given back to it as an assistant
    message with `tool_calls` (shaped as `tool_call_shape` finds the template reads them, or the model's text as
    content where the template drops `tool_calls`), and the tool turn is the difference of two renderings
    (`retool_env.chat.Conversation`), whatever role (`tool`, `ipython`) and grouping the template uses. A template
    that does not render `tools` gets them in the system prompt (`system_prompt`, from `tool_system_prompt`)."""

    default_prompt = "slime"
    call_glue = "\n"
    call_ends_turn = True
    tool_turns = True
    dialect: Dialect  # how calls are read and written, and where a turn's reasoning ends
    chat_template_kwargs: dict[str, Any]

    def __init__(self, tokenizer: Tokenizer, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        template = getattr(tokenizer, "chat_template", None)
        if not isinstance(template, str) or not template:
            raise ValueError(f"the {self.name} format renders tool results with the tokenizer's chat template, and "
                             "this tokenizer has none; set tokenizer.chat_template or use tool_format='retool'")
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.tokenizer = tokenizer
        added = set(tokenizer.get_added_vocab())
        names = [*self.dialect.end_tokens, *self.dialect.stop_strings, "<|im_end|>", "<|endoftext|>"]
        ends = [tokenizer.eos_token_id, *(tokenizer.convert_tokens_to_ids(t) for t in names if t in added)]
        self.end_token_ids = list(dict.fromkeys(i for i in ends if isinstance(i, int)
                                                and i != tokenizer.unk_token_id))
        if not self.end_token_ids:
            raise ValueError("the tokenizer has no end-of-turn token (eos_token or the dialect's end tokens)")
        # Stop strings that are not one token of this vocabulary stop generation as text.
        self._stop_strings = [s for s in self.dialect.stop_strings if s not in added]
        # How the template reads `tool_calls` (None: the call turn goes back to it as the model's text)
        self.shape = None if self.dialect.calls_as_text else tool_call_shape(template, self.dialect.name)
        self.system_prompt = (None if renders_tools(template) else
                              tool_system_prompt(self.dialect, [CODE_INTERPRETER_TOOL]))
        # A user turn after it, for templates whose next header ends the assistant's turn (GLM's <|user|>).
        head = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _CONTENT_PROBE},
                {"role": "user", "content": "v"}]
        head_text = self._render(head, add_generation_prompt=False)
        after_content = head_text[head_text.index(_CONTENT_PROBE) + len(_CONTENT_PROBE):].lstrip("\n")
        special = sorted(set(tokenizer.all_special_tokens) | added, key=len, reverse=True)
        turn_end = next((t for t in special if after_content.startswith(t)), None)
        if turn_end is None:
            raise ValueError(f"cannot find the end-of-turn token after an assistant message in the chat template "
                             f"(it renders {after_content[:40]!r})")
        self.turn_end: str = turn_end
        self.turn_end_id: int = self.encode(turn_end)[0]
        if self.turn_end_id not in self.end_token_ids:
            self.end_token_ids.append(self.turn_end_id)
        self._end_texts: dict[tuple[int, ...], str] = {}
        # A template that renders no tool result after a turn without `tool_calls` as after any turn (gpt-oss's
        # raises, GLM's drops the turn's end) is given a turn whose calls were not read as the calls it read.
        self._results_need_calls = self.shape is not None and not self._renders_results_after_text()
        self._call_ends = {self.turn_end_id, *(tokenizer.convert_tokens_to_ids(t) for t in self.dialect.stop_strings
                                               if t in added)}

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [CODE_INTERPRETER_TOOL]

    @property
    def stop_strings(self) -> list[str]:
        return list(self._stop_strings)

    def split_reasoning(self, text: str, opened: bool = False) -> tuple[str, str]:
        return self.dialect.split_reasoning(text, opened)

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The chat template's text of `messages`, with the tool and the template options of every render."""
        return ChatRenderer(self.tokenizer, self.tools, self.chat_template_kwargs).render(messages,
                                                                                           add_generation_prompt)

    def _renders_results_after_text(self) -> bool:
        messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _CONTENT_PROBE},
                    *self.tool_messages(["r"])]
        try:
            text = self._render(messages, add_generation_prompt=True)
        except Exception:  # the template's own refusal (jinja's raise_exception)
            return False
        return text[text.index(_CONTENT_PROBE) + len(_CONTENT_PROBE):].startswith(self.turn_end)

    def parse(self, action_ids: list[int], reasoning_open: bool = False) -> ParsedAction:
        """As `ToolFormat.parse`; a call turn the model ended with an end token the template does not put after
        calls (e.g. `<|endoftext|>`) gets the template's turn end appended."""
        ended = bool(action_ids) and action_ids[-1] in self.end_token_ids
        body = action_ids[:-1] if ended else action_ids
        text = decode(self.tokenizer, body)
        reasoning, content = self.split_reasoning(text, reasoning_open)
        parsed = self._parse_text(content, ended)
        if ended and parsed.tool_calls and action_ids[-1] not in self._call_ends and not parsed.closing_ids:
            parsed = parsed.replace(closing_ids=(self.turn_end_id,))
        end_ids = (*action_ids[-1:], *parsed.closing_ids) if ended else parsed.closing_ids
        end_text = self._end_texts.get(end_ids)
        if end_text is None:  # a few end tokens per format: decoded once each
            end_text = self._end_texts[end_ids] = decode(self.tokenizer, list(end_ids))
        return parsed.replace(text=text, content=content, end_text=end_text,
                              thinking=self._still_thinking(text, reasoning_open, reasoning))

    def _parse_text(self, text: str, ended: bool) -> ParsedAction:
        turn = self.dialect.parse(text, [CODE_INTERPRETER_TOOL])
        calls, function_calls = [], []  # function_calls: each call as the template renders it
        for call in turn.calls:
            calls.append(_tool_call(call))
            readable = call.ok and isinstance((call.arguments or {}).get("code"), str)
            function_calls.append(FunctionCall(call.name or TOOL_NAME, call.arguments or {}) if readable
                                  else FunctionCall(_rendered_name(call.name), {}))
        read = all(call.ok for call in turn.calls)
        if turn.unfinished:
            if not ended:  # cut off inside a call: the turn is unfinished, and no answer
                return ParsedAction(tuple(calls), complete=False, in_call=True)
            calls.append(ToolCall(None, self.dialect.fault("a tool call was opened but never closed",
                                                           [CODE_INTERPRETER_TOOL])))
            function_calls.append(FunctionCall(TOOL_NAME, {}))
            read = False
        # The message the template renders for this turn: its calls as `tool_calls` when every call was read (else
        # the model's text, unless the template renders no tool result after a turn without `tool_calls`: then the
        # calls as far as they were read, so a malformed call is answered, never a template error)
        message = None
        if self.shape is not None and calls and (read or self._results_need_calls):
            message = self.dialect.tool_call_message(turn.content if self.shape.content is not None
                                                     else None, function_calls,
                                                     arguments_as_string=self.shape.arguments_as_string)
        if ended:
            return ParsedAction(tuple(calls), tool_message=message)
        if calls:  # stopped at a stop string after the calls: close the turn as the template does
            stop = next((s for s in self.dialect.stop_strings), None)
            closing = tuple(self.encode(stop)) if stop else (self.turn_end_id,)
            return ParsedAction(tuple(calls), closing_ids=closing, tool_message=message)
        return ParsedAction((), complete=False)

    @classmethod
    def call_text(cls, code: str) -> str:
        return cls.dialect.call_text([FunctionCall(TOOL_NAME, {"code": code})])

    @classmethod
    def sft_conversation(cls, segments: Iterable[Any], question: str) -> dict[str, Any]:
        """OpenAI-style tool-calling messages (verl's layout) with `trainable` per message: assistant turns only.
        The trainer's chat template writes the calls in its own dialect."""
        messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
        text: list[str] = []
        for segment in segments:
            if segment.kind == "code":
                call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": segment.content}}}
                messages.append({"role": "assistant", "content": "\n\n".join(text), "tool_calls": [call]})
                text = []
            elif segment.kind == "interpreter":
                messages.append({"role": "tool", "content": segment.content})
            else:
                text.append(segment.content)
        if text:
            messages.append({"role": "assistant", "content": "\n\n".join(text)})
        return {"messages": messages, "tools": [CODE_INTERPRETER_TOOL],
                "trainable": [m["role"] == "assistant" for m in messages]}

    @staticmethod
    def tool_messages(outputs: list[str]) -> list[dict[str, Any]]:
        return [{"role": "tool", "name": TOOL_NAME, "tool_call_id": f"call_{i}", "content": output}
                for i, output in enumerate(outputs)]

    def observation_ids(self, outputs: list[str]) -> list[int]:
        """The tool turns as the template renders them after a one-call turn (the environment renders its real
        conversation instead, `retool_env.chat.Conversation`)."""
        conversation = Conversation(self.tokenizer, [{"role": "user", "content": "u"}], self.tools, self.turn_end,
                                    self.chat_template_kwargs)
        text = self.call_text("print(6 * 7)")
        parsed = self._parse_text(text, True)
        return conversation.after_tools(text, (), self.tool_messages(outputs), parsed.tool_message).appended


def _tool_call(call: ParsedCall) -> ToolCall:
    """The code a dialect's call runs (fences stripped), or why it runs none."""
    code = call.arguments.get("code") if call.ok and call.arguments else None
    if not isinstance(code, str):
        return ToolCall(None, call.error or f"{TOOL_NAME} needs the parameter 'code'")
    code = strip_code_fences(code)
    return ToolCall(code) if code.strip() else ToolCall(None, "the code is empty.")


def _rendered_name(name: str | None) -> str:
    """The name a malformed call is rendered under: the model's when it is a plain name, else the tool's."""
    plain = name is not None and 0 < len(name) <= 64 and name.replace("_", "a").replace(".", "a").replace(
        "-", "a").isalnum()
    return name if plain and name is not None else TOOL_NAME


@functools.cache
def dialect_format_class(dialect: str) -> type[DialectFormat]:
    """The ToolFormat class of a tool-call dialect (`retool_env.dialects`), named as the dialect."""
    found = get_dialect(dialect)
    return type(f"{type(found).__name__}Format", (DialectFormat,), {"name": found.name, "dialect": found})


FORMATS: dict[str, type[ToolFormat]] = {"retool": ReToolFormat}


def format_class(tool_format: str) -> type[ToolFormat]:
    """The ToolFormat class of a name (`retool`, or a dialect of `retool_env.dialects` such as hermes), for writing
    text in the format without a tokenizer."""
    if tool_format in FORMATS:
        return FORMATS[tool_format]
    try:
        return dialect_format_class(tool_format)
    except ValueError:
        raise ValueError(f"unknown tool_format {tool_format!r}; choose one of auto, "
                         f"{', '.join(sorted({*FORMATS, *DIALECTS}))}") from None


def resolve_tool_format(tool_format: str, tokenizer: Tokenizer) -> str:
    """The format `tool_format="auto"` means for this tokenizer: the dialect its chat template writes tool calls
    in (hermes when that is the `<tool_call>` JSON form, or when the template shows no tool-call syntax), and the
    paper's `retool` when the tokenizer has no chat template. Logged once per choice."""
    if tool_format != "auto":
        return tool_format
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        chosen, why = "retool", "the tokenizer has no chat template"
    else:
        try:
            chosen, why = detect_dialect(template), "the chat template writes tool calls in it"
        except ValueError:
            chosen, why = "hermes", "the chat template writes no tool-call syntax known here"
    _log_choice(chosen, why)
    return chosen


@functools.cache
def _log_choice(chosen: str, why: str) -> None:
    logger.info("tool_format='auto' chose %r: %s", chosen, why)


def make_format(tool_format: str | ToolFormat, tokenizer: Tokenizer,
                chat_template_kwargs: dict[str, Any] | None = None) -> ToolFormat:
    """The format of a name (`auto`: picked from the chat template, see `resolve_tool_format`) for `tokenizer`."""
    if isinstance(tool_format, ToolFormat):
        return tool_format
    cls = format_class(resolve_tool_format(tool_format, tokenizer))
    if issubclass(cls, DialectFormat):
        return cls(tokenizer, chat_template_kwargs)
    return cls(tokenizer)


def _moved(name: str) -> tuple[Any, str]:
    """A name this module no longer defines: (what stands in for it, where it is now)."""
    if name == "HermesFormat":
        return dialect_format_class("hermes"), 'retool_env.formats.format_class("hermes")'
    if name == "ChatTurnsFormat":
        return DialectFormat, "retool_env.formats.DialectFormat"
    if name == "prompt_messages":
        from retool_env.prompts import prompt_messages

        return prompt_messages, "retool_env.prompts.prompt_messages"
    if name == "MAX_CALLS_PER_TURN":
        from retool_env.dialects.base import MAX_CALLS

        return MAX_CALLS, "retool_env.dialects.base.MAX_CALLS"
    if name == "parse_hermes_call":
        return _parse_hermes_call, 'retool_env.dialects.get_dialect("hermes").parse'
    if name == "tool_call_blocks":
        return _tool_call_blocks, "retool_env.dialects.base.find_blocks"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __getattr__(name: str) -> Any:
    value, new = _moved(name)
    warnings.warn(f"retool_env.formats.{name} is deprecated and will be removed in the next release; use {new}",
                  DeprecationWarning, stacklevel=2)
    return value


def _parse_hermes_call(block: str) -> ToolCall:
    turn = get_dialect("hermes").parse(f"<tool_call>{block}</tool_call>", [CODE_INTERPRETER_TOOL])
    return _tool_call(turn.calls[0]) if turn.calls else ToolCall(None, "no tool call")


def _tool_call_blocks(text: str, open_tag: str = "<tool_call>", close_tag: str = "</tool_call>"
                      ) -> tuple[list[str], bool]:
    from retool_env.dialects.base import find_blocks

    found = [(body, closed) for _, body, closed in find_blocks(text, open_tag, close_tag) if body is not None]
    return [body for body, closed in found if closed], any(not closed for _, closed in found)
