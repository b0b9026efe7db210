"""The scripted episodes every adapter test replays, and the reference: the local environment stepped by hand.

Each adapter test plays the same action lists through its framework's interface and must get this module's
`local_reference` back: identical prompt ids, completion ids, env mask, logprobs and reward.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from retool_env import Problem, ToolEnvironment
from retool_env.rollout import Generation, run_episode

PROBLEM = Problem("What is 123 * 456?", "56088", id="p0")
LOGPROB = -0.25


def tool_call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


# Texts of each turn, per format; "<|im_end|>" is the turn's end token.
SCRIPTS: dict[str, list[str]] = {
    # one tool call, then the right answer: reward +1
    "hermes_correct": [tool_call("print(123 * 456)") + "<|im_end|>", "So the answer is \\boxed{56088}.<|im_end|>"],
    # a malformed call (answered with an error), a real call, then a wrong answer: reward min(-0.6, -1 + 0.1 * 1)
    "hermes_wrong": ["<tool_call>\n{not json}\n</tool_call><|im_end|>", tool_call("print(2 + 2)") + "<|im_end|>",
                     "It is \\boxed{4}.<|im_end|>"],
    # the paper's inline format: generation stops at </code>, the interpreter answers inline
    "retool_correct": ["Compute it.\n<code>\n```python\nprint(123 * 456)\n```\n</code>",
                       "\n<answer>\\boxed{56088}</answer><|im_end|>"],
}


def tool_format(script: str) -> str:
    return script.split("_")[0]


def make_env(tok, script: str, **kwargs) -> ToolEnvironment:
    return ToolEnvironment(tok, [PROBLEM], tool_format=tool_format(script), tool_timeout=10.0, **kwargs)


def action_ids(tok, script: str) -> list[list[int]]:
    return [tok.encode(text, add_special_tokens=False) for text in SCRIPTS[script]]


@dataclass
class Record:
    """What a trainer consumes from an episode: every adapter must reproduce it exactly."""

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float] | None
    reward: float


def local_reference(tok, script: str, **env_kwargs) -> Record:
    """The record of `script` played with `reset` and `step` on a local environment."""
    env = make_env(tok, script, **env_kwargs)
    env.reset(options={"problem": PROBLEM})
    for ids in action_ids(tok, script):
        _, _, terminated, truncated, _ = env.step({"token_ids": ids, "logprobs": [LOGPROB] * len(ids)})
        if terminated or truncated:
            break
    else:
        raise AssertionError(f"script {script} did not end the episode")
    traj = env.trajectory
    env.close()
    # A sandbox that cannot run would make every adapter agree on an error message: refuse that reference.
    assert all(call.status in ("ok", "invalid") for call in traj.tool_calls), traj.tool_calls
    return Record(traj.prompt_ids, traj.completion_ids, traj.env_mask, traj.logprobs, traj.reward)


class ScriptedEngine:
    """Plays a script turn by turn whatever the prompt, checking each prompt extends the previous one (TITO)."""

    def __init__(self, actions: Sequence[Sequence[int]], logprobs: bool = True, append_only: bool = True) -> None:
        self.actions, self.logprobs = [list(a) for a in actions], logprobs
        self.append_only = append_only  # False for sample_mode="turn", where the template rewrites the context
        self.prompts: list[list[int]] = []

    def next(self, prompt_ids: Sequence[int]) -> Generation:
        prompt_ids = list(prompt_ids)
        if self.prompts and self.append_only:
            previous = self.prompts[-1] + self.actions[len(self.prompts) - 1]
            assert prompt_ids[: len(previous)] == previous, "the next prompt must extend the last prompt + action"
        action = self.actions[len(self.prompts)]
        self.prompts.append(prompt_ids)
        return Generation(action, [LOGPROB] * len(action) if self.logprobs else None, "stop")

    async def generate(self, prompt_ids, *, max_tokens, stop_token_ids=(), stop=(), sampling=None) -> Generation:
        return self.next(prompt_ids)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_the_reference_episodes(qwen_tok, script):
    """The scripts do what their names say, and `run_episode` reproduces the hand-stepped reference."""
    import asyncio

    ref = local_reference(qwen_tok, script)
    assert ref.reward == (1.0 if script.endswith("correct") else -0.9)
    assert 0 in ref.env_mask and ref.env_mask.count(1) == sum(len(a) for a in action_ids(qwen_tok, script))
    traj = asyncio.run(run_episode(make_env(qwen_tok, script), ScriptedEngine(action_ids(qwen_tok, script)),
                                   problem=PROBLEM))
    assert Record(traj.prompt_ids, traj.completion_ids, traj.env_mask, traj.logprobs, traj.reward) == ref


# A chat template that drops each turn's reasoning from history (like DeepSeek-R1-Distill's), and episodes whose
# tool call therefore starts a new sample under sample_mode="turn": two samples per episode.
TURN_TEMPLATE = str(__import__("pathlib").Path(__file__).parent / "fixtures" / "chat_templates" /
                    "strip_reasoning.jinja")
TURN_SCRIPTS: dict[str, list[str]] = {
    "correct": ["Compute it.\n</think>\n\n" + tool_call("print(123 * 456)") + "<|im_end|>",
                "Done.\n</think>\n\n\\boxed{56088}<|im_end|>"],
    "wrong": ["Guess.\n</think>\n\n" + tool_call("print(2 + 2)") + "<|im_end|>",
              "Done.\n</think>\n\n\\boxed{4}<|im_end|>"],
}


def turn_action_ids(tok, script: str) -> list[list[int]]:
    return [tok.encode(text, add_special_tokens=False) for text in TURN_SCRIPTS[script]]


def turn_reference(tok, script: str, **env_kwargs) -> list[Record]:
    """The samples of a TURN_SCRIPTS episode played by hand on a local environment in sample_mode='turn'."""
    env = ToolEnvironment(tok, [PROBLEM], tool_format="hermes", tool_timeout=10.0, chat_template=TURN_TEMPLATE,
                          sample_mode="turn", **env_kwargs)
    env.reset(options={"problem": PROBLEM})
    for ids in turn_action_ids(tok, script):
        env.step({"token_ids": ids, "logprobs": [LOGPROB] * len(ids)})
    traj = env.trajectory
    env.close()
    assert len(traj.samples) == 2 and traj.num_tool_calls == 1
    return [Record(s.prompt_ids, s.completion_ids, s.env_mask, s.logprobs, traj.reward) for s in traj.samples]
