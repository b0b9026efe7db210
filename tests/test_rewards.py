"""Reward schemes: the verl and slime shapings, the tool-call cost, and custom schemes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retool_env.grading import Grade
from retool_env.rewards import REWARD_SCHEMES, EpisodeStats, get_reward_fn, sign_safe_rewards

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


# ------------------------------------------------------------------------- step reward and sign-safe shaping
def test_tool_success_reward_pays_clean_calls_up_to_its_cap() -> None:
    from retool_env.rewards import EpisodeStats

    clean, messy = EpisodeStats(num_tool_calls=3), EpisodeStats(num_tool_calls=3, num_tool_errors=2)
    assert clean.successful_calls == 3 and messy.successful_calls == 1
    # one failed call and two invalid ones (never run): the executed call that failed is not paid, nothing is taken
    assert EpisodeStats(num_tool_calls=1, num_tool_errors=3, num_invalid_calls=2).successful_calls == 0
    for scheme in ("retool", "retool_slime", "paper", "binary"):
        plain, stepped = get_reward_fn(scheme), get_reward_fn(scheme, tool_success_reward=0.1)
        for grade in (RIGHT, WRONG):
            assert stepped(grade, clean) == pytest.approx(plain(grade, clean) + 0.3)
            assert stepped(grade, messy) == pytest.approx(plain(grade, messy) + 0.1)
        capped = get_reward_fn(scheme, tool_success_reward=0.1, max_rewarded_calls=2)
        assert capped(RIGHT, clean) == pytest.approx(plain(RIGHT, clean) + 0.2)
    assert get_reward_fn("retool")(RIGHT, clean) == 1.0  # off by default


def test_an_invalid_call_takes_nothing_from_the_clean_calls_step_reward() -> None:
    from retool_env.trajectory import ToolCallRecord, ToolStatus

    # THOR's step reward pays calls that ran and ended `ok`: three of them, beside one malformed call that never ran.
    calls = [ToolCallRecord(str(i), str(i), ToolStatus.OK, turn=i) for i in range(3)]
    calls.append(ToolCallRecord(None, "malformed", ToolStatus.INVALID, turn=3))
    stats = EpisodeStats.of_calls(calls, num_turns=5, num_tool_rounds=3, truncated=False, finish_reason="answer")
    assert stats.successful_calls == 3
    stepped, plain = get_reward_fn("paper", tool_success_reward=0.1), get_reward_fn("paper")
    assert stepped(RIGHT, stats) == pytest.approx(plain(RIGHT, stats) + 0.3)


def _advantages(rewards: list[float]) -> list[float]:
    """GRPO's group advantages as TRL computes them (float32, std + 1e-4)."""
    import torch

    r = torch.tensor(rewards, dtype=torch.float32)
    return ((r - r.mean()) / (r.std() + 1e-4)).tolist()


def test_a_flat_tool_cost_reverses_signs_and_sign_safe_rewards_cannot() -> None:
    import random

    from retool_env.rewards import sign_safe_rewards

    costly = get_reward_fn("retool", tool_call_cost=0.1)
    # AdaTIR's sign reversal: seven right answers, the one with three calls scores below the mean.
    group = [(RIGHT, EpisodeStats())] * 6 + [(RIGHT, EpisodeStats(num_tool_calls=3)), (WRONG, EpisodeStats())]
    rewards, correct = [costly(g, s) for g, s in group], [g.correct for g, _ in group]
    assert _advantages(rewards)[6] < 0
    safe = sign_safe_rewards(rewards, correct)
    assert min(a for a, c in zip(_advantages(safe), correct, strict=True) if c) >= 0
    assert safe[7] == rewards[7] and safe[:6] == rewards[:6]  # wrong kept, correct above the floor kept
    rng = random.Random(0)
    for _ in range(2000):  # any group, any shaping: no correct rollout below the mean
        n = rng.randint(2, 16)
        correct = [rng.random() < rng.random() for _ in range(n)]
        rewards = [(1.0 if c else -1.0) + rng.uniform(-1.5, 1.5) for c in correct]
        rewards = [None if rng.random() < 0.1 else r for r in rewards]
        safe = sign_safe_rewards(rewards, correct)
        scored = [(s, c) for s, c in zip(safe, correct, strict=True) if s is not None]
        assert [s is None for s in safe] == [r is None for r in rewards]
        if len({s for s, _ in scored}) > 1:
            advantages = _advantages([s for s, _ in scored])
            assert all(a >= 0 for a, (_, c) in zip(advantages, scored, strict=True) if c)
        assert all(s == r for s, r, c in zip(safe, rewards, correct, strict=True) if not c)
    assert sign_safe_rewards([0.9, 0.7, 1.0], [True, True, True]) == [1.0, 1.0, 1.0]  # all right: no shaping
    assert sign_safe_rewards([-1.0, -0.8], [False, False]) == [-1.0, -0.8]
    with pytest.raises(ValueError, match="verdicts"):
        sign_safe_rewards([1.0], [True, False])


