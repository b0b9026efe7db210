"""ReTool-SFT: raw and verl-processed rows parse to the same segments; renderers keep interpreter output untrained."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from retool_env.data import SFTExample, load_retool_sft, parse_retool_sft, render_sft, to_hermes, to_retool

DATA = Path(__file__).parent / "fixtures" / "data" / "retool"
RAW = DATA / "train_2000.parquet"
VERL = DATA / "retool-sft_verl.jsonl"


def verl_rows() -> list[dict]:
    return [json.loads(line) for line in VERL.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def raw_examples() -> list[SFTExample]:
    return load_retool_sft(RAW)


def test_raw_schema_is_one_user_instruction_and_one_assistant_string():
    rows = pq.read_table(RAW).to_pylist()
    assert pq.read_table(RAW).column_names == ["messages"]
    for row in rows:
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"]
        assert "*user question:*" in row["messages"][0]["content"]
        assert "<interpreter>" in row["messages"][1]["content"]


def test_raw_and_verl_rows_parse_to_the_same_example(raw_examples):
    processed = load_retool_sft(VERL)
    assert [e.question for e in raw_examples] == [e.question for e in processed]
    assert [e.segments for e in raw_examples] == [e.segments for e in processed]


def test_question_is_the_raw_problem(raw_examples):
    for example, row in zip(raw_examples, verl_rows(), strict=True):
        assert row["messages"][0]["content"].startswith(example.question)
        for boilerplate in ("*user question:*", "Remember to place", "Solve the following", "<answer>"):
            assert boilerplate not in example.question
    assert raw_examples[0].question.endswith("nor an Eglish class?")


def test_segments_follow_the_trajectory(raw_examples):
    first = raw_examples[0]
    kinds = [s.kind for s in first.segments]
    assert kinds[-1] == "answer" and first.segments[-1].content == "\\boxed{3}"
    assert [s.content for s in first.segments if s.kind == "interpreter"] == ["3", "149"]
    for example in raw_examples:
        for i, segment in enumerate(example.segments):
            assert segment.trainable == (segment.kind != "interpreter")
            if segment.kind == "code":
                assert "```" not in segment.content and "<code>" not in segment.content
                compile(segment.content, example.id, "exec")
                assert example.segments[i + 1].kind == "interpreter"


def test_retool_rendering_masks_exactly_the_interpreter_blocks(raw_examples):
    raw_rows = pq.read_table(RAW).to_pylist()
    for example, row in zip(raw_examples, raw_rows, strict=True):
        conversation = to_retool(example)
        user, assistant = conversation["messages"]
        assert user == {"role": "user", "content": example.question}
        content = assistant["content"]
        assert content == row["messages"][1]["content"]  # the canonical layout round-trips
        assert content == "".join(chunk["text"] for chunk in conversation["chunks"])
        spans = conversation["masked_spans"]
        outputs = [s.content for s in example.segments if s.kind == "interpreter"]
        assert len(spans) == len(outputs)
        for (start, end), output in zip(spans, outputs, strict=True):
            assert content[start:end] == f"\n<interpreter>\n{output}\n</interpreter>\n\n"
        trained = "".join(c["text"] for c in conversation["chunks"] if c["trainable"])
        assert "<interpreter>" not in trained
        assert trained.count("<code>") == sum(s.kind == "code" for s in example.segments)
        assert trained.rstrip().endswith(f"<answer>\n{example.segments[-1].content}\n</answer>")


def test_hermes_rendering_reproduces_verls_conversion(raw_examples):
    for example, row in zip(raw_examples, verl_rows(), strict=True):
        conversation = to_hermes(example)
        messages, expected = conversation["messages"], row["messages"]
        assert [m["role"] for m in messages] == [m["role"] for m in expected]
        assert conversation["trainable"] == [m["role"] == "assistant" for m in messages]
        for mine, theirs in zip(messages[1:], expected[1:], strict=True):
            if mine["role"] == "tool":
                assert mine["content"] == theirs["content"]
            elif "tool_calls" in theirs:
                assert mine["content"] == theirs["content"]
                assert mine["tool_calls"] == theirs["tool_calls"]
        final, theirs = messages[-1]["content"], expected[-1]["content"]
        assert final.split() == theirs.split()  # same words; verl leaves extra blank lines before the box
        assert conversation["tools"][0]["function"]["name"] == "code_interpreter"


def test_hermes_conversation_renders_with_a_chat_template(raw_examples, tiny_tok):
    conversation = to_hermes(raw_examples[0])
    text = tiny_tok.apply_chat_template(conversation["messages"], tools=conversation["tools"], tokenize=False)
    assert "<tool_call>" in text and "<tool_response>" in text and "print(students_neither)" in text


def test_openai_style_string_arguments_parse_too():
    row = verl_rows()[1]
    for message in row["messages"]:
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    example = parse_retool_sft(row)
    assert example == load_retool_sft(VERL)[1]


def test_prompt_override_formats_and_round_trip(raw_examples):
    example = raw_examples[1]
    assert render_sft(example, "hermes", prompt="P")["messages"][0]["content"] == "P"
    assert render_sft(example)["messages"][1] == to_retool(example)["messages"][1]
    with pytest.raises(ValueError, match="unknown tool format"):
        render_sft(example, "xml")
    assert SFTExample.from_dict(json.loads(json.dumps(example.to_dict()))) == example


def test_limit_and_unknown_source():
    assert len(load_retool_sft(RAW, limit=1)) == 1
    with pytest.raises(FileNotFoundError):
        load_retool_sft("no/such/ReTool-SFT.parquet")


def test_retool_eval_prompt_lead_is_stripped_too():
    """The official eval template adds a line after "*user question:*"; the problem alone must remain."""
    instruction = pq.read_table(RAW).to_pylist()[1]["messages"][0]["content"]
    lead = "*user question:*\nAnswer the following Math Problem and put the answer in the format of \\boxed{answer}\n\n"
    row = {"messages": [{"role": "user", "content": instruction.replace("*user question:*\n", lead)},
                        {"role": "assistant", "content": "<answer>\n\\boxed{34}\n</answer>"}]}
    example = parse_retool_sft(row)
    assert example.question == load_retool_sft(RAW)[1].question
    assert [(s.kind, s.content) for s in example.segments] == [("answer", "\\boxed{34}")]
