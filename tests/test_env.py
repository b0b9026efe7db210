"""Unit tests of environment transitions, with the tiny tokenizer and with Qwen's real one (`any_tok`)."""

from __future__ import annotations

import asyncio
import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import retool_env  # noqa: F401 (registers the env ids)
from retool_env import Problem, ToolEnvironment
from retool_env.formats import CODE_INTERPRETER_TOOL

PROBLEMS = [Problem("What is 123 * 456?", "56088", id="p0"), Problem("What is 6 * 7?", "42", id="p1")]


def make_env(tok, **kwargs) -> ToolEnvironment:
    kwargs.setdefault("dataset", PROBLEMS)
    return ToolEnvironment(tok, **kwargs)


def ids(tok, text: str, end: bool = True) -> list[int]:
    return tok.encode(text, add_special_tokens=False) + ([tok.convert_tokens_to_ids("<|im_end|>")] if end else [])


def call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


def render(tok, messages, **kw) -> list[int]:
    return list(tok.apply_chat_template(messages, tools=[CODE_INTERPRETER_TOOL], tokenize=True, return_dict=False,
                                        **kw))


def assistant_action(tok, messages, message) -> list[int]:
    """The tokens a model would generate for `message`: its rendering after the generation prompt."""
    before = render(tok, messages, add_generation_prompt=True)
    after = render(tok, [*messages, message])
    assert after[: len(before)] == before
    action = after[len(before):]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    return action[: action.index(end) + 1]


# ------------------------------------------------------------------------------------------- hermes, exactness
def test_hermes_episode_equals_chat_template(any_tok):
    tok = any_tok
    env = make_env(tok, prompt="slime")
    prompt_ids, info = env.reset(options={"index": 0})
    messages = env.prompt.messages(PROBLEMS[0].question)
    assert prompt_ids.tolist() == render(tok, messages, add_generation_prompt=True)
    assert info["stop_token_ids"] and info["max_new_tokens"] == env.config.max_completion_tokens

    first = {"role": "assistant", "content": "Let me compute it.",
             "tool_calls": [{"type": "function", "function": {"name": "code_interpreter",
                                                              "arguments": {"code": "print(123 * 456)"}}}]}
    action1 = assistant_action(tok, messages, first)
    obs, reward, terminated, truncated, info = env.step(action1)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["tool_results"][0]["status"] == "ok" and "56088" in info["tool_results"][0]["output"]
    messages += [first, {"role": "tool", "name": "code_interpreter", "content": info["tool_results"][0]["output"]}]

    final = {"role": "assistant", "content": "So the product is \\boxed{56088}."}
    action2 = assistant_action(tok, messages, final)
    assert prompt_ids.tolist() + action1 + obs.tolist() == render(tok, messages, add_generation_prompt=True)
    obs, reward, terminated, truncated, info = env.step(action2)
    assert obs.size == 0 and terminated and not truncated
    assert reward == 1.0 and info["correct"] and info["finish_reason"] == "answer"

    traj = env.trajectory
    expected = render(tok, [*messages, final])
    assert traj.prompt_ids + traj.completion_ids == expected[: len(traj.prompt_ids) + len(traj.completion_ids)]
    assert traj.env_mask == [1] * len(action1) + [0] * obs_len(action1, action2, traj) + [1] * len(action2)
    assert traj.num_tool_calls == 1 and traj.num_turns == 2


def obs_len(action1, action2, traj) -> int:
    return len(traj.completion_ids) - len(action1) - len(action2)