_REWARD = st.floats(-3.0, 3.0, allow_nan=False, width=32)
_GROUP = st.lists(st.tuples(st.booleans(), st.one_of(st.none(), _REWARD)), min_size=2, max_size=16)


def _scored(group: list[tuple[bool, float | None]], guarantee: str) -> list[tuple[bool, float]]:
    correct, rewards = [c for c, _ in group], [r for _, r in group]
    safe = sign_safe_rewards(rewards, correct, guarantee=guarantee)
    assert [s is None for s in safe] == [r is None for r in rewards]
    assert all(s == r for s, r, c in zip(safe, rewards, correct, strict=True) if not c)  # wrong rewards kept
    return [(c, s) for c, s in zip(correct, safe, strict=True) if s is not None]


@settings(max_examples=400, deadline=None)
@given(_GROUP, st.sampled_from(["above_mean", "above_wrong"]))
def test_sign_safe_rewards_keep_every_correct_rollout_at_or_above_the_mean(group, guarantee) -> None:
    scored = _scored(group, guarantee)
    if len({s for _, s in scored}) > 1:  # equal rewards normalise to a rounding error, no signal
        advantages = _advantages([s for _, s in scored])
        assert all(a >= 0 for a, (c, _) in zip(advantages, scored, strict=True) if c)


@settings(max_examples=400, deadline=None)
@given(_GROUP)
def test_above_wrong_keeps_every_correct_rollout_at_or_above_every_wrong_one(group) -> None:
    scored = _scored(group, "above_wrong")
    right, wrong = [s for c, s in scored if c], [s for c, s in scored if not c]
    assert not right or not wrong or min(right) >= max(wrong)
    if right and wrong and len({s for _, s in scored}) > 1:
        advantages = _advantages([s for _, s in scored])
        assert min(a for a, (c, _) in zip(advantages, scored, strict=True) if c) >= max(
            a for a, (c, _) in zip(advantages, scored, strict=True) if not c)


def test_above_mean_alone_lets_a_wrong_rollout_outrank_a_correct_one() -> None:
    # `paper` at 0.2 a call: right after 12 calls (-1.4) under a wrong answer without a call (-1.0).
    costly = get_reward_fn("paper", tool_call_cost=0.2)
    group = [(RIGHT, EpisodeStats()), (RIGHT, EpisodeStats(num_tool_calls=12)), (WRONG, EpisodeStats())]
    group += [(WRONG, EpisodeStats(num_tool_calls=5))] * 5
    rewards, correct = [costly(g, s) for g, s in group], [g.correct for g, _ in group]
    assert sign_safe_rewards(rewards, correct)[1] < rewards[2]  # the documented limit of the default
    assert sign_safe_rewards(rewards, correct, guarantee="above_wrong")[1] >= rewards[2]
    with pytest.raises(ValueError, match="guarantee"):
        sign_safe_rewards(rewards, correct, guarantee="above_all")


def test_episode_stats_of_a_trajectory_counts_what_the_environment_ran() -> None:
    from retool_env.rewards import EpisodeStats
    from retool_env.trajectory import ToolCallRecord, ToolStatus, Trajectory

    traj = Trajectory(prompt_ids=[1], finish_reason="answer")
    traj.tool_calls = [ToolCallRecord("1", "1", ToolStatus.OK, turn=0),
                       ToolCallRecord("2", "x", ToolStatus.ERROR, turn=0),
                       ToolCallRecord(None, "bad", ToolStatus.INVALID, turn=1),
                       ToolCallRecord("3", "", ToolStatus.TIMEOUT, turn=2)]
    stats = EpisodeStats.of(traj)
    assert (stats.num_tool_calls, stats.num_tool_rounds, stats.num_tool_errors, stats.num_tool_timeouts) == (3, 2, 3, 1)
    assert stats.finish_reason == "answer" and not stats.truncated
