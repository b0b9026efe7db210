"""ReTool-SFT cold-start data: parse trajectories into neutral segments, render them per tool format with loss flags.

ReTool-SFT stores each trajectory as one assistant string interleaving reasoning, `<code>` blocks, `<interpreter>`
outputs and a final `<answer>`; verl's preprocessing turns it into tool-calling messages. Both parse into the same
`Segment` list, and each renderer says which characters or messages are trained: interpreter output never is, since
the model did not write it (the ReTool paper masks it from the loss).

For training, `retool_env.coldstart` replays these segments through the environment itself
(`retool_sft_solutions`, `build_coldstart`), so SFT tokens and loss masks are exactly those of an RL trajectory; the
renderers below produce message-level data for frameworks that tokenize conversations themselves.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from retool_env.data.loaders import HubDataset, hub_rows, local_rows, question_id
from retool_env.data.text import strip_retool_template
from retool_env.formats import DialectFormat, ReToolFormat, format_class, strip_code_fences

SegmentKind = Literal["text", "code", "interpreter", "answer"]
RETOOL_SFT = HubDataset("ReTool-SFT", "JoeYing/ReTool-SFT", "train", local_name="train_2000.parquet")
_BLOCK = re.compile(r"<(code|interpreter|answer)>(.*?)</\1>", re.DOTALL)
_LAST_BOXED = re.compile(r"\\boxed\{(?!.*\\boxed\{).*\Z", re.DOTALL)


@dataclass(frozen=True)
class Segment:
    """One piece of a trajectory: model text, model code, interpreter output (not the model's), or the final answer."""

    kind: SegmentKind
    content: str

    @property
    def trainable(self) -> bool:
        return self.kind != "interpreter"


@dataclass(frozen=True)
class SFTExample:
    """A parsed cold-start trajectory: the raw problem and the assistant's segments in order."""

    question: str
    segments: tuple[Segment, ...]
    id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "question": self.question,
                "segments": [{"kind": s.kind, "content": s.content} for s in self.segments]}

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> SFTExample:
        return cls(row["question"], tuple(Segment(s["kind"], s["content"]) for s in row["segments"]), row.get("id", ""))


def _code(body: str) -> str:
    """The Python of a `<code>` body or tool call: without its markdown fence and surrounding newlines."""
    return strip_code_fences(body).strip("\n")


def parse_assistant_text(text: str) -> list[Segment]:
    """Segments of one ReTool assistant string: text between tags, `<code>`, `<interpreter>` and `<answer>` blocks."""
    segments: list[Segment] = []
    position = 0
    for match in _BLOCK.finditer(text):
        _append_text(segments, text[position:match.start()])
        kind, body = cast(SegmentKind, match.group(1)), match.group(2)
        segments.append(Segment(kind, _code(body) if kind == "code" else body.strip()))
        position = match.end()
    _append_text(segments, text[position:])
    return segments


def _append_text(segments: list[Segment], text: str) -> None:
    if text.strip():
        segments.append(Segment("text", text.strip()))


def _split_final_answer(text: str) -> list[Segment]:
    """verl's final message lost its `<answer>` tags: the trailing last `\\boxed{...}` becomes the answer again."""
    match = _LAST_BOXED.search(text)
    segments: list[Segment] = []
    _append_text(segments, text[:match.start()] if match else text)
    return segments + ([Segment("answer", match.group().strip())] if match else [])


def parse_retool_sft(row: dict[str, Any]) -> SFTExample:
    """One ReTool-SFT row, raw (user + one assistant string) or verl-processed (tool-calling messages)."""
    messages = list(row["messages"])
    question = strip_retool_template(next(m["content"] for m in messages if m["role"] == "user"))
    replies = [m for m in messages if m["role"] != "user" and m["role"] != "system"]
    segments: list[Segment] = []
    if len(replies) == 1 and not replies[0].get("tool_calls"):
        segments = parse_assistant_text(replies[0]["content"] or "")
    else:
        for i, message in enumerate(replies):
            content = message.get("content") or ""
            if message["role"] == "tool":
                segments.append(Segment("interpreter", content.strip()))
                continue
            calls = message.get("tool_calls") or []
            if not calls and i == len(replies) - 1 and "<answer>" not in content:
                segments += _split_final_answer(content)
                continue
            segments += parse_assistant_text(content)
            segments += [Segment("code", _code(_call_code(call))) for call in calls]
    return SFTExample(question, tuple(segments), str(row.get("id") or question_id(question)))


def _call_code(call: dict[str, Any]) -> str:
    arguments = call["function"]["arguments"]
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    return arguments["code"]


def load_retool_sft(source: str | os.PathLike[str] = "JoeYing/ReTool-SFT",
                    limit: int | None = None) -> list[SFTExample]:
    """ReTool-SFT examples from a local .parquet, .jsonl or .json file or folder, or the Hub (offline: a local file)."""
    path = Path(source).expanduser()
    rows: Iterator[dict[str, Any]]
    if path.exists():
        rows = local_rows(path, None)
    elif os.fspath(source) in (RETOOL_SFT.hub_id, "retool-sft"):
        rows = hub_rows(RETOOL_SFT, None, "load_retool_sft")
    else:
        raise FileNotFoundError(f"{os.fspath(source)!r} is neither a local file or folder nor {RETOOL_SFT.hub_id!r}")
    examples: list[SFTExample] = []
    for row in rows:
        if limit is not None and len(examples) >= limit:
            break
        examples.append(parse_retool_sft(row))
    return examples


# --- renderers ---------------------------------------------------------------------------------------------------


def to_retool(example: SFTExample, prompt: str | None = None) -> dict[str, Any]:
    """The paper's format: one assistant string, `chunks` in order with a `trainable` flag, and the untrained spans
    (`ReToolFormat.sft_conversation`)."""
    return ReToolFormat.sft_conversation(example.segments, prompt or example.question)


def to_hermes(example: SFTExample, prompt: str | None = None) -> dict[str, Any]:
    """OpenAI-style tool-calling messages (verl's layout) with `trainable` per message: assistant turns only
    (`DialectFormat.sft_conversation`)."""
    return DialectFormat.sft_conversation(example.segments, prompt or example.question)


def render_sft(example: SFTExample, tool_format: str = "retool", prompt: str | None = None) -> dict[str, Any]:
    """An SFT conversation in a tool format (its `sft_conversation`: retool or hermes); `prompt` replaces the raw
    question as user text."""
    try:
        format_ = format_class(tool_format)
    except ValueError as exc:
        raise ValueError(f"unknown tool format {tool_format!r}: {exc}") from None
    return format_.sft_conversation(example.segments, prompt or example.question)