def test_several_calls_in_one_turn_render_as_several_tool_messages(any_tok):
    tok = any_tok
    env = make_env(tok)
    env.reset(options={"index": 1})
    messages = env.prompt.messages(PROBLEMS[1].question)
    turn = {"role": "assistant", "content": "Two checks.", "tool_calls": [
        {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}},
        {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": "print(7 * 6)"}}}]}
    action = assistant_action(tok, messages, turn)
    obs, *_, info = env.step(action)
    outputs = [r["output"] for r in info["tool_results"]]
    assert [r["status"] for r in info["tool_results"]] == ["ok", "ok"] and all("42" in o for o in outputs)
    tool_msgs = [{"role": "tool", "name": "code_interpreter", "content": o} for o in outputs]
    expected = render(tok, [*messages, turn, *tool_msgs], add_generation_prompt=True)
    assert env.trajectory.prompt_ids + env.trajectory.completion_ids == expected
    assert env.trajectory.num_tool_calls == 2


def test_end_token_inserted_with_mask_zero_when_stopped_at_tool_call_end(any_tok):
    tok = any_tok
    generated, inserted = make_env(tok), make_env(tok)
    for env in (generated, inserted):
        env.reset(options={"index": 1})
    a_full = ids(tok, "Check: " + call("print(6 * 7)"))
    generated.step(a_full)
    inserted.step(a_full[:-1])  # the generator stopped at </tool_call>, before <|im_end|>
    g, i = generated.trajectory, inserted.trajectory
    assert g.completion_ids == i.completion_ids
    n = len(a_full)
    assert g.env_mask[n - 1] == 1 and i.env_mask[n - 1] == 0 and i.logprobs[n - 1] == 0.0


# ----------------------------------------------------------------------------------------------- retool format
def test_retool_format_episode(any_tok):
    tok = any_tok
    env = make_env(tok, tool_format="retool")
    prompt_ids, info = env.reset(options={"index": 1})
    assert "*user question:*" in tok.decode(prompt_ids) and "What is 6 * 7?" in tok.decode(prompt_ids)
    assert info["stop"] == ["</code>"]
    obs, reward, *_ = env.step(ids(tok, "I will compute.\n<code>\n```python\nprint(6 * 7)\n```\n</code>", end=False))
    assert tok.decode(obs) == "\n<interpreter>\n42\n</interpreter>\n\n" and reward == 0.0
    # The generator may strip the stop string: the environment closes the block itself, with mask 0.
    obs2, *_ = env.step(ids(tok, "Again.\n<code>\n```python\nprint(7 * 6)\n```", end=False))
    assert tok.decode(obs2).startswith("</code>\n<interpreter>\n42")
    _, reward, terminated, truncated, info = env.step(ids(tok, "<answer>\n\\boxed{42}\n</answer>"))
    assert terminated and not truncated and reward == 1.0 and env.trajectory.num_tool_calls == 2


def test_retool_code_fence_stripped_and_errors_shown(tiny_tok):
    env = make_env(tiny_tok, tool_format="retool")
    env.reset(options={"index": 1})
    obs, *_ = env.step(ids(tiny_tok, "<code>\n```python\nprint('before')\n1/0\n```\n</code>", end=False))
    text = tiny_tok.decode(obs)
    assert "before" in text and "ZeroDivisionError" in text
    obs, *_ = env.step(ids(tiny_tok, "<code>\n```python\n```\n</code>", end=False))
    assert "empty" in tiny_tok.decode(obs)
    assert [c.status for c in env.trajectory.tool_calls] == ["error", "invalid"]


# ------------------------------------------------------------------------------------------ masks and logprobs
def test_masks_and_logprobs_aligned(tiny_tok):
    env = make_env(tiny_tok)
    env.reset(options={"index": 1})
    a1 = ids(tiny_tok, "Check. " + call("print(6 * 7)"))
    lp1 = [-0.1 * (i + 1) for i in range(len(a1))]
    obs, *_ = env.step({"token_ids": a1, "logprobs": lp1})
    a2 = ids(tiny_tok, "\\boxed{42}")
    env.step({"token_ids": a2, "logprobs": [-0.5] * len(a2)})
    traj = env.trajectory
    assert len(traj.completion_ids) == len(traj.env_mask) == len(traj.logprobs) == len(a1) + obs.size + len(a2)
    assert traj.logprobs == lp1 + [0.0] * obs.size + [-0.5] * len(a2)
    assert traj.env_mask == [1] * len(a1) + [0] * obs.size + [1] * len(a2)
    assert traj.has_logprobs and traj.to_dict()["logprobs"] == traj.logprobs


def test_missing_logprobs_are_flagged_not_invented(tiny_tok):
    env = make_env(tiny_tok)
    env.reset(options={"index": 1})
    env.step(ids(tiny_tok, "\\boxed{42}"))
    assert not env.trajectory.has_logprobs and env.trajectory.to_dict()["logprobs"] is None
    env.reset(options={"index": 1})
    a = ids(tiny_tok, "\\boxed{42}")
    with pytest.raises(ValueError, match="logprobs"):
        env.step({"token_ids": a, "logprobs": [-0.1]})
    env.reset(options={"index": 1})
    with pytest.raises(ValueError, match="finite"):
        env.step({"token_ids": a, "logprobs": [float("nan")] * len(a)})


# ---------------------------------------------------------------------------------------- budgets, truncation
def test_max_tool_calls_truncates(tiny_tok):
    env = make_env(tiny_tok, max_tool_calls=1)
    env.reset(options={"index": 1})
    _, reward, terminated, truncated, info = env.step(ids(tiny_tok, call("print(1)") + call("print(2)")))
    assert truncated and not terminated and info["finish_reason"] == "max_tool_calls"
    assert env.trajectory.num_tool_calls == 0 and reward == -1.0


def test_max_completion_tokens_truncates_before_overflowing(tiny_tok):
    env = make_env(tiny_tok, max_completion_tokens=60)
    _, info = env.reset(options={"index": 1})
    assert info["max_new_tokens"] == 60
    action = ids(tiny_tok, call("print('x' * 400)"))
    obs, reward, terminated, truncated, info = env.step(action)
    assert truncated and info["finish_reason"] == "observation_too_long"  # the call ran; its result has no room
    assert len(env.trajectory.completion_ids) == len(action) <= 60


def test_an_answer_past_the_budget_is_truncated(tiny_tok):
    env = make_env(tiny_tok, max_completion_tokens=5)
    env.reset(options={"index": 1})
    _, reward, terminated, truncated, info = env.step(ids(tiny_tok, "The product is \\boxed{42}, clearly."))
    assert truncated and not terminated and info["finish_reason"] == "max_completion_tokens"
    assert len(env.trajectory.completion_ids) == 5


@pytest.mark.parametrize("text", ["The answer is \\boxed{42}.", call("print(6 * 7)"), "still thinking"])
def test_an_action_over_the_budget_is_clipped_with_one_finish_reason(tiny_tok, text):
    env = make_env(tiny_tok, max_completion_tokens=64)
    env.reset(options={"index": 1})
    action = ids(tiny_tok, "word " * 200 + text)
    assert len(action) > 64
    _, reward, terminated, truncated, info = env.step({"token_ids": action, "logprobs": [-0.5] * len(action)})
    traj = env.trajectory
    assert truncated and not terminated and info["finish_reason"] == "max_completion_tokens"
    assert traj.completion_ids == action[:64] and traj.env_mask == [1] * 64 and traj.logprobs == [-0.5] * 64
    assert traj.num_tool_calls == 0 and reward == -1.0


def test_max_new_tokens_and_turn_cap(tiny_tok):
    env = make_env(tiny_tok, max_completion_tokens=2000, max_turn_tokens=100)
    _, info = env.reset(options={"index": 1})
    assert info["max_new_tokens"] == 100
    obs, *_, info = env.step(ids(tiny_tok, call("print(6 * 7)")))
    assert info["max_new_tokens"] == 100 and info["turn"] == 1 and info["num_tool_calls"] == 1
    env2 = make_env(tiny_tok, max_completion_tokens=300)
    env2.reset(options={"index": 1})
    a = ids(tiny_tok, call("print(6 * 7)"))
    obs, *_, info = env2.step(a)
    assert info["max_new_tokens"] == 300 - len(a) - obs.size


def test_observation_clipped_in_tokens_head_and_tail(tiny_tok):
    env = make_env(tiny_tok, max_observation_tokens=64)
    env.reset(options={"index": 1})
    code = "for i in range(2000):\n    print('line', i)"
    obs, *_, info = env.step(ids(tiny_tok, call(code)))
    out = info["tool_results"][0]["output"]
    assert "line 0" in out and "line 1999" in out and "tokens omitted" in out
    assert len(tiny_tok.encode(out, add_special_tokens=False)) <= 64  # the marker counted


@pytest.mark.parametrize("budget", [1, 5, 16, 17, 30, 64, 200])
def test_clipped_output_never_exceeds_the_budget_marker_included(any_tok, budget):
    from retool_env.tokens import clip_tokens, encode_text

    text = "".join(f"row {i}: {'é' * (i % 5)} <|im_end|> value={i * 7919}\n" for i in range(400))
    clipped = clip_tokens(text, any_tok, budget)
    assert len(encode_text(any_tok, clipped)) <= budget
    if budget >= 64:  # room for the marker (about 26 tokens for the tiny tokenizer) and text around it
        assert "tokens omitted" in clipped and clipped.startswith("row 0")


def test_cut_off_turn_is_truncated_and_graded(any_tok):
    action = ids(any_tok, "The answer is \\boxed{42}", end=False)
    env = make_env(any_tok, max_turn_tokens=len(action))  # the whole turn budget used, no end token
    env.reset(options={"index": 1})
    _, reward, terminated, truncated, info = env.step(action)
    assert truncated and not terminated and info["finish_reason"] == "length"
    assert info["correct"] and reward == 1.0  # graded on what the model wrote, like any truncated response
    env = make_env(any_tok)
    env.reset(options={"index": 1})
    _, _, terminated, truncated, info = env.step({"token_ids": action, "finish_reason": "length"})
    assert truncated and info["finish_reason"] == "length"
    env.reset(options={"index": 1})  # stopped early for the generator's own reason: read as the final answer
    _, reward, terminated, truncated, info = env.step(action)
    assert terminated and not truncated and reward == 1.0


# ---------------------------------------------------------------------------------------------- bad actions
@pytest.mark.parametrize(("text", "needle"), [
    ('<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"</tool_call>', "not valid JSON"),
    ('<tool_call>\n{"name": "bash", "arguments": {"code": "ls"}}\n</tool_call>', "unknown function"),
    ('<tool_call>\n{"name": "code_interpreter", "arguments": {}}\n</tool_call>', "needs"),
    ('<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "  "}}\n</tool_call>', "empty"),
    ('<tool_call>\n[1, 2]\n</tool_call>', "JSON object"),
    ('<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"', "never closed"),  # JSON cut too
])
def test_malformed_calls_become_observations(tiny_tok, text, needle):
    env = make_env(tiny_tok)
    env.reset(options={"index": 1})
    obs, reward, terminated, truncated, info = env.step(ids(tiny_tok, text))
    assert not (terminated or truncated) and reward == 0.0
    assert info["tool_results"][-1]["status"] == "invalid" and needle in tiny_tok.decode(obs)
    assert env.trajectory.num_tool_calls == 0


def test_raw_newlines_in_json_are_repaired_and_fences_stripped(tiny_tok):
    env = make_env(tiny_tok)
    env.reset(options={"index": 1})
    raw = ('<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "```python\nx = 6\nprint(x * 7)\n```"}}'
           '\n</tool_call>')
    obs, *_, info = env.step(ids(tiny_tok, raw))
    assert info["tool_results"][0]["status"] == "ok" and "42" in info["tool_results"][0]["output"]


def test_valid_json_is_never_altered(tiny_tok):
    from retool_env.dialects import get_dialect
    from retool_env.formats import CODE_INTERPRETER_TOOL

    code = 'print("a\\nb")'
    for arguments in ({"code": code}, json.dumps({"code": code})):
        block = "<tool_call>" + json.dumps({"name": "code_interpreter", "arguments": arguments}) + "</tool_call>"
        assert get_dialect("hermes").parse(block, [CODE_INTERPRETER_TOOL]).calls[0].arguments == {"code": code}


def test_budget_errors_name_the_argument_and_value(tiny_tok):
    with pytest.raises(ValueError, match=r"max_completion_tokens=0"):
        make_env(tiny_tok, max_completion_tokens=0)
    with pytest.raises(ValueError, match=r"max_tool_calls=-1"):
        make_env(tiny_tok, max_tool_calls=-1)


def test_caller_misuse_raises(tiny_tok):
    env = make_env(tiny_tok)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(ids(tiny_tok, "hi"))
    env.reset(options={"index": 1})
    with pytest.raises(ValueError, match=r"\[0, "):
        env.step([len(tiny_tok) + 5])
    with pytest.raises(ValueError, match=r"\[0, "):  # an array takes the same check
        env.step(np.array([-1], dtype=np.int64))
    with pytest.raises(ValueError, match="1-D"):
        env.step(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="token_ids"):
        env.step({"ids": [1]})
    with pytest.raises(TypeError, match=r"tokenizer\.encode"):
        env.step("The answer is 42.")
    env.step(ids(tiny_tok, "\\boxed{42}"))
    with pytest.raises(RuntimeError, match="ended"):
        env.step(ids(tiny_tok, "again"))


def test_tool_output_that_prints_a_box_earns_nothing(any_tok):
    env = make_env(any_tok)
    env.reset(options={"index": 1})
    obs, *_ = env.step(ids(any_tok, call("print('\\\\boxed{42}')")))
    assert "\\boxed{42}" in any_tok.decode(obs)
    _, reward, terminated, _, info = env.step(ids(any_tok, "I am not sure."))
    assert terminated and not info["correct"] and info["pred"] is None and reward < 0


def test_empty_action_is_a_wrong_final_answer(tiny_tok):
    env = make_env(tiny_tok)
    env.reset(options={"index": 1})
    _, reward, terminated, truncated, info = env.step([])
    assert terminated and info["finish_reason"] == "answer" and info["pred"] is None and reward == -1.0


# --------------------------------------------------------------------------------------------- reward shaping
def test_retool_reward_counts_tool_rounds(tiny_tok):
    env = make_env(tiny_tok)
    env.reset(options={"index": 1})
    env.step(ids(tiny_tok, call("print(1)")))
    env.step(ids(tiny_tok, call("print(2)") + call("print(3)")))
    _, reward, *_ = env.step(ids(tiny_tok, "\\boxed{41}"))
    assert env.trajectory.num_tool_calls == 3 and reward == pytest.approx(-0.8)  # two rounds (retool_env/rewards.py)
    paper = make_env(tiny_tok, reward="paper")
    paper.reset(options={"index": 1})
    assert paper.step(ids(tiny_tok, "\\boxed{41}"))[1] == -1.0


# ------------------------------------------------------------------------------------- async, sessions, API
def test_astep_matches_step(tiny_tok):
    actions = [ids(tiny_tok, call("print(6 * 7)")), ids(tiny_tok, "\\boxed{42}")]
    sync_env, async_env = make_env(tiny_tok), make_env(tiny_tok)
    sync_env.reset(options={"index": 1})
    async_env.reset(options={"index": 1})
    sync_out = [sync_env.step(a) for a in actions]

    async def run():
        return [await async_env.astep(a) for a in actions]

    async_out = asyncio.run(run())
    for (o1, r1, *_), (o2, r2, *_) in zip(sync_out, async_out, strict=True):
        assert o1.tolist() == o2.tolist() and r1 == r2
    assert sync_env.trajectory.completion_ids == async_env.trajectory.completion_ids


def test_stateful_sessions_keep_variables(tiny_tok):
    env = make_env(tiny_tok, stateful=True)
    env.reset(options={"index": 1})
    env.step(ids(tiny_tok, call("x = 6 * 7")))
    obs, *_, info = env.step(ids(tiny_tok, call("print(x)")))
    assert info["tool_results"][0]["status"] == "ok" and "42" in info["tool_results"][0]["output"]


def test_reset_is_seeded_and_accepts_a_problem(tiny_tok):
    env = make_env(tiny_tok, dataset=[Problem(f"What is {i} + 1?", str(i + 1), id=str(i)) for i in range(50)])
    first = [env.reset(seed=7)[1]["problem_id"] for _ in range(1)] + [env.reset()[1]["problem_id"] for _ in range(5)]
    again = [env.reset(seed=7)[1]["problem_id"] for _ in range(1)] + [env.reset()[1]["problem_id"] for _ in range(5)]
    assert first == again and len(set(first)) > 1
    _, info = env.reset(options={"problem": {"question": "What is 2 + 2?", "answer": "4", "id": "custom"}})
    assert info["problem_id"] == "custom"


def test_render_ansi_marks_spans(tiny_tok):
    env = make_env(tiny_tok, render_mode="ansi")
    env.reset(options={"index": 1})
    env.step(ids(tiny_tok, call("print(6 * 7)")))
    env.step(ids(tiny_tok, "\\boxed{42}"))
    text = env.render()
    assert text.index("=== prompt") < text.index("=== model") < text.index("=== environment") < text.index("reward +1")


def test_check_env_passes(tiny_tok):
    check_env(make_env(tiny_tok), skip_render_check=True)


def test_gym_make_arith_and_clear_error_for_missing_dapo(tiny_tok, monkeypatch, tmp_path):
    env = gym.make("ReTool-Arith-v0", tokenizer=tiny_tok)
    obs, info = env.reset(seed=0)
    assert obs.dtype == np.int64 and obs.size > 0 and info["problem_id"]
    obs, reward, terminated, truncated, info = env.step(ids(tiny_tok, "\\boxed{0}"))
    assert terminated and isinstance(reward, float)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(Exception, match="local"):
        gym.make("ReTool-Math-v0", tokenizer=tiny_tok)


# ------------------------------------------------------------------------------------------ property: invariants
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PIECES = ["<tool_call>", "</tool_call>", "<|im_end|>", "<code>", "</code>", "```python\n", "```", "\n", "{", "}",
          '"name": "code_interpreter"', '"arguments": {"code": "print(6 * 7)"}', ", ", "\\boxed{42}", "text ",
          "<answer>", "</answer>", "<interpreter>", '"', "\\"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(st.lists(st.sampled_from(PIECES), max_size=12), min_size=1, max_size=6),
       tool_format=st.sampled_from(["hermes", "retool"]), budget=st.integers(20, 400))
def test_random_actions_never_break_invariants(tiny_tok, turns, tool_format, budget):
    env = make_env(tiny_tok, tool_format=tool_format, max_completion_tokens=budget, max_tool_calls=3,
                   tool_timeout=2.0)
    env.reset(options={"index": 1})
    done = False
    for pieces in turns:
        action = tiny_tok.encode("".join(pieces), add_special_tokens=False)
        _, reward, terminated, truncated, info = env.step({"token_ids": action, "logprobs": [-1.0] * len(action)})
        traj = env.trajectory
        assert len(traj.completion_ids) == len(traj.env_mask) == len(traj.logprobs)
        assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.env_mask, strict=True) if m == 0)
        assert all(lp == -1.0 for lp, m in zip(traj.logprobs, traj.env_mask, strict=True) if m == 1)
        assert traj.num_model_tokens == sum(t.end - t.start for t in traj.turns)
        assert traj.num_tool_calls <= 3 and info["max_new_tokens"] >= 0
        done = terminated or truncated
        if done:
            assert reward == traj.reward and traj.finish_reason and len(traj.completion_ids) <= budget + len(action)
            break
        assert reward == 0.0 and len(traj.completion_ids) < budget
    if not done:  # a turn without a tool call always ends the episode
        _, _, terminated, truncated, _ = env.step(tiny_tok.encode("\\boxed{42}<|im_end|>", add_special_tokens=False))
        assert terminated or truncated


