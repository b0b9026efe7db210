"""Chat templates: choosing one, and templates that rewrite history (episode and turn sample modes)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from retool_env import EnvConfig, Problem, ToolEnvironment
from retool_env.chat import chat_template_names, resolve_chat_template, with_chat_template
from retool_env.formats import CODE_INTERPRETER_TOOL, encode

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
THINK_WHEN_LAST = str(TEMPLATES / "think_when_last.jinja")  # like Qwen3: an empty think block only on the last turn
STRIP_REASONING = str(TEMPLATES / "strip_reasoning.jinja")  # like DeepSeek-R1-Distill: reasoning dropped in history
PROBLEM = Problem("What is 6 * 7?", "42", id="p")


def call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


def play(env: ToolEnvironment, turns: list[str]) -> list[tuple]:
    """Step the model turns (text, then the end token) with logprob -1 each; return what each step returned."""
    env.reset(options={"problem": PROBLEM})
    end = env.format.turn_end_id
    steps = []
    for text in turns:
        action = [*encode(env.tokenizer, text), end]
        steps.append(env.step({"token_ids": action, "logprobs": [-1.0] * len(action)}))
    assert steps[-1][2] or steps[-1][3]
    return steps


def rendered(tok, messages) -> list[int]:
    return encode(tok, tok.apply_chat_template(messages, tools=[CODE_INTERPRETER_TOOL], tokenize=False,
                                               add_generation_prompt=True))


def assert_contexts_are_the_templates(env: ToolEnvironment, turns: list[str]) -> None:
    """Each turn's context in its sample is exactly the template's rendering of the conversation before the turn,
    the model's tokens follow verbatim (mask 1, their logprobs), and masks and logprobs line up."""
    tok, traj = env.tokenizer, env.trajectory
    messages = env._conversation.messages
    assistant_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"] + [len(messages)]
    samples = traj.samples
    assert sorted(i for s in samples for i in s.turns) == list(range(len(turns)))
    for k, turn in enumerate(traj.turns):
        sample = samples[turn.sample]
        assert sample.prompt_ids + sample.completion_ids[:turn.start] == rendered(tok, messages[:assistant_at[k]])
        assert tok.decode(sample.completion_ids[turn.start:turn.end]) == turns[k] + env.format.turn_end
        assert set(sample.env_mask[turn.start:turn.end]) == {1}
        assert set(sample.logprobs[turn.start:turn.end]) == {-1.0}
    for sample in samples:
        assert len(sample.completion_ids) == len(sample.env_mask) == len(sample.logprobs)
        assert all(lp == 0.0 for lp, m in zip(sample.logprobs, sample.env_mask, strict=True) if not m)
        assert sample.reward == traj.reward
    assert traj.num_model_tokens == sum(len(encode(tok, t)) + 1 for t in turns)


THINK = "<think>\nI should compute it.\n</think>\n\n"
EMPTY_THINK = "<think>\n\n</think>\n\n"


# ---------------------------------------------------------------------------------------------- choosing one
def test_chat_template_by_name_path_or_text(qwen_tok, tmp_path):
    shipped = resolve_chat_template("qwen3_instruct_2507")
    assert shipped == qwen_tok.chat_template and "qwen3_instruct_2507" in chat_template_names()
    assert resolve_chat_template(THINK_WHEN_LAST) == Path(THINK_WHEN_LAST).read_text()
    assert resolve_chat_template("{{ messages[0].content }}") == "{{ messages[0].content }}"
    with pytest.raises(ValueError, match=r"known names: .*qwen3_instruct_2507"):
        resolve_chat_template("no-such-template")
    tok = with_chat_template(qwen_tok, STRIP_REASONING)
    assert tok.chat_template != qwen_tok.chat_template == shipped  # the caller's tokenizer keeps its own
    assert with_chat_template(qwen_tok, None) is qwen_tok


def test_environment_renders_with_the_chosen_template(qwen_tok):
    env = ToolEnvironment(qwen_tok, [PROBLEM], **EnvConfig(chat_template=STRIP_REASONING))
    prompt, _ = env.reset()
    assert qwen_tok.decode(prompt).endswith("<|im_start|>assistant\n<think>\n")
    with pytest.raises(ValueError, match="sample_mode"):
        ToolEnvironment(qwen_tok, [PROBLEM], sample_mode="per-turn")


# ------------------------------------------------------------------------- templates that rewrite history
def test_a_template_that_keeps_history_is_one_sample(qwen_tok):
    """Qwen3-like with reasoning on every turn: nothing is rewritten, so the episode is one exact sample."""
    turns = [THINK + call("print(6 * 7)"), THINK + call("print(7 * 6)"), THINK + "\\boxed{42}"]
    env = ToolEnvironment(qwen_tok, [PROBLEM], chat_template=THINK_WHEN_LAST, sample_mode="turn")
    steps = play(env, turns)
    assert len(env.trajectory.samples) == 1 and not any(info["new_sample"] for *_, info in steps)
    assert env.trajectory.reward == 1.0
    assert_contexts_are_the_templates(env, turns)


