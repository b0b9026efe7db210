"""Reward schemes: the verl and slime shapings, the tool-call cost, and custom schemes."""

from __future__ import annotations

import pytest

from retool_env.grading import Grade
from retool_env.rewards import REWARD_SCHEMES, EpisodeStats, get_reward_fn

RIGHT = Grade(correct=True, pred="204", method="exact", strict_correct=False)
WRONG = Grade(correct=False, pred="205", method="numeric", strict_correct=False)
NONE = Grade(correct=False, pred=None, method="none")


def _shaping(score: float, num_turns: int) -> float:
    """The line verl's recipe/retool and slime's examples/retool share, transcribed from both."""
    if score < 0:
        score = min(-0.6, score + (num_turns - 2) / 2 * 0.1)
    return score


@pytest.mark.parametrize("k", range(13))
def test_retool_matches_verl_with_num_turns_2k_plus_2(k: int) -> None:
    stats = EpisodeStats(num_tool_calls=k)
    assert get_reward_fn("retool")(WRONG, stats) == pytest.approx(_shaping(-1.0, 2 * k + 2))
    assert get_reward_fn("retool")(RIGHT, stats) == 1.0


@pytest.mark.parametrize("k", range(13))
def test_retool_slime_matches_slime_with_num_turns_k(k: int) -> None:
    stats = EpisodeStats(num_tool_calls=k)
    assert get_reward_fn("retool_slime")(WRONG, stats) == pytest.approx(_shaping(-1.0, k))
    assert get_reward_fn("retool_slime")(RIGHT, stats) == 1.0


def test_documented_values() -> None:
    retool, slime = get_reward_fn("retool"), get_reward_fn("retool_slime")
    assert [round(retool(WRONG, EpisodeStats(num_tool_calls=k)), 6) for k in range(6)] == [
        -1.0,
        -0.9,
        -0.8,
        -0.7,
        -0.6,
        -0.6,
    ]
    assert round(slime(WRONG, EpisodeStats()), 6) == -1.1
    assert round(slime(NONE, EpisodeStats(num_tool_calls=2)), 6) == -1.0
    assert round(slime(WRONG, EpisodeStats(num_tool_calls=10)), 6) == -0.6


def test_paper_and_binary() -> None:
    stats = EpisodeStats(num_tool_calls=3)
    assert (get_reward_fn("paper")(RIGHT, stats), get_reward_fn("paper")(WRONG, stats)) == (1.0, -1.0)
    assert (get_reward_fn("binary")(RIGHT, stats), get_reward_fn("binary")(NONE, stats)) == (1.0, 0.0)


@pytest.mark.parametrize("scheme", sorted(REWARD_SCHEMES))
def test_tool_call_cost_applies_to_every_outcome(scheme: str) -> None:
    plain, costly = get_reward_fn(scheme), get_reward_fn(scheme, tool_call_cost=0.02)
    for grade in (RIGHT, WRONG):
        for k in (0, 1, 5):
            stats = EpisodeStats(num_tool_calls=k)
            assert costly(grade, stats) == pytest.approx(plain(grade, stats) - 0.02 * k)
    # Answering 7 * 8 directly beats answering it with one interpreter call.
    assert costly(RIGHT, EpisodeStats(num_tool_calls=0)) > costly(RIGHT, EpisodeStats(num_tool_calls=1))


def test_strict_option_uses_verls_verdict() -> None:
    strict = get_reward_fn("retool", strict=True)
    assert strict(RIGHT, EpisodeStats()) == -1.0  # right, but `\boxed{ 204 }` fails verl's exact string check
    assert strict(Grade(False, "x", "math_verify", strict_correct=True), EpisodeStats()) == 1.0


def custom_reward(grade: Grade, stats: EpisodeStats, *, bonus: float = 0.0) -> float:
    return (2.0 if grade.correct else 0.0) + bonus - 0.5 * stats.num_tool_errors


def test_custom_callable_and_dotted_path() -> None:
    stats = EpisodeStats(num_tool_calls=2, num_tool_errors=1)
    assert get_reward_fn(custom_reward)(RIGHT, stats) == 1.5
    assert get_reward_fn(custom_reward, bonus=1.0)(WRONG, stats) == 0.5
    assert get_reward_fn(f"{__name__}:custom_reward", bonus=0.25)(RIGHT, stats) == 1.75
    assert get_reward_fn(lambda grade, stats: float(stats.truncated))(RIGHT, EpisodeStats(truncated=True)) == 1.0


def test_errors_name_what_is_valid() -> None:
    with pytest.raises(ValueError, match="binary, paper, retool, retool_slime"):
        get_reward_fn("retool_verl")
    with pytest.raises(ValueError, match="cannot import"):
        get_reward_fn("no_such_module_xyz:fn")
    with pytest.raises(ValueError, match="cannot import"):
        get_reward_fn(f"{__name__}:no_such_function")
    with pytest.raises(TypeError, match="tool_call_costs"):
        get_reward_fn("retool", tool_call_costs=0.1)


def test_retool_shaping_counts_tool_rounds_not_calls() -> None:
    """Four trivial calls in one turn are one tool round: -0.9, as verl's recipe gives, not the -0.6 cap."""
    one_turn_four_calls = EpisodeStats(num_tool_calls=4, num_tool_rounds=1)
    assert get_reward_fn("retool")(WRONG, one_turn_four_calls) == pytest.approx(-0.9)
    assert get_reward_fn("retool", per="call")(WRONG, one_turn_four_calls) == pytest.approx(-0.6)
    assert get_reward_fn("retool_slime")(WRONG, one_turn_four_calls) == pytest.approx(-1.05)
    assert get_reward_fn("retool_slime", per="call")(WRONG, one_turn_four_calls) == pytest.approx(-0.9)
    # The tool-call cost stays per executed call, whatever the shaping counts.
    costly = get_reward_fn("retool", tool_call_cost=0.05)
    assert costly(RIGHT, one_turn_four_calls) == pytest.approx(1.0 - 0.2)
    # Rounds not counted (a bare slime sample): one call per round, as slime's ReTool generate runs them.
    assert EpisodeStats(num_tool_calls=3).tool_rounds == 3
    with pytest.raises(ValueError, match="per must be one of"):
        get_reward_fn("retool", per="turn")


def test_the_environment_counts_rounds_with_an_executed_call(tiny_tok) -> None:
    import json

    from retool_env import Problem, ToolEnvironment

    def turn(*codes: str) -> str:
        return "".join("<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}})
                       + "\n</tool_call>" for code in codes)

    env = ToolEnvironment(tiny_tok, [Problem("What is 6 * 7?", "42")], reward="retool")
    end = env.format.end_token_ids[0]
    try:
        env.reset(options={"index": 0})
        for text in (turn("1", "2", "3", "4"), turn("print(1)"), '<tool_call>\n{"name": "code_interpreter"}\n'
                     '</tool_call>', "\\boxed{41}"):
            _, reward, terminated, _, _ = env.step(tiny_tok.encode(text, add_special_tokens=False) + [end])
        assert terminated
        stats = env.episode_stats()
        assert (stats.num_tool_calls, stats.num_tool_rounds) == (5, 2)  # the invalid call's turn ran nothing
        assert reward == pytest.approx(-0.8)
    finally:
        env.close()