# ------------------------------------------------------------------------------------------- format internals
@pytest.mark.parametrize("text", ["Hello, AI!", "<tool_call>\n{\"a\": 1}</tool_call><|im_end|>", "  x\t\n\n y  ",
                                  "数学 ∑ 🙂", ""])
def test_direct_encode_decode_match_the_tokenizer(any_tok, text):
    from retool_env.formats import decode, encode

    assert encode(any_tok, text) == any_tok.encode(text, add_special_tokens=False)
    ids = any_tok.encode(text, add_special_tokens=False)
    for skip in (False, True):
        assert decode(any_tok, ids, skip_special_tokens=skip) == any_tok.decode(ids, skip_special_tokens=skip)


def test_templates_that_transform_tool_content_are_rendered_each_time(tiny_tok):
    import copy

    tok = copy.deepcopy(tiny_tok)
    tok.chat_template = tiny_tok.chat_template.replace("{{- content }}\n        {{- '\\n</tool_response>' }}",
                                                       "{{- content | trim }}\n        {{- '\\n</tool_response>' }}")
    assert tok.chat_template != tiny_tok.chat_template
    env = make_env(tok)
    env.reset(options={"index": 1})
    messages = env.prompt.messages(PROBLEMS[1].question)
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": "print('  42  ')"}}}]}
    env.step(assistant_action(tok, messages, turn))
    output = env.trajectory.tool_calls[0].output
    assert output != output.strip()  # the template's trim matters here
    expected = render(tok, [*messages, turn, {"role": "tool", "name": "code_interpreter", "content": output}],
                      add_generation_prompt=True)
    assert env.trajectory.prompt_ids + env.trajectory.completion_ids == expected


