"""Reward schemes: a graded final answer plus the episode's statistics in, one float out.

Built-in schemes (`REWARD_SCHEMES`, picked by name with `get_reward_fn`):

- `retool`: +1 if correct; if wrong, `min(-0.6, -1 + 0.1 * k)` for k tool rounds, so trying the interpreter
  and still failing costs less than failing without it (-1.0, -0.9, ... -0.6 from k = 4 on).
- `retool_slime`: slime's reading of the same code: +1 if correct, wrong `min(-0.6, -1 + 0.05 * (k - 2))`
  (-1.1 with no tool call, -1.0 at k = 2, -0.6 from k = 10 on).
- `paper`: the ReTool paper's +1 / -1.
- `binary`: 1 / 0.

Where the two recipes come from. verl's `recipe/retool` and slime's `examples/retool` share one line of shaping,
`score = min(-0.6, score + (num_turns - 2) / 2 * 0.1)` for a wrong answer (score -1), but feed it different counts:

- verl: `num_turns = user_turns + assistant_turns + 1` (the agent loop's count). With k tool rounds there are k + 1
  assistant turns and k tool (user) turns, so num_turns = 2k + 2 and the bonus is exactly 0.1 * k: `retool`.
- slime: `num_turns = sample.tool_call_count`, and slime's ReTool `generate` runs one code block per turn, so the
  count is again the tool rounds k and the bonus 0.05 * (k - 2): `retool_slime`.

Both count rounds (model turns with at least one executed call, `EpisodeStats.tool_rounds`), not calls: counted per
call, four trivial calls in one turn would lift a wrong answer from -1.0 to the -0.6 cap, a bonus a policy finds at
once. `per="call"` counts executed calls instead, for a recipe that wants it (none of the two above does; with one
call per turn both readings agree). `num_turns` is carried for logging and custom schemes only.

Options (keyword arguments to `get_reward_fn`, accepted by every built-in scheme; `per` by the two shaped ones):

- `per`: "round" (default) or "call", what the ReTool shaping counts (above).

- `tool_call_cost`: subtracted once per executed tool call (invalid calls never ran and cost nothing) from every
  outcome, right or wrong, so calling the interpreter for `7 * 8` earns a little less than answering directly: tool
  use becomes a decision.
- `strict`: grade with verl's strict box verdict (`Grade.strict_correct`) instead of the real one, to reproduce
  the verl recipe's rewards exactly for comparison runs.
- `tool_success_reward` (default 0, off): a step reward added once per tool call that ran cleanly, on every outcome,
  as THOR's step-level reward for successful code and GEM's `ToolEnvWrapper(tool_success_reward=...)`. Counted as
  `successful_calls` (calls that ran and ended `ok`), at most `max_rewarded_calls` of them (None: no
  cap). A policy farms any per-call reward with trivial calls, so keep it small against the outcome gap, cap it, and
  pair it with `sign_safe_rewards` below.

Group-level option (it needs the whole GRPO group, so the trainer adapters apply it; `ReToolRollout(...,
sign_safe_shaping=True)`): `sign_safe_rewards`, a shaping that can never give a correct rollout a negative advantage.
AdaTIR (arXiv 2601.14696) shows that flat tool penalties (and step rewards, read the other way) make some correct
rollouts score below their group's mean, so GRPO pushes a right answer down ("sign reversal"), and clips the shaping
so that it cannot; `sign_safe_rewards` is that clip in reward space (see its docstring for why it holds). Its
guarantee is only that: a correct rollout is at or above the mean, not above every wrong one.
`sign_safe_shaping="above_wrong"` also keeps every correct rollout at or above every wrong one of its group.

Custom schemes: any callable `(grade, episode_stats) -> float`, or a dotted path "package.module:function" (as TRL
accepts reward functions), with keyword arguments bound by `get_reward_fn`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from retool_env.grading import Grade
from retool_env.trajectory import NOT_RUN, ToolCallRecord, ToolStats, Trajectory

__all__ = ["REWARD_SCHEMES", "SHAPING_UNITS", "SIGN_SAFE_GUARANTEES", "EpisodeStats", "RewardFn", "count_tool_rounds",
           "get_reward_fn", "sign_safe_rewards"]


@dataclass(frozen=True)
class EpisodeStats:
    """What a reward scheme may know about the episode besides the verdict."""

    num_tool_calls: int = 0  # calls the sandbox ran (ToolStats.executed); invalid and skipped calls never ran
    num_turns: int = 0  # assistant turns the model generated
    num_tool_rounds: int | None = None  # model turns in which the sandbox ran at least one call; None: not known
    num_tool_errors: int = 0  # calls that did not run cleanly: failed (timeouts included) or invalid
    num_invalid_calls: int = 0  # of those, calls that never ran (malformed, unknown tool)
    num_tool_timeouts: int = 0
    truncated: bool = False  # the episode hit a token or turn budget before a final answer
    finish_reason: str = ""

    @classmethod
    def of(cls, trajectory: Trajectory) -> EpisodeStats:
        """What the reward scheme is given for an episode: the counts of its trajectory. Every path that rewards a
        `Trajectory` (the environment, the adapters, the records) takes its statistics from here."""
        return cls.of_calls(trajectory.tool_calls, num_turns=trajectory.num_turns,
                            num_tool_rounds=count_tool_rounds(trajectory.tool_calls),
                            truncated=trajectory.truncated, finish_reason=trajectory.finish_reason)

    @classmethod
    def of_calls(cls, calls: Sequence[ToolCallRecord], *, num_turns: int, num_tool_rounds: int | None,
                 truncated: bool, finish_reason: str) -> EpisodeStats:
        """The statistics of an episode known by its tool calls alone (TRL's tool loop keeps no trajectory)."""
        tools = ToolStats.of([call.status for call in calls])
        return cls(num_tool_calls=tools.executed, num_turns=num_turns, num_tool_rounds=num_tool_rounds,
                   num_tool_errors=tools.failed + tools.invalid, num_invalid_calls=tools.invalid,
                   num_tool_timeouts=tools.timeouts,
                   truncated=truncated, finish_reason=finish_reason)

    @property
    def successful_calls(self) -> int:
        """Calls that ran and ended `ok`: what `tool_success_reward` pays for. An invalid call never ran, so it is
        not taken from the executed ones."""
        return max(0, self.num_tool_calls - (self.num_tool_errors - self.num_invalid_calls))

    @property
    def tool_rounds(self) -> int:
        """Tool rounds, the ReTool shaping's k; where a caller did not count them, one call per round is assumed (as
        in slime's ReTool `generate`, whose `tool_call_count` is the only count a bare sample has)."""
        return self.num_tool_calls if self.num_tool_rounds is None else self.num_tool_rounds


def count_tool_rounds(calls: Sequence[ToolCallRecord]) -> int:
    """Model turns in which the sandbox ran at least one call (`ToolCallRecord.turn`): the ReTool shaping's k."""
    return len({call.turn for call in calls if call.status not in NOT_RUN})


RewardFn = Callable[[Grade, EpisodeStats], float]
SHAPING_UNITS = ("round", "call")


def _is_correct(grade: Grade, strict: bool) -> bool:
    return grade.strict_correct if strict else grade.correct


def _tool_terms(stats: EpisodeStats, tool_call_cost: float, tool_success_reward: float,
                max_rewarded_calls: int | None) -> float:
    """What every scheme adds for the tool calls: minus the cost per executed call, plus the step reward per
    successful call (capped)."""
    rewarded = stats.successful_calls if max_rewarded_calls is None else min(stats.successful_calls,
                                                                               max_rewarded_calls)
    return tool_success_reward * rewarded - tool_call_cost * stats.num_tool_calls


def _shaping_count(stats: EpisodeStats, per: str) -> int:
    if per not in SHAPING_UNITS:
        raise ValueError(f"per must be one of {SHAPING_UNITS}, not {per!r}")
    return stats.tool_rounds if per == "round" else stats.num_tool_calls


def retool_reward(grade: Grade, stats: EpisodeStats, *, per: str = "round", tool_call_cost: float = 0.0,
                  strict: bool = False, tool_success_reward: float = 0.0,
                  max_rewarded_calls: int | None = None) -> float:
    """verl recipe/retool: +1, or `min(-0.6, -1 + 0.1 * k)` when wrong, k tool rounds (`per="call"`: calls); minus
    `tool_call_cost` per executed call."""
    k = _shaping_count(stats, per)
    base = 1.0 if _is_correct(grade, strict) else min(-0.6, -1.0 + 0.1 * k)
    return base + _tool_terms(stats, tool_call_cost, tool_success_reward, max_rewarded_calls)


def retool_slime_reward(grade: Grade, stats: EpisodeStats, *, per: str = "round", tool_call_cost: float = 0.0,
                        strict: bool = False, tool_success_reward: float = 0.0,
                        max_rewarded_calls: int | None = None) -> float:
    """slime examples/retool: +1, or `min(-0.6, -1 + (k - 2) / 2 * 0.1)` when wrong, k tool rounds (`per="call"`:
    calls); minus `tool_call_cost` per executed call."""
    k = _shaping_count(stats, per)
    base = 1.0 if _is_correct(grade, strict) else min(-0.6, -1.0 + (k - 2) / 2 * 0.1)
    return base + _tool_terms(stats, tool_call_cost, tool_success_reward, max_rewarded_calls)


def paper_reward(grade: Grade, stats: EpisodeStats, *, tool_call_cost: float = 0.0, strict: bool = False,
                 tool_success_reward: float = 0.0, max_rewarded_calls: int | None = None) -> float:
    """The ReTool paper: +1 if correct, else -1 (no tool shaping); minus `tool_call_cost * k`."""
    return (1.0 if _is_correct(grade, strict) else -1.0) + _tool_terms(stats, tool_call_cost, tool_success_reward,
                                                                        max_rewarded_calls)


def binary_reward(grade: Grade, stats: EpisodeStats, *, tool_call_cost: float = 0.0, strict: bool = False,
                  tool_success_reward: float = 0.0, max_rewarded_calls: int | None = None) -> float:
    """Accuracy as a reward: 1 if correct, else 0; minus `tool_call_cost * k`."""
    return (1.0 if _is_correct(grade, strict) else 0.0) + _tool_terms(stats, tool_call_cost, tool_success_reward,
                                                                       max_rewarded_calls)


SIGN_SAFE_MARGIN = 1e-6
SIGN_SAFE_GUARANTEES = ("above_mean", "above_wrong")


def sign_safe_rewards(rewards: Sequence[float | None], correct: Sequence[bool | None], *,
                      guarantee: str = "above_mean") -> list[float | None]:
    """One GRPO group's rewards with the shaping of its correct rollouts clipped from below, so that no correct
    rollout gets a negative advantage (AdaTIR's sign reversal cannot happen); wrong rewards are kept.

    `guarantee="above_mean"`: every correct reward is raised to at least `L = p * max(M, w) + (1 - p) * w`, with p the
    share of correct rollouts among the scored ones, M the best correct reward and w the mean wrong reward. Then
    every correct rollout scores at or above the group's mean; a wrong rollout may still score above a correct one
    (a wrong answer with few tool calls above a correct one that paid for many). `"above_wrong"` (AdaTIR's aim that
    correctness stays the main objective): the floor is `max(L, W)`, W the best wrong reward, so every correct
    rollout also scores at or above every wrong one of its group, and its advantage at or above theirs.

    Why the mean cannot pass the floor F (L, or max(L, W)): after the clip every correct reward lies in
    [F, max(M, F)]. If F <= M, the mean is at most `p * M + (1 - p) * w <= L <= F`; if F > M, every correct reward
    is F and the mean is `p * F + (1 - p) * w <= F`, as w <= W <= F (for L alone, F > M means w > M and L = w).
    GRPO's advantage is `(r - mean) / (std + eps)` (TRL's group scaling, none, or batch scaling, verl's and slime's
    too): a positive scale of `r - mean`, so a correct rollout's advantage is >= 0, and under `above_wrong` >= every
    wrong one's. What the clip costs: in a group where every rollout is correct, the floor is M and the shaping
    among them is cut away (they all score M, advantage 0); in a mixed group the shaping still orders the correct
    rollouts above the floor, and the wrong ones freely. Unscored (None) entries are left out of the statistics and
    returned as None, as GRPO leaves them out. The floor carries a margin of `SIGN_SAFE_MARGIN` (relative) over
    float32 rounding of a trainer's mean; equal rewards (the all-correct case) still normalise to a float32 rounding
    error (|advantage| < 1e-3 under TRL's `std + 1e-4`), not a signal.
    """
    if guarantee not in SIGN_SAFE_GUARANTEES:
        raise ValueError(f"guarantee must be one of {SIGN_SAFE_GUARANTEES}, not {guarantee!r}")
    if len(rewards) != len(correct):
        raise ValueError(f"{len(rewards)} rewards for {len(correct)} verdicts")
    right = [r for r, c in zip(rewards, correct, strict=True) if r is not None and c]
    wrong = [r for r, c in zip(rewards, correct, strict=True) if r is not None and not c]
    if not right:
        return list(rewards)
    if not wrong:
        best = max(right)
        return [None if r is None else (max(r, best) if c else r) for r, c in zip(rewards, correct, strict=True)]
    p, w = len(right) / (len(right) + len(wrong)), math.fsum(wrong) / len(wrong)
    floor = p * max(max(right), w) + (1 - p) * w
    if guarantee == "above_wrong":
        floor = max(floor, max(wrong))
    floor += SIGN_SAFE_MARGIN * (1.0 + abs(floor))  # so a trainer's float32 mean cannot round above it
    return [None if r is None else (max(r, floor) if c else r) for r, c in zip(rewards, correct, strict=True)]


REWARD_SCHEMES: dict[str, RewardFn] = {
    "retool": retool_reward,
    "retool_slime": retool_slime_reward,
    "paper": paper_reward,
    "binary": binary_reward,
}


def _import_callable(path: str) -> RewardFn:
    module_name, _, attribute = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import reward function {path!r}: {exc}") from exc
    if not callable(fn):
        raise ValueError(f"reward function {path!r} is not callable")
    return fn


def get_reward_fn(scheme: str | RewardFn, **kwargs: object) -> RewardFn:
    """A reward function from a scheme name, a "package.module:function" path or a callable, with `kwargs` bound.

    Unknown names and options fail here, at construction, not on the first finished episode.
    """
    if callable(scheme):
        fn = scheme
    elif isinstance(scheme, str) and ":" in scheme:
        fn = _import_callable(scheme)
    elif isinstance(scheme, str) and scheme in REWARD_SCHEMES:
        fn = REWARD_SCHEMES[scheme]
    else:
        valid = ", ".join(sorted(REWARD_SCHEMES))
        raise ValueError(
            f"unknown reward scheme {scheme!r}: use one of {valid}, a callable (grade, episode_stats) -> float, "
            "or a dotted path 'package.module:function'"
        )
    if "per" in kwargs and fn in (retool_reward, retool_slime_reward) and kwargs["per"] not in SHAPING_UNITS:
        raise ValueError(f"per must be one of {SHAPING_UNITS}, not {kwargs['per']!r}")
    if not kwargs:
        return fn
    try:
        inspect.signature(fn).bind_partial(None, None, **kwargs)
    except TypeError as exc:
        name = getattr(fn, "__name__", repr(fn))
        raise TypeError(f"reward scheme {name} does not take options {sorted(kwargs)}: {exc}") from exc
    except ValueError:  # no signature available (some builtins): bind and let a call fail
        pass
    return functools.partial(fn, **kwargs)
