"""Trajectory filters for GRPO: which episodes of a group reach the loss, and with what reward.

The tool-integrated-reasoning recipes control training at the boundary between rollout and trainer:

- void-turn masking (SimpleTIR, arXiv 2509.02479): an episode with a turn that is neither a complete tool call nor
  a final answer is taken out of the loss, its reward still in its group's statistics;
- the accuracy filter (SimpleTIR's 0.1-0.9; DAPO's dynamic sampling is its (0, 1) limit): groups whose accuracy lies
  outside [low, high] teach nothing about correctness and are taken out;
- RoC down-sampling (rStar2-Agent's GRPO-RoC, arXiv 2508.20722, `rstar2_agent/down_sample/roc.py`): of 2n episodes
  of a group keep n, positives with the fewest tool errors and format issues, negatives drawn at random; groups
  whose rewards are all equal are rejected;
- sign-safe shaping (AdaTIR, arXiv 2601.14696): `retool_env.rewards.sign_safe_rewards` per group, each correct
  rollout at or above its group's mean (`True`, "above_mean") or also above every wrong one ("above_wrong").

This module decides; each trainer adapter applies the decision its framework's way (TRL masks `env_mask` and
unscores, the asynchronous worker queues fewer samples, verl's replay buffer evicts and selects, slime's dynamic
filter drops groups). No framework is imported here, so every adapter shares one rulebook.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Hashable, Sequence

from retool_env.rewards import SIGN_SAFE_GUARANTEES, sign_safe_rewards
from retool_env.trajectory import ToolStatus, Trajectory

__all__ = ["TrainingPlan", "TrajectoryFilters", "group_indices", "has_void_turn", "roc_penalty", "roc_select",
           "scored_reward"]


_MAY_BE_VOID = frozenset({"answer", "length", "max_completion_tokens"})


def has_void_turn(traj: Trajectory) -> bool:
    """Whether an episode has a void turn, as SimpleTIR defines it: neither a complete code block nor a final answer.
    A complete tool call never ends an episode on its own turn except by a budget on its result or its count
    (`observation_too_long`, `max_tool_calls`, `tool_timeout`: not void), so only a last turn that ended on its own
    or was cut off can be void, and it is when the grader extracted no answer from it: a turn cut off after it wrote
    `\\boxed{42}` is an answer. (A malformed tool call is answered with an error and counts as a tool turn.)"""
    return traj.finish_reason in _MAY_BE_VOID and traj.pred is None


def scored_reward(traj: Trajectory) -> float | None:
    """The reward an episode reaches GRPO with before any group option: None for a failed episode (no reward)."""
    if traj.aborted or not traj.completion_ids or traj.reward is None:
        return None
    return float(traj.reward)


def group_indices(keys: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """The batch's GRPO groups: the positions of each group key (a problem's `id()`, verl's `uid`, ...), in order of
    first appearance."""
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return groups


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """Per episode: the filters that take it out of the loss (`void_turn`, `accuracy`, `roc`, `roc_equal_reward`;
    empty: trained on) and the reward it reaches GRPO with (None: unscored)."""

    filters: list[list[str]]
    rewards: list[float | None]


def roc_penalty(traj: Trajectory) -> float:
    """rStar2's RoC penalty of an episode, lower is cleaner: the share of its tool calls that did not run cleanly
    (0.5 with no call, as rStar2) plus 1 for an answer format issue (here: no answer the grader could extract, the
    reading of rStar2's `<answer>` tag check for this project's extraction)."""
    statuses = [call.status for call in traj.tool_calls if call.status != ToolStatus.SKIPPED]
    error_ratio = sum(status != ToolStatus.OK for status in statuses) / len(statuses) if statuses else 0.5
    return error_ratio + (1.0 if traj.pred is None else 0.0)


def roc_select(rewards: Sequence[float], correct: Sequence[bool], penalties: Sequence[float], keep: int,
               rng: random.Random) -> set[int]:
    """The positions GRPO-RoC keeps of one group's scored episodes: `keep` of them, positives and negatives in their
    group's proportions (at least min(2, keep // 2) of each where the group has them, as rStar2's defaults),
    positives in order of the fewest tool errors and format issues (`roc_penalty`, ties by position), negatives
    drawn uniformly (the paper's "diverse" failures; rStar2's code sorts them by the same penalty). A group of
    `keep` or fewer is kept whole. `rewards` are not read beyond their count: they decide nothing here (equal-reward
    groups are rejected before)."""
    total = len(rewards)
    if total <= keep:
        return set(range(total))
    positives = sorted((i for i in range(total) if correct[i]), key=lambda i: penalties[i])
    negatives = [i for i in range(total) if not correct[i]]
    least = min(2, keep // 2)
    n_pos = round(len(positives) * keep / total)
    n_pos = max(n_pos, min(least, len(positives)))
    n_pos = min(n_pos, keep - min(least, len(negatives)))
    n_pos = max(min(n_pos, len(positives), keep), keep - len(negatives))  # then both counts fit their pools
    return set(positives[:n_pos]) | set(rng.sample(negatives, keep - n_pos))


def outside_accuracy(correct: Sequence[bool], accuracy_filter: tuple[float, float]) -> bool:
    """Whether a group's verdicts (its scored episodes') lie outside the accuracy filter's [low, high]."""
    low, high = accuracy_filter
    return bool(correct) and not low <= sum(correct) / len(correct) <= high