# ----------------------------------------------------------------------------------- per-episode settings
def test_reset_options_override_budgets_for_one_episode(tiny_tok):
    env = make_env(tiny_tok, max_completion_tokens=640, max_tool_calls=2)
    try:
        _, info = env.reset(options={"index": 0, "max_completion_tokens": 320, "max_tool_calls": 0})
        assert info["max_new_tokens"] == 320 and env.episode_config.max_tool_calls == 0
        assert env.config.max_completion_tokens == 640  # the environment's own settings are untouched
        end = env.format.end_token_ids[0]
        _, _, _, truncated, info = env.step(ids(tiny_tok, call("print(1)"), end=False) + [end])
        assert truncated and info["finish_reason"] == "max_tool_calls"  # the episode's budget: no call at all
        _, info = env.reset(options={"index": 0})
        assert info["max_new_tokens"] == 640 and env.episode_config is env.config  # the next episode: as built
    finally:
        env.close()


def test_reset_refuses_unknown_options_and_bad_overrides(tiny_tok):
    env = make_env(tiny_tok)
    try:
        with pytest.raises(ValueError, match=r"unknown reset option\(s\) \['tool_format'\].*accepts"):
            env.reset(options={"tool_format": "retool"})
        with pytest.raises(ValueError, match="max_completion_tokens=0"):
            env.reset(options={"max_completion_tokens": 0})
        with pytest.raises(ValueError, match="on_timeout"):
            env.reset(options={"on_timeout": "ignore"})
        assert env.reset(options={"index": 1})[1]["problem_id"] == "p1"  # a refused reset leaves it usable
    finally:
        env.close()