def test_turn_mode_starts_a_sample_where_the_template_drops_an_empty_think_block(qwen_tok):
    turns = [EMPTY_THINK + call("print(6 * 7)"), THINK + call("print(7 * 6)"), THINK + "\\boxed{42}"]
    env = ToolEnvironment(qwen_tok, [PROBLEM], chat_template=THINK_WHEN_LAST, sample_mode="turn")
    steps = play(env, turns)
    traj = env.trajectory
    assert [info["new_sample"] for *_, info in steps] == [True, False, False]
    assert [s.turns for s in traj.samples] == [[0], [1, 2]]  # the append-only turns after the rewrite merge
    assert steps[0][0].tolist() == traj.samples[1].prompt_ids  # the observation is the whole new context
    assert EMPTY_THINK not in qwen_tok.decode(traj.samples[1].prompt_ids)
    assert traj.prompt_ids == traj.samples[1].prompt_ids and traj.rewritten_turns == 0
    assert_contexts_are_the_templates(env, turns)


def test_episode_mode_keeps_one_sample_and_says_the_template_rewrote_history(qwen_tok):
    turns = [EMPTY_THINK + call("print(6 * 7)"), THINK + "\\boxed{42}"]
    env = ToolEnvironment(qwen_tok, [PROBLEM], chat_template=THINK_WHEN_LAST)
    with pytest.warns(UserWarning, match=r"rewrote an earlier turn.*qwen3_training.*sample_mode=.turn."):
        play(env, turns)
    traj = env.trajectory
    assert len(traj.samples) == 1 and traj.rewritten_turns == 1
    # The token stream is what the model saw in this rollout: its turn verbatim, then the tool turn as rendered.
    text = qwen_tok.decode(traj.prompt_ids + traj.completion_ids)
    assert EMPTY_THINK + "<tool_call>" in text and "<tool_response>\n42\n" in text


def test_turn_mode_with_a_template_that_strips_reasoning(qwen_tok):
    """R1-like: each turn's reasoning vanishes from history, so every tool call starts a new sample."""
    turns = ["Compute it.\n</think>\n\n" + call("print(6 * 7)"), "Check.\n</think>\n\n" + call("print(7 * 6)"),
             "Done.\n</think>\n\n\\boxed{42}"]
    env = ToolEnvironment(qwen_tok, [PROBLEM], chat_template=STRIP_REASONING, sample_mode="turn", render_mode="ansi")
    play(env, turns)
    traj = env.trajectory
    assert [s.turns for s in traj.samples] == [[0], [1], [2]] and traj.reward == 1.0
    assert "Compute it." not in qwen_tok.decode(traj.samples[2].prompt_ids)
    assert_contexts_are_the_templates(env, turns)
    assert env.render().count("=== context rewritten by the chat template ===") == 2
    data = traj.to_dict()
    assert len(data["earlier_samples"]) == 2


# ------------------------------------------------------------------------ the paper's format, thinking model
def test_retool_format_with_thinking_keeps_exact_masks(qwen_tok):
    """`<code>` inside a think block and after it: interpreter output is mask 0, the rest is the model's, and the
    episode's text is the template's rendering of one assistant turn (token boundaries at `</code>` are the
    generator's, as in deployment: the interpreter's text is inserted into the same turn)."""
    env = ToolEnvironment(qwen_tok, [PROBLEM], tool_format="retool", chat_template=THINK_WHEN_LAST)
    prompt, _ = env.reset(options={"problem": PROBLEM})
    pieces = ["<think>\nLet me check with code.\n<code>\n```python\nprint(6 * 7)\n```\n</code>",
              "\nSo 42.\n</think>\n\n<code>\n```python\nprint(7 * 6)\n```\n</code>",
              "\n<answer>\n\\boxed{42}\n</answer><|im_end|>"]
    for piece in pieces:
        env.step(encode(qwen_tok, piece))
    traj = env.trajectory
    assert traj.reward == 1.0 and traj.num_tool_calls == 2 and len(traj.samples) == 1
    model = [t for t, m in zip(traj.completion_ids, traj.env_mask, strict=True) if m]
    assert model == [t for piece in pieces for t in encode(qwen_tok, piece)]
    inserted = qwen_tok.decode([t for t, m in zip(traj.completion_ids, traj.env_mask, strict=True) if not m])
    assert inserted == 2 * "\n<interpreter>\n42\n</interpreter>\n\n"
    content = qwen_tok.decode(traj.completion_ids[:-1])
    messages = [*env.prompt.messages(PROBLEM.question), {"role": "assistant", "content": content}]
    full = qwen_tok.apply_chat_template(messages, tokenize=False)
    assert full == qwen_tok.decode(traj.prompt_ids + traj.completion_ids) + "\n"


def test_config_round_trip_keeps_the_new_fields():
    config = EnvConfig(chat_template="qwen3", sample_mode="turn")
    assert dict(**config)["chat_template"] == "qwen3" and copy.copy(config).sample_mode == "turn"