@dataclasses.dataclass(frozen=True)
class TrajectoryFilters:
    """The filter options, each off by default, and the plan they make of a batch of groups (see the module
    docstring for their sources). `roc_down_sample=n` keeps n of each group (generated with 2n).
    `sign_safe_shaping`: True or "above_mean" (no correct rollout below its group's mean), "above_wrong" (nor below
    any wrong one of its group); `sign_safe_rewards`' `guarantee`."""

    mask_void_turns: bool = False
    accuracy_filter: tuple[float, float] | None = None
    roc_down_sample: int | None = None
    sign_safe_shaping: bool | str = False

    def __post_init__(self) -> None:
        if self.sign_safe_shaping not in (False, True, *SIGN_SAFE_GUARANTEES):
            raise ValueError(f"sign_safe_shaping must be True, False or one of {SIGN_SAFE_GUARANTEES}, not "
                             f"{self.sign_safe_shaping!r}")
        if self.accuracy_filter is not None:
            low, high = self.accuracy_filter
            if not 0.0 <= low <= high <= 1.0:
                raise ValueError(f"accuracy_filter must be (low, high) with 0 <= low <= high <= 1, not "
                                 f"{self.accuracy_filter}")
            object.__setattr__(self, "accuracy_filter", (float(low), float(high)))
        if self.roc_down_sample is not None and self.roc_down_sample < 2:
            raise ValueError(f"roc_down_sample keeps n >= 2 episodes per group (of 2n generated), not "
                             f"{self.roc_down_sample}")

    def is_outside_accuracy(self, correct: Sequence[bool]) -> bool:
        """Whether one group of verdicts (its scored episodes') is outside `accuracy_filter` (False when off)."""
        return self.accuracy_filter is not None and outside_accuracy(correct, self.accuracy_filter)

    def groups_outside_accuracy(self, trajectories: Sequence[Trajectory], keys: Sequence[Hashable]) -> set[Hashable]:
        """The group keys whose groups `accuracy_filter` takes out of the loss (accuracy over scored episodes)."""
        if self.accuracy_filter is None:
            return set()
        verdicts: dict[Hashable, list[bool]] = {}
        for traj, key in zip(trajectories, keys, strict=True):
            if not traj.aborted and traj.completion_ids:
                verdicts.setdefault(key, []).append(bool(traj.correct))
        return {key for key, group in verdicts.items() if outside_accuracy(group, self.accuracy_filter)}

    def plan(self, trajectories: Sequence[Trajectory], keys: Sequence[Hashable], *, roc_seed: int = 0) -> TrainingPlan:
        """What reaches GRPO of each episode: the filters that take it out of the loss, and its reward (None:
        unscored, left out of its group's statistics). RoC's dropped episodes are unscored; the others filtered keep
        their reward (in their group's statistics, out of the loss)."""
        filters: list[list[str]] = [[] for _ in trajectories]
        rewards = [scored_reward(t) for t in trajectories]
        outside = self.groups_outside_accuracy(trajectories, keys)
        for i, (traj, key) in enumerate(zip(trajectories, keys, strict=True)):
            if rewards[i] is not None and self.mask_void_turns and has_void_turn(traj):
                filters[i].append("void_turn")
            if rewards[i] is not None and key in outside:
                filters[i].append("accuracy")
        groups = group_indices(keys)
        if self.roc_down_sample is not None:
            rng = random.Random(roc_seed)
            for group in groups.values():
                scored = [i for i in group if rewards[i] is not None]
                if len({rewards[i] for i in scored}) == 1:  # equal rewards: no signal, rejected
                    for i in scored:
                        filters[i].append("roc_equal_reward")
                    continue
                kept = roc_select([float(rewards[i] or 0.0) for i in scored],
                                  [bool(trajectories[i].correct) for i in scored],
                                  [roc_penalty(trajectories[i]) for i in scored], self.roc_down_sample, rng)
                for position, i in enumerate(scored):
                    if position not in kept:
                        filters[i].append("roc")
                        rewards[i] = None
        if self.sign_safe_shaping:
            guarantee = "above_mean" if self.sign_safe_shaping is True else str(self.sign_safe_shaping)
            for group in groups.values():
                clipped = sign_safe_rewards([rewards[i] for i in group], [trajectories[i].correct for i in group],
                                            guarantee=guarantee)
                for i, reward in zip(group, clipped, strict=True):
                    rewards[i] = reward
        return TrainingPlan(filters=filters, rewards=rewards)