def test_settings_live_on_the_config_alone(tiny_tok):
    """EnvConfig is the one holder of settings: the environment carries no copy that could drift from it."""
    from dataclasses import fields

    from retool_env import EnvConfig

    env = make_env(tiny_tok, max_tool_calls=3)
    try:
        copies = {f.name for f in fields(EnvConfig)} & set(vars(env)) - {"prompt"}  # env.prompt: the template built
        assert not copies, f"config fields copied onto the environment: {copies}"
        assert env.config.max_tool_calls == 3 and env.tools.config is env.config
    finally:
        env.close()


def test_moved_format_names_still_import_for_a_release_with_a_deprecation_warning(tiny_tok):
    import retool_env.formats as formats
    from retool_env.prompts import prompt_messages

    with pytest.warns(DeprecationWarning, match=r'format_class\("hermes"\)'):
        hermes = formats.HermesFormat
    assert hermes is formats.format_class("hermes") and issubclass(hermes, formats.DialectFormat)
    with pytest.warns(DeprecationWarning, match="retool_env.prompts.prompt_messages"):
        assert formats.prompt_messages is prompt_messages
    with pytest.warns(DeprecationWarning):
        call = formats.parse_hermes_call('{"name": "code_interpreter", "arguments": {"code": "print(1)"}}')
    assert call == formats.ToolCall("print(1)")
    with pytest.warns(DeprecationWarning):
        assert formats.tool_call_blocks("a<tool_call>1</tool_call>b<tool_call>2") == (["1"], True)
    with pytest.warns(DeprecationWarning):
        assert formats.ChatTurnsFormat is formats.DialectFormat and formats.MAX_CALLS_PER_TURN == 32
    with pytest.raises(AttributeError):
        formats.NoSuchName  # noqa: B018
