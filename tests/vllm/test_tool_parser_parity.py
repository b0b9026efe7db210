"""The dialects read model turns as vLLM 0.32's own tool parsers do, call by call (names and typed arguments).

Runs only in .venv-vllm (scripts/test_vllm.sh); elsewhere it skips. For each dialect with a vLLM parser, a few
hundred turns (`tests.vllm.tool_parser_cases`: hand-written edge cases, then generated calls) are parsed by the
dialect and by vLLM's real parser, on Qwen's vocabulary with every dialect's markup tokens added. A turn agrees when
both read the same calls, or when vLLM reads none and the environment answers at least one with an error. The only
other differences allowed are the refusal table of docs/environment.md, each checked here by what it says.
`openai` (harmony) is read by vLLM's `HarmonyParser` from the token ids of `openai_harmony`'s own encoding (the
`oss-harmony` build vLLM installs carries o200k's vocabulary, so it runs offline).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

pytest.importorskip("vllm", reason="needs the vLLM environment: scripts/test_vllm.sh (.venv-vllm)")

from retool_env.dialects import get_dialect
from retool_env.offline import qwen_tokenizer
from tests.vllm.tool_parser_cases import EDGE_CASES, HARMONY_CONTENT, TOOLS, turns

COMPARED = ["hermes", "qwen3_coder", "llama3_json", "mistral", "glm45", "kimi_k2", "deepseek_v3", "deepseek_v31",
            "lfm2", "pythonic", "gemma4", "openai"]
MARKUP = ["<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<tool_call>", "</tool_call>",
          "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
          "<｜tool▁sep｜>",
          "<|tool_call_start|>", "<|tool_call_end|>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
          "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call>", "<tool_call|>", '<|"|>',
          "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<|python_start|>", "<|python_end|>"]
# Mistral's list forms before tokenizer v11: vLLM reads them only with a pre-v11 Mistral tokenizer (with any other it
# reads v11 calls), so they are checked against the calls they write, not against vLLM.
MISTRAL_PRE_V11 = {
    '[TOOL_CALLS][{"name": "search", "arguments": {"query": "q"}}]': [("search", {"query": "q"})],
    '[TOOL_CALLS][{"name": "search", "arguments": {"query": "a"}}][TOOL_CALLS][{"name": "search", '
    '"arguments": {"query": "b"}}]': [("search", {"query": "a"}), ("search", {"query": "b"})],
    '[TOOL_CALLS]{"name": "search", "arguments": {"query": "bare object"}}': [("search", {"query": "bare object"})],
    '[TOOL_CALLS][{"name": "search", "arguments": {"query": "ok"}}, {"junk": 1}]': [("search", {"query": "ok"})],
}


@pytest.fixture(scope="module")
def request_and_tokenizer():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    tok = copy.deepcopy(qwen_tokenizer())
    known = set(tok.get_added_vocab())
    tok.add_special_tokens({"additional_special_tokens": [t for t in MARKUP if t not in known]})
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "u"}], tools=TOOLS)
    return request, tok


class HarmonyReader:
    """vLLM's `HarmonyParser` (what `--tool-call-parser openai` serves gpt-oss with), fed a turn's harmony token ids."""

    def __init__(self, request) -> None:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding
        from vllm.parser.parser_manager import ParserManager

        self.encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        self.parser_class = ParserManager.get_parser(tool_parser_name="openai", reasoning_parser_name="openai_gptoss",
                                                     enable_auto_tools=True, is_harmony=True)
        self.request = request

    def decode(self, ids, **kwargs) -> str:  # the tokenizer the parser decodes a cut-off message with
        return self.encoding.decode(ids)

    def get_vocab(self) -> dict:
        return {}

    def parse(self, text: str) -> tuple[str | None, list[tuple[str, Any]]]:
        parser = self.parser_class(self, self.request.tools)
        ids = self.encoding.encode(text, allowed_special="all")
        _, content, calls = parser.parse(text, self.request, True, ids)
        return content, [(call.name, _decoded(call.arguments) or call.arguments) for call in calls or []]


def vllm_parser(dialect: str, request, tok):
    from vllm.tool_parsers import ToolParserManager

    if dialect == "openai":
        return HarmonyReader(request)
    parser_class = ToolParserManager.get_tool_parser(dialect)
    try:
        return parser_class(tok, request.tools)
    except TypeError:  # parsers that take the tokenizer alone
        return parser_class(tok)


def vllm_calls(parser, request, text: str) -> list[tuple[str, Any]]:
    if isinstance(parser, HarmonyReader):
        return parser.parse(text)[1]
    result = parser.extract_tool_calls(text, request)
    if not result.tools_called:
        return []
    return [(call.function.name, json.loads(call.function.arguments)) for call in result.tool_calls]


def _scalars_in_arrays_as_text(value: Any, in_array: bool = False) -> Any:
    if isinstance(value, dict):
        return {k: _scalars_in_arrays_as_text(v, in_array) for k, v in value.items()}
    if isinstance(value, list):
        return [_scalars_in_arrays_as_text(v, True) for v in value]
    return json.dumps(value) if in_array and not isinstance(value, str) else value


def _decoded(arguments: Any) -> Any:
    """Arguments vLLM passed on as a JSON string, decoded (None when they are not one)."""
    try:
        return json.loads(arguments) if isinstance(arguments, str) else None
    except json.JSONDecodeError:
        return None


def documented_difference(dialect: str, text: str, ours: list, theirs: list) -> str | None:
    """The refusal-table row that covers this turn, if any (docs/environment.md, "Where the environment reads a
    call differently from vLLM")."""
    if len(ours) == len(theirs) and all(a == b or (a[0] == b[0] and _decoded(b[1]) == a[1])
                                        for a, b in zip(ours, theirs, strict=True)):
        return "arguments written as a JSON string holding the object are decoded"
    readable = [call for call in theirs if not isinstance(call[1], str)]
    if len(readable) < len(theirs) and ours == readable:
        return "arguments that are not valid JSON, or cut off, are refused (vLLM passes the text on)"
    if dialect == "gemma4" and [(n, _scalars_in_arrays_as_text(a)) for n, a in ours] == theirs:
        return "gemma4: numbers and literals inside arrays are typed (vLLM reads them as text)"
    if dialect in ("glm45", "qwen3_coder") and ("</tool_call> inside" in text or "print('</function>')" in text):
        return f"{dialect}: a value that holds the block's closing markup is cut there"
    return None


@pytest.mark.parametrize("dialect", COMPARED)
def test_each_turn_is_read_as_vllm_reads_it(dialect, request_and_tokenizer):
    request, tok = request_and_tokenizer
    parser, ours_dialect = vllm_parser(dialect, request, tok), get_dialect(dialect)
    cases = [t for t in turns(dialect) if t not in MISTRAL_PRE_V11]
    if dialect == "openai":  # the generation prompt ends with `<|start|>assistant`: the turn starts in the header
        cases = [t.removeprefix("<|start|>assistant") for t in cases]
    disagreements, documented = [], 0
    for text in cases:
        turn = ours_dialect.parse(text, TOOLS)
        ours = [(call.name, call.arguments) for call in turn.calls if call.ok]
        theirs = vllm_calls(parser, request, text)
        if ours == theirs or (not theirs and any(not call.ok for call in turn.calls)):
            continue
        if documented_difference(dialect, text, ours, theirs):
            documented += 1
            continue
        disagreements.append((text[:200], ours, theirs))
    assert not disagreements, f"{len(disagreements)} of {len(cases)} turns read differently: {disagreements[:3]}"
    assert documented <= len(cases) // 2, "most turns differ by a documented rule: the cases test too little"


def test_harmony_content_is_read_as_vllm_reads_it(request_and_tokenizer):
    """Preambles and final messages, a final header cut off before `<|message|>`: the same content as vLLM's."""
    reader, openai = HarmonyReader(request_and_tokenizer[0]), get_dialect("openai")
    for text in HARMONY_CONTENT:
        theirs = (reader.parse(text)[0] or "").removesuffix("<|return|>")
        assert openai.parse(text, TOOLS).content == theirs, text


def test_mistral_pre_v11_lists_and_bare_objects_are_read():
    mistral = get_dialect("mistral")
    for text, calls in MISTRAL_PRE_V11.items():
        assert [(c.name, c.arguments) for c in mistral.parse(text, TOOLS).calls if c.ok] == calls


def test_the_edge_cases_cover_every_class_of_the_issue():
    """Each dialect's hand-written turns are compared above; these are the classes vLLM read and the environment
    refused before (issue 46), read alike now."""
    assert {"hermes", "qwen3_coder", "llama3_json", "mistral"} <= set(EDGE_CASES)
    qwen = get_dialect("qwen3_coder")
    typed = [qwen.parse(text, TOOLS).calls[0].arguments for text in EDGE_CASES["qwen3_coder"][:5]]
    assert [t.get("page", t.get("ratio", t.get("limit"))) for t in typed] == [5, 0.5, None, 3, None]
