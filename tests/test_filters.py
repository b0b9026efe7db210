"""SimpleTIR's void turn on real episodes of the environment (tiny tokenizer, real sandbox and grader): a turn is void
when it holds neither a complete code block nor a final answer, whatever budget ended it."""

from __future__ import annotations

import pytest

from retool_env import Problem, ToolEnvironment
from retool_env.filters import has_void_turn

PROBLEM = Problem("What is 6 * 7?", "42", id="p1")


def play(tok, text: str, finish_reason: str = "stop", **config) -> ToolEnvironment:
    """One model turn of a fresh episode, with the generator's finish reason."""
    env = ToolEnvironment(tok, [PROBLEM], **config)
    env.reset(options={"index": 0})
    token_ids = tok.encode(text, add_special_tokens=False)
    if finish_reason == "stop":
        token_ids += env.format.end_token_ids[:1]
    env.step({"token_ids": token_ids, "finish_reason": finish_reason})
    return env


def call(code: str) -> str:
    return f'<tool_call>\n{{"name": "code_interpreter", "arguments": {{"code": "{code}"}}}}\n</tool_call>'


def test_a_turn_cut_off_after_its_boxed_answer_is_not_void(tiny_tok):
    env = play(tiny_tok, "6 * 7 is \\boxed{42}, and to check it once more", finish_reason="length")
    traj = env.trajectory
    assert traj.finish_reason == "length" and traj.pred == "42" and traj.correct and traj.reward == 1.0
    assert not has_void_turn(traj)  # a correct, rewarded episode stays in the loss
    env.close()


def test_a_complete_call_whose_result_does_not_fit_is_not_void(tiny_tok):
    text = call("print('x' * 400)")
    env = play(tiny_tok, text, max_completion_tokens=len(tiny_tok.encode(text, add_special_tokens=False)) + 8,
               max_observation_tokens=200)
    traj = env.trajectory
    assert [c.status for c in traj.tool_calls] == ["ok"]
    assert traj.finish_reason == "observation_too_long" and traj.truncated
    assert not has_void_turn(traj)
    env.close()


@pytest.mark.parametrize(("text", "finish_reason"), [
    ("Let me think about 6 * 7 step by", "length"),    # cut off with neither a call nor an answer
    ("I am not sure.", "stop"),                        # ended without an answer
    ('<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(6', "length"),  # inside a call
])
def test_turns_with_neither_a_code_block_nor_an_answer_are_void(tiny_tok, text, finish_reason):
    env = play(tiny_tok, text, finish_reason=finish_reason)
    assert env.trajectory.pred is None and has_void_turn(env.trajectory)
    env.close()


def test_the_plan_applies_the_sign_safe_guarantee_it_is_given():
    from retool_env.filters import TrajectoryFilters
    from retool_env.trajectory import Trajectory

    def episode(reward: float, correct: bool) -> Trajectory:
        return Trajectory(prompt_ids=[1], completion_ids=[2], env_mask=[1], logprobs=[0.0], reward=reward,
                          correct=correct, finish_reason="answer", pred="42" if correct else "41")

    group = [episode(1.0, True), episode(-1.4, True), episode(-1.0, False)] + [episode(-2.0, False)] * 5
    keys = [0] * len(group)
    mean_only = TrajectoryFilters(sign_safe_shaping=True).plan(group, keys).rewards
    above_wrong = TrajectoryFilters(sign_safe_shaping="above_wrong").plan(group, keys).rewards
    assert mean_only[1] is not None and mean_only[1] < -1.0
    assert above_wrong[1] is not None and above_wrong[1] >= -1.0
    with pytest.raises(ValueError, match="sign_safe_shaping"):
        TrajectoryFilters(sign_safe_shaping="above_all")
