"""The TRL adapter and training/grpo_trl.py, on CPU with real parts: a tiny Qwen2 taught to call the interpreter,
the real sandbox, Hugging Face generation through the trainer's own policy, and TRL's real GRPOTrainer (in process,
to inspect the loss mask it uses, and once through `accelerate launch`, with LoRA).

The only injected fault is a generator that fails on purpose, to check that a failed episode is never trained on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import types
from collections import defaultdict
from pathlib import Path

import pytest
import torch
import yaml
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer

from retool_adapters.trl import (
    REWARD_FUNCS,
    REWARD_WEIGHTS,
    ReToolRollout,
    correctness,
    env_reward,
    episode_metrics,
    index_problems,
    problems_to_dataset,
    question_of,
    sampling_from_config,
    trl_end_tokens,
)
from retool_adapters.trl.rollout import _colocated_engine
from retool_adapters.trl.testing import build_tool_calling_qwen
from retool_env.data import Problem, load_problems
from retool_env.formats import make_format
from retool_env.rollout import Generation
from retool_env.trajectory import ToolCallRecord, Trajectory

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "training" / "grpo_trl.py"
CONFIGS = ROOT / "training" / "configs"
TINY_CONFIG = CONFIGS / "grpo_tiny_cpu.yaml"
TEMPERATURE = 0.7


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


@pytest.fixture(scope="module")
def problems() -> list[Problem]:
    return load_problems("arith", split="train", limit=2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, problems) -> Path:
    return build_tool_calling_qwen(tmp_path_factory.mktemp("tool_qwen"), problems)


@pytest.fixture(scope="module")
def policy(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)


def trainer_like(model, tokenizer, **config):
    """What ReToolRollout reads from a GRPOTrainer, around a real model and a real CPU Accelerator."""
    args = {"use_vllm": False, "vllm_mode": "colocate", "temperature": TEMPERATURE, "top_p": 1.0, "top_k": 0,
            "min_p": None, "repetition_penalty": 1.0, "max_completion_length": 128,
            "ds3_gather_for_generation": True, "gradient_checkpointing_kwargs": None, "seed": 42, **config}
    metrics = defaultdict(list)
    return types.SimpleNamespace(
        args=types.SimpleNamespace(**args), accelerator=Accelerator(cpu=True), model=model, model_wrapped=model,
        processing_class=tokenizer, eos_token_ids=[tokenizer.eos_token_id], metrics=metrics,
        state=types.SimpleNamespace(global_step=0),
        _log_metric=lambda name, value: metrics[name].append(value),
    )


class FailingFirstTurns:
    """Wraps a real generator and fails the first `failures` first turns of one problem (an injected fault)."""

    def __init__(self, generator, prompt_ids: list[int], failures: int) -> None:
        self.generator, self.prompt_ids, self.failures = generator, list(prompt_ids), failures

    async def generate(self, prompt_ids, **kwargs) -> Generation:
        if list(prompt_ids) == self.prompt_ids and self.failures > 0:
            self.failures -= 1
            raise RuntimeError("injected generator failure")
        return await self.generator.generate(prompt_ids, **kwargs)


class FaultyRollout(ReToolRollout):
    """The real rollout, generating through the trainer's own backend wrapped in `FailingFirstTurns`."""

    def __init__(self, problems, *, failing: Problem, failures: int, **kwargs) -> None:
        super().__init__(problems, **kwargs)
        self.failing, self.failures = failing, failures
        self.outputs: list[dict] = []

    @contextlib.contextmanager
    def _generation_backend(self, trainer, concurrency):
        prompt_ids = self._prompt_ids(self.failing, self._env_factory(trainer))
        with super()._generation_backend(trainer, concurrency) as generator:
            yield FailingFirstTurns(generator, prompt_ids, self.failures)

    def __call__(self, prompts, trainer):
        output = super().__call__(prompts, trainer)
        self.outputs.append(output)
        return output


def prompt_ids_of(rollout: ReToolRollout, problem: Problem, tokenizer) -> list[int]:
    from retool_env.env import ToolEnvironment

    env = ToolEnvironment(tokenizer, [problem], **{k: v for k, v in rollout.env_kwargs.items() if k == "tool_format"})
    return env.reset(options={"problem": problem})[0].tolist()


def mask_of(completion_ids: list[int], observation: list[int]) -> list[int] | None:
    """The expected env_mask of an episode with one tool call: 0 on the observation's tokens, 1 elsewhere."""
    for start in range(len(completion_ids) - len(observation) + 1):
        if completion_ids[start : start + len(observation)] == observation:
            return [1] * start + [0] * len(observation) + [1] * (len(completion_ids) - start - len(observation))
    return None


# ------------------------------------------------------------------------------------------------ the rollout
def test_rollout_returns_trl_fields_with_real_logprobs_and_env_mask(policy, problems):
    model, tokenizer = policy
    trainer = trainer_like(model.train(), tokenizer)
    rollout = ReToolRollout(problems, max_tool_calls=2)
    prompts = [p.question for p in problems for _ in range(3)]  # TRL repeats each prompt num_generations times
    out = rollout(prompts, trainer)

    assert set(out) >= {"prompt_ids", "completion_ids", "logprobs", "env_mask", "env_reward", "correct",
                        "num_tool_calls", "num_turns", "truncated", "aborted"}
    assert all(len(values) == len(prompts) for values in out.values())
    for i, problem in enumerate(p for p in problems for _ in range(3)):
        assert out["prompt_ids"][i] == prompt_ids_of(rollout, problem, tokenizer)  # in order, mapped to its problem
        ids, logprobs, mask = out["completion_ids"][i], out["logprobs"][i], out["env_mask"][i]
        assert len(ids) == len(logprobs) == len(mask)
        assert mask[0] == 1 and (mask[-1] == 1 or out["truncated"][i])  # the model opens and closes the episode
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
        # The logprobs are the policy's own, token for token: teacher-force the episode and compare.
        sequence = torch.tensor([out["prompt_ids"][i] + ids])
        with torch.no_grad():
            logits = model(sequence).logits[0, len(out["prompt_ids"][i]) - 1 : -1] / TEMPERATURE
        expected = logits.log_softmax(-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
        model_positions = torch.tensor(mask, dtype=torch.bool)
        torch.testing.assert_close(torch.tensor(logprobs)[model_positions], expected[model_positions],
                                   atol=1e-4, rtol=1e-4)
    # Sampled episodes: the taught model almost always calls once (interpreter tokens, mask 0), then answers 42.
    assert sum(0 in mask for mask in out["env_mask"]) >= 5 and out["num_tool_calls"].count(1) >= 5
    assert out["aborted"] == [False] * 6 and out["correct"] == [False] * 6
    for calls, reward in zip(out["num_tool_calls"], out["env_reward"], strict=True):
        assert reward == pytest.approx(min(-0.6, -1 + 0.1 * calls))  # the environment's ReTool reward, wrong answer
    assert model.training  # generation ran in eval mode and put the policy back
    assert trainer.metrics["retool/tool_calls_per_episode"] == [float(k) for k in out["num_tool_calls"]]
    assert len(trainer.metrics["retool/tool_error_rate"]) == sum(out["num_tool_calls"])  # one value per call
    assert env_reward([""] * 6, **{k: v for k, v in out.items() if k != "env_reward"},
                      env_reward=out["env_reward"]) == out["env_reward"]
    assert correctness([""] * 6, correct=out["correct"]) == [0.0] * 6


def test_rollouts_are_seeded_by_the_config_seed_the_step_and_the_call(policy, problems):
    """A rerun samples the same episodes; another seed, step or call of the same step samples others."""
    model, tokenizer = policy
    prompts = [p.question for p in problems for _ in range(4)]
    hot = 4.0  # the taught policy is near-deterministic at its usual temperature

    def completions(rollout, trainer):
        return rollout(prompts, trainer)["completion_ids"]

    trainer = trainer_like(model, tokenizer, temperature=hot)
    first = ReToolRollout(problems, max_tool_calls=2)
    at_step0 = completions(first, trainer)
    again_at_step0 = completions(first, trainer)  # a second rollout in the same step (evaluation, say)
    rerun = completions(ReToolRollout(problems, max_tool_calls=2), trainer_like(model, tokenizer, temperature=hot))
    assert rerun == at_step0 != again_at_step0
    other_seed = completions(ReToolRollout(problems, max_tool_calls=2),
                             trainer_like(model, tokenizer, temperature=hot, seed=7))
    assert other_seed != at_step0
    trainer.state.global_step = 1
    assert completions(first, trainer) not in (at_step0, again_at_step0)


def test_failed_episode_is_a_masked_unscored_stand_in(policy, problems):
    model, tokenizer = policy
    trainer = trainer_like(model, tokenizer)
    rollout = FaultyRollout(problems, failing=problems[1], failures=2, max_tool_calls=2)
    prompts = [p.question for p in problems for _ in range(3)]
    out = rollout(prompts, trainer)

    assert out["aborted"] == [False, False, False, True, True, False]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for i in (3, 4):
        assert out["prompt_ids"][i] == prompt_ids_of(rollout, problems[1], tokenizer)
        assert out["completion_ids"][i] == [end] and out["env_mask"][i] == [0] and out["logprobs"][i] == [0.0]
        assert out["env_reward"][i] is None and out["correct"][i] is None
    assert out["finish_reason"][3].startswith("aborted") and "injected" in out["finish_reason"][3]
    scores = env_reward([""] * 6, env_reward=out["env_reward"])
    assert scores[3] is None and scores[4] is None and scores[5] == out["env_reward"][5] < 0
    assert trainer.metrics["retool/aborted"] == [0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert len(trainer.metrics["retool/accuracy"]) == 4  # failed episodes count only as aborted

    everything_fails = FaultyRollout(problems[1:], failing=problems[1], failures=10, max_tool_calls=2)
    with pytest.raises(RuntimeError, match="every episode of the batch failed"):
        everything_fails([problems[1].question] * 2, trainer)


def test_prompts_map_back_to_their_problems(problems):
    rollout = ReToolRollout(problems)
    question = problems[0].question
    assert rollout.problem_for(question) is problems[0]
    assert rollout.problem_for([{"role": "system", "content": "s"}, {"role": "user", "content": question}]) \
        is problems[0]
    with pytest.raises(KeyError, match="not one of ReToolRollout's 2 problems"):
        rollout.problem_for("What is 1 + 1?")
    with pytest.raises(TypeError):
        question_of([{"role": "assistant", "content": question}])
    same = dataclasses.replace(problems[0], id="copy")
    assert index_problems([problems[0], same])[question] is problems[0]  # the same problem twice is fine
    with pytest.raises(ValueError, match="appears with two answers"):
        index_problems([problems[0], dataclasses.replace(problems[0], answer="-1")])
    dataset = problems_to_dataset(problems)
    assert dataset["prompt"] == [p.question for p in problems] and dataset["answer"] == [p.answer for p in problems]


def test_sampling_follows_grpo_config():
    config = types.SimpleNamespace(temperature=0.6, top_p=0.9, top_k=0, min_p=None, repetition_penalty=1.0)
    sampling = sampling_from_config(config)
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.6, 0.9, -1)  # TRL's 0 is vLLM's -1: off
    assert sampling_from_config(types.SimpleNamespace(**{**vars(config), "top_k": 20})).top_k == 20
    with pytest.raises(ValueError, match="repetition_penalty"):
        sampling_from_config(types.SimpleNamespace(**{**vars(config), "repetition_penalty": 1.1}))


def test_tool_rates_are_pooled_over_calls_and_aborts_counted_apart():
    def episode(*statuses: str) -> Trajectory:
        traj = Trajectory(prompt_ids=[1], finish_reason="answer")
        traj.append_model([5, 6], [-0.1, -0.2])
        traj.tool_calls = [ToolCallRecord("print(1)", "", status) for status in statuses]
        traj.correct = traj.strict_correct = False
        return traj

    aborted = Trajectory(prompt_ids=[], finish_reason="aborted: boom")
    metrics = episode_metrics([episode("ok", "timeout", "error"), episode("ok"), episode("invalid", "skipped"),
                               aborted])
    assert metrics["retool/aborted"] == [0.0, 0.0, 0.0, 1.0]
    assert metrics["retool/tool_calls_per_episode"] == [3.0, 1.0, 0.0]  # invalid and skipped calls did not run
    assert sum(metrics["retool/tool_error_rate"]) / len(metrics["retool/tool_error_rate"]) == 3 / 5
    assert metrics["retool/tool_timeout_rate"] == [0.0, 1.0, 0.0, 0.0, 0.0]
    assert "retool/tool_error_rate" not in episode_metrics([episode()])  # no calls: no rate, not a rate of 0


def test_colocated_vllm_is_woken_for_the_rollout_and_put_back_to_sleep():
    """vLLM cannot run in this venv (tests/vllm runs the server path), so a recording stand-in for TRL's
    VLLMGeneration checks the sleep-mode protocol TRL's own colocate generation follows."""
    calls = []

    class Engine:
        def wake_up(self, tags):
            calls.append(("wake_up", tags))

        def sleep(self, level):
            calls.append(("sleep", level))

    class VLLMGeneration:
        tensor_parallel_size, enable_sleep_mode, _llm_weights_sleeping, llm = 1, True, True, Engine()

        def sync_weights(self):  # TRL's sync wakes the weights before loading them
            calls.append("sync_weights")
            self._llm_weights_sleeping = False

    trainer = types.SimpleNamespace(vllm_generation=VLLMGeneration())
    with _colocated_engine(trainer) as engine:
        assert engine is trainer.vllm_generation.llm
        calls.append("generate")
    # Asleep at level 2 the engine had dropped its weights: they are pushed again before generating.
    assert calls == ["sync_weights", ("wake_up", ["kv_cache"]), "generate", ("sleep", 2)]
    assert trainer.vllm_generation._llm_weights_sleeping
    trainer.vllm_generation.tensor_parallel_size = 2
    with pytest.raises(NotImplementedError, match="server"), _colocated_engine(trainer):
        pass


def test_the_last_token_tells_trl_what_the_environment_decided(policy):
    """TRL reads a completion as truncated when its last token is neither eos nor pad; the closing token makes that
    the environment's verdict, in both directions, and carries no loss."""
    from retool_adapters.trl import TRLEndTokens

    _, tokenizer = policy
    ends = trl_end_tokens(trainer_like(None, tokenizer))
    im_end, endoftext = (tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
    assert ends.end_ids == {tokenizer.eos_token_id, tokenizer.pad_token_id}
    assert tokenizer.decode([ends.marker_id]) == "\n"

    def closing(ends, last, truncated):
        return ends.closing(Trajectory(prompt_ids=[1], completion_ids=[5, last], truncated=truncated))

    assert closing(ends, im_end, truncated=True) == [ends.marker_id]  # cut off at max_tool_calls after <|im_end|>
    assert closing(ends, im_end, truncated=False) == []
    assert closing(ends, 5, truncated=True) == []  # cut off mid-turn: TRL already sees it
    # A base model's eos is <|endoftext|>: a finished hermes episode ends with <|im_end|>, which TRL would clip.
    base = TRLEndTokens(end_ids=frozenset({endoftext}), eos_id=endoftext, marker_id=ends.marker_id)
    assert closing(base, im_end, truncated=False) == [endoftext] and closing(base, im_end, truncated=True) == []


def test_void_turns_are_the_turns_with_neither_a_call_nor_an_answer():
    from retool_adapters.trl import has_void_turn

    def traj(finish_reason, pred=None):
        return Trajectory(prompt_ids=[1], completion_ids=[5], finish_reason=finish_reason, pred=pred)

    assert has_void_turn(traj("length")) and has_void_turn(traj("max_completion_tokens"))
    assert has_void_turn(traj("answer", pred=None)) and not has_void_turn(traj("answer", pred="4"))
    assert not has_void_turn(traj("max_tool_calls"))  # it wrote a complete call, one too many


def test_the_accuracy_filter_masks_groups_outside_its_range(problems):
    def traj(problem, correct, aborted=False):
        return Trajectory(prompt_ids=[1], completion_ids=[] if aborted else [5, 6], env_mask=[] if aborted else [1, 1],
                          logprobs=[] if aborted else [-0.1, -0.2], correct=correct, reward=1.0 if correct else -1.0,
                          finish_reason="aborted: x" if aborted else "answer", pred="1", problem_id=problem.id)

    a, b = problems
    group_a = [traj(a, True), traj(a, True), traj(a, True), traj(a, False, aborted=True)]  # all scored ones right
    group_b = [traj(b, True), traj(b, False), traj(b, False), traj(b, False)]  # 0.25
    trajectories, batch = group_a + group_b, [a] * 4 + [b] * 4
    rollout = ReToolRollout(problems, accuracy_filter=(0.1, 0.9))
    assert rollout.groups_outside_accuracy(trajectories, batch) == {id(a)}
    rollout._prompt_env = types.SimpleNamespace(format=types.SimpleNamespace(end_token_ids=[7]))  # no env needed
    out = rollout.to_rollout_output(trajectories, batch, lambda: None)
    assert out["env_mask"][:3] == [[0, 0]] * 3 and out["env_mask"][4:] == [[1, 1]] * 4
    assert out["env_reward"][:3] == [1.0] * 3  # still scored: the group's statistics are unchanged
    assert ReToolRollout(problems).groups_outside_accuracy(trajectories, batch) == set()
    with pytest.raises(ValueError, match="accuracy_filter"):
        ReToolRollout(problems, accuracy_filter=(0.9, 0.1))


def scripted(correct: bool, statuses: list[str] = (), pred: str | None = "1", reward: float | None = None,
             problem_id: str = "") -> Trajectory:
    """A finished trajectory with the given verdict and tool-call statuses (a scripted group member)."""
    return Trajectory(prompt_ids=[1], completion_ids=[5, 6], env_mask=[1, 1], logprobs=[-0.1, -0.2], correct=correct,
                      reward=(1.0 if correct else -1.0) if reward is None else reward, finish_reason="answer",
                      pred=pred, problem_id=problem_id,
                      tool_calls=[ToolCallRecord("x", "", status) for status in statuses])


def test_roc_keeps_clean_positives_and_random_negatives_and_rejects_equal_groups(problems):
    import random

    from retool_adapters.trl import roc_penalty, roc_select

    assert roc_penalty(scripted(True)) == 0.5  # no call: rStar2's 0.5
    assert roc_penalty(scripted(True, ["ok", "error"])) == 0.5
    assert roc_penalty(scripted(True, ["ok", "ok", "skipped"])) == 0.0
    assert roc_penalty(scripted(False, ["timeout"], pred=None)) == 2.0
    # 8 of a group: 4 positives (penalties 0.5, 0, 1, 0.25), 4 negatives; keep 4: 2 and 2.
    penalties = [0.5, 0.0, 1.0, 0.25, 0, 0, 0, 0]
    correct = [True] * 4 + [False] * 4
    kept = roc_select([1.0] * 8, correct, penalties, 4, random.Random(0))
    assert len(kept) == 4 and kept & {0, 1, 2, 3} == {1, 3} and len(kept & {4, 5, 6, 7}) == 2
    draws = {frozenset(roc_select([1.0] * 8, correct, penalties, 4, random.Random(seed)) - {1, 3})
             for seed in range(40)}
    assert len(draws) > 3  # negatives are drawn, not ranked
    # Proportions, with at least min(2, keep // 2) of a kind where there are enough: 1 positive of 8, keep 4.
    one_right = [True] + [False] * 7
    assert 0 in roc_select([0.0] * 8, one_right, [0.0] * 8, 4, random.Random(0))
    assert len(roc_select([0.0] * 8, [True] * 6 + [False] * 2, [0.0] * 8, 4, random.Random(0)) & {6, 7}) == 2
    assert roc_select([0.0] * 3, [True, False, False], [0.0] * 3, 4, random.Random(0)) == {0, 1, 2}

    a, b = problems
    group_a = [scripted(True, ["ok", "error"]), scripted(True, ["ok"]), scripted(False), scripted(False, ["ok"])]
    group_b = [scripted(False, reward=-1.0) for _ in range(4)]  # equal rewards: rejected
    rollout = ReToolRollout(problems, roc_down_sample=2)
    rollout._prompt_env = types.SimpleNamespace(format=types.SimpleNamespace(end_token_ids=[7]))  # no env needed
    plan = rollout.training_plan(group_a + group_b, [a] * 4 + [b] * 4, roc_seed=1)
    assert plan.filters[:2] == [["roc"], []] and sorted(map(tuple, plan.filters[2:4])) == [(), ("roc",)]
    assert plan.filters[4:] == [["roc_equal_reward"]] * 4
    out = rollout.to_rollout_output(group_a + group_b, [a] * 4 + [b] * 4, lambda: None, plan=plan)
    dropped = [i for i in range(4) if plan.filters[i]]
    for i in range(8):
        assert out["env_mask"][i] == ([0, 0] if plan.filters[i] else [1, 1])
        assert (out["env_reward"][i] is None) == (out["correct"][i] is None) == (i in dropped)  # unscored
    assert out["env_reward"][4:] == [-1.0] * 4  # rejected groups keep their (equal) rewards: advantage 0 anyway
    with pytest.raises(ValueError, match="roc_down_sample"):
        ReToolRollout(problems, roc_down_sample=1)


def test_sign_safe_shaping_lifts_correct_rewards_of_each_group(problems):
    a, b = problems
    trajectories = [scripted(True, reward=1.0), scripted(True, reward=1.0), scripted(True, reward=0.0),
                    scripted(False, reward=-1.0), scripted(True, reward=0.7), scripted(True, reward=0.9)]
    batch = [a] * 4 + [b] * 2
    rewards = ReToolRollout(problems, sign_safe_shaping=True).training_plan(trajectories, batch).rewards
    assert rewards[:2] == [1.0, 1.0] and rewards[2] == pytest.approx(0.5, abs=1e-5) and rewards[2] > 0.5
    assert rewards[3] == -1.0
    assert rewards[4:] == [0.9, 0.9]  # all right: no shaping within the group
    assert ReToolRollout(problems).training_plan(trajectories, batch).rewards == [t.reward for t in trajectories]


class ScriptedGenerator:
    """A `Generator` that writes scripted turns: each new episode takes the next script (cycling), each later turn
    of it the script's next text. Its logprobs are a constant; the tokens go through the real environment."""

    def __init__(self, tokenizer, scripts: list[list[str]]) -> None:
        self.tokenizer, self.scripts, self.next_script = tokenizer, scripts, 0
        self.pending: dict[tuple[int, ...], list[str]] = {}  # prompt + the turn written -> the turns left

    async def generate(self, prompt_ids, *, max_tokens, stop_token_ids=(), stop=(), sampling=None) -> Generation:
        prompt = tuple(prompt_ids)
        known = [key for key in self.pending if prompt[:len(key)] == key]
        if known:
            turns = self.pending.pop(max(known, key=len))
        else:
            turns = list(self.scripts[self.next_script % len(self.scripts)])
            self.next_script += 1
        ids = self.tokenizer.encode(turns[0], add_special_tokens=False) + [stop_token_ids[0]]
        if turns[1:]:
            self.pending[prompt + tuple(ids)] = turns[1:]
        return Generation(ids, [-1.0] * len(ids), "stop")


def call(code: str) -> str:
    return '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "' + code + '"}}\n</tool_call>'


SIX_SEVENS = Problem(question="What is 6 times 7?", answer="42", id="six-sevens")


@pytest.mark.parametrize("option", ["roc_down_sample", "sign_safe_shaping", "on_timeout"])
def test_grpo_trainer_trains_on_what_the_options_leave_and_records_every_episode(model_dir, tmp_path, monkeypatch,
                                                                                  option):
    """Scripted groups of 4 through the real environment and GRPOTrainer, two steps, records on: RoC keeps 2 of each
    4 (the dropped ones reach the loss with no token and no advantage; the rest get advantages of their own pair);
    sign-safe shaping leaves no correct episode a negative advantage where a flat tool cost would; `on_timeout="abort"`
    ends an episode at its slow call, truncated as TRL sees it; every episode is recorded and `regrade` reproduces
    every reward."""
    from trl import GRPOConfig, GRPOTrainer

    from retool_env.records import read_records, regrade

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if option == "roc_down_sample":
        scripts = [[call("1 / 0"), call("print(6 * 7)"), "So \\boxed{42}."],  # right, one error of two calls
                   [call("print(7 * 6)"), "So \\boxed{42}."],                  # right, clean: RoC keeps it
                   ["It is \\boxed{41}."],                                     # wrong
                   [call("print(40)"), "It is \\boxed{40}."]]                  # wrong
        options, reward_kwargs = {"roc_down_sample": 2}, {}
    elif option == "on_timeout":
        scripts = [[call("while True: pass"), "\\boxed{42}"], ["\\boxed{42}"], ["So: \\boxed{42}"],
                   ["\\boxed{41}"]]
        options, reward_kwargs = {"on_timeout": "abort", "tool_timeout": 0.5}, {}
    else:
        scripts = [["\\boxed{42}"], ["So: \\boxed{42}"],
                   [call("print(6 * 7)"), call("print(42)"), "\\boxed{42}"],  # right, but 2 calls cost 1.0
                   ["\\boxed{41}"]]
        options, reward_kwargs = {"sign_safe_shaping": True}, {"tool_call_cost": 0.5}
    outputs, loss_inputs = [], []

    class Recorded(ReToolRollout):
        def __call__(self, prompts, trainer):
            outputs.append(super().__call__(prompts, trainer))
            return outputs[-1]

    records_path = tmp_path / "records.jsonl"
    rollout = Recorded([SIX_SEVENS], generator=ScriptedGenerator(tokenizer, scripts), max_tool_calls=4,
                       reward_kwargs=reward_kwargs, records_path=records_path, **options)
    args = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False, seed=0, max_steps=2,
        per_device_train_batch_size=4, num_generations=4, max_completion_length=256, learning_rate=1e-4,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, reward_weights=list(REWARD_WEIGHTS),
    )
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=list(REWARD_FUNCS), args=args,
                          train_dataset=problems_to_dataset([SIX_SEVENS]), processing_class=tokenizer,
                          rollout_func=rollout)
    compute_loss = trainer._compute_loss

    def capturing_compute_loss(model, inputs):
        loss_inputs.append({key: inputs[key].detach().clone()
                            for key in ("completion_ids", "completion_mask", "tool_mask", "advantages")})
        return compute_loss(model, inputs)

    trainer._compute_loss = capturing_compute_loss
    trainer.train()

    assert len(outputs) == len(loss_inputs) == 2
    for out, inputs in zip(outputs, loss_inputs, strict=True):
        texts = [tokenizer.decode(ids) for ids in out["completion_ids"]]
        rows = {}  # the loss batch's rows by their completion text (TRL may shuffle the batch)
        for row in range(len(inputs["completion_ids"])):
            length = int(inputs["completion_mask"][row].sum())
            rows[tokenizer.decode(inputs["completion_ids"][row, :length].tolist())] = row
        advantage = {i: inputs["advantages"][rows[text]].item() for i, text in enumerate(texts)}
        trained = {i: bool((inputs["completion_mask"] * inputs["tool_mask"])[rows[text]].any())
                   for i, text in enumerate(texts)}
        if option == "roc_down_sample":
            kept = [i for i, reward in enumerate(out["env_reward"]) if reward is not None]
            assert len(kept) == 2 and [trained[i] for i in range(4)] == [i in kept for i in range(4)]
            clean = next(i for i, text in enumerate(texts) if "7 * 6" in text)
            assert clean in kept and out["correct"][clean]  # the positive with no tool error
            assert all(advantage[i] == 0.0 for i in range(4) if i not in kept)
            (negative,) = [i for i in kept if i != clean]
            assert advantage[clean] > 0 > advantage[negative]
            assert advantage[clean] == pytest.approx(-advantage[negative])  # normalised over the pair alone
        elif option == "on_timeout":  # the slow call ended the episode: truncated for TRL, wrong, trained on
            slow = next(i for i, text in enumerate(texts) if "while True" in text)
            assert out["finish_reason"][slow] == "tool_timeout" and out["truncated"][slow]
            assert "tool_response" not in texts[slow] and out["env_reward"][slow] == pytest.approx(-0.9)
            assert trained[slow] and advantage[slow] < 0
            assert out["completion_ids"][slow][-1] not in (tokenizer.eos_token_id, tokenizer.pad_token_id)
        else:
            costly = next(i for i, text in enumerate(texts) if "print(42)" in text)
            assert out["correct"][costly] and out["num_tool_calls"][costly] == 2
            assert all(advantage[i] >= 0 for i in range(4) if out["correct"][i])
            assert advantage[costly] > 0 and all(trained.values())
            raw = [1.0, 1.0, 0.0, -1.0]  # what it would have been without the option: a sign reversal
            assert raw[2] < sum(raw) / 4
    records = list(read_records(records_path))
    assert len(records) == 8 and [r["policy_version"] for r in records] == [0] * 4 + [1] * 4
    assert [r["trained_reward"] for r in records] == [r for out in outputs for r in out["env_reward"]]
    for record, mask in zip(records, [m for out in outputs for m in out["env_mask"]], strict=True):
        assert record["env_mask"] == mask[:len(record["env_mask"])] and len(record["env_mask"]) == len(
            record["completion_ids"])
        assert bool(record["filtered"]) == (not any(mask))
    assert all(r["seed"] is not None and r["tool_calls"] is not None for r in records)
    report = regrade(records, "default")
    assert report.regraded == 8 and report.reward_mismatches == 0 and report.verdict_changes == 0
    (logged, *_) = [entry for entry in trainer.state.log_history if "retool/parse_failure_rate" in entry]
    assert logged["retool/parse_failure_rate"] == (0.25 if option == "on_timeout" else 0.0)  # no answer written
    if option == "roc_down_sample":
        assert logged["retool/roc_dropped"] == 0.5 and logged["retool/roc_rejected_groups"] == 0.0


# ---------------------------------------------------------------------------------------- the real GRPOTrainer
@pytest.mark.parametrize("option", ["mask_void_turns", "accuracy_filter"])
def test_grpo_trainer_masks_episodes_with_a_void_turn(model_dir, problems, tmp_path, monkeypatch, option):
    """SimpleTIR's filters: episodes cut off mid-turn (void, and wrong) reach the loss with no trained token, still
    scored."""
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    outputs, loss_inputs = [], []

    class Recorded(ReToolRollout):
        def __call__(self, prompts, trainer):
            outputs.append(super().__call__(prompts, trainer))
            return outputs[-1]

    args = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False, seed=0, max_steps=1,
        per_device_train_batch_size=4, num_generations=4, max_completion_length=128, temperature=TEMPERATURE,
        learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        reward_weights=list(REWARD_WEIGHTS),
    )
    # A turn budget shorter than the taught model's tool call: every episode is cut off in its first turn, void and
    # wrong (accuracy 0, outside the filter's 0.1-0.9).
    options = {"mask_void_turns": True} if option == "mask_void_turns" else {"accuracy_filter": (0.1, 0.9)}
    rollout = Recorded(problems, max_turn_tokens=6, **options)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=list(REWARD_FUNCS), args=args,
                          train_dataset=problems_to_dataset(problems[:1]), processing_class=tokenizer,
                          rollout_func=rollout)
    compute_loss = trainer._compute_loss

    def capturing_compute_loss(model, inputs):
        loss_inputs.append({key: inputs[key].detach().clone() for key in ("completion_mask", "tool_mask")})
        return compute_loss(model, inputs)

    trainer._compute_loss = capturing_compute_loss
    trainer.train()

    (out,), (inputs,) = outputs, loss_inputs
    assert out["finish_reason"] == ["length"] * 4 and all(r is not None for r in out["env_reward"])
    assert all(not any(mask) for mask in out["env_mask"])
    assert not (inputs["completion_mask"] * inputs["tool_mask"]).any()
    (logged,) = [entry for entry in trainer.state.log_history if "retool/void_turn_ratio" in entry]
    assert logged["retool/void_turn_ratio"] == 1.0
    assert logged.get("retool/filtered_groups") == (1.0 if option == "accuracy_filter" else None)
    # Off (the default), the same episodes train on their model tokens.
    kept = ReToolRollout(problems, max_turn_tokens=6).to_rollout_output(
        [Trajectory(prompt_ids=[1], completion_ids=[5, 6], env_mask=[1, 1], logprobs=[-0.1, -0.2],
                    finish_reason="length", truncated=True)], problems[:1], lambda: None)
    assert kept["env_mask"] == [[1, 1]]



def test_grpo_trainer_sees_the_environments_truncation(model_dir, problems, tmp_path, monkeypatch):
    """Episodes the environment ends at `max_tool_calls` close with the model's <|im_end|>: TRL's own
    `completions/clipped_ratio` counts them and `mask_truncated_completions` keeps them out of the loss."""
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    outputs = []

    class Recorded(ReToolRollout):
        def __call__(self, prompts, trainer):
            outputs.append(super().__call__(prompts, trainer))
            return outputs[-1]

    args = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False, seed=0, max_steps=1,
        per_device_train_batch_size=4, num_generations=4, max_completion_length=128, temperature=TEMPERATURE,
        learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        reward_weights=list(REWARD_WEIGHTS), mask_truncated_completions=True,
    )
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=list(REWARD_FUNCS), args=args,
                          train_dataset=problems_to_dataset(problems[:1]), processing_class=tokenizer,
                          rollout_func=Recorded(problems, max_tool_calls=0))  # the taught model's call is one too many
    loss_inputs = []
    compute_loss = trainer._compute_loss

    def capturing_compute_loss(model, inputs):
        loss_inputs.append({key: inputs[key].detach().clone() for key in ("completion_mask", "tool_mask")})
        return compute_loss(model, inputs)

    trainer._compute_loss = capturing_compute_loss
    trainer.train()

    (out,) = outputs
    cut = [i for i, reason in enumerate(out["finish_reason"]) if reason == "max_tool_calls"]
    assert cut and all(out["truncated"][i] for i in cut)
    for i in cut:  # the model's own tokens, its <|im_end|> included, then the closing "\n" with no loss
        ids = out["completion_ids"][i]
        assert ids[-2] == tokenizer.convert_tokens_to_ids("<|im_end|>") and tokenizer.decode(ids[-1:]) == "\n"
        assert out["env_mask"][i][-1] == 0 and out["logprobs"][i][-1] == 0.0
    (logged,) = [entry for entry in trainer.state.log_history if "completions/clipped_ratio" in entry]
    assert logged["completions/clipped_ratio"] == pytest.approx(len(cut) / len(out["truncated"]))
    (inputs,) = loss_inputs
    assert not (inputs["completion_mask"] * inputs["tool_mask"])[cut].any()  # masked out of the loss



def test_grpo_trainer_masks_env_tokens_feeds_extras_to_rewards_and_logs_metrics(model_dir, problems, tmp_path,
                                                                                 monkeypatch):
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    reward_calls: list[dict] = []

    def recording_reward(completions, **kwargs):
        reward_calls.append(kwargs)
        return [None] * len(completions)  # None everywhere: it never makes a failed episode scorable

    # Two problems per batch of 8 (4 generations each); two episodes of the second problem fail on purpose.
    rollout = FaultyRollout(problems, failing=problems[1], failures=2, max_tool_calls=2)
    args = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False, seed=0, max_steps=2,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=128, temperature=TEMPERATURE,
        learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        reward_weights=[*REWARD_WEIGHTS, 0.0],
    )
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[env_reward, correctness, recording_reward], args=args,
                          train_dataset=problems_to_dataset(problems), processing_class=tokenizer,
                          rollout_func=rollout)
    loss_inputs: list[dict] = []
    compute_loss = trainer._compute_loss

    def capturing_compute_loss(model, inputs):  # the batch exactly as the loss sees it
        loss_inputs.append({key: value.detach().clone() for key, value in inputs.items()
                            if key in ("completion_ids", "completion_mask", "tool_mask", "advantages")})
        return compute_loss(model, inputs)

    trainer._compute_loss = capturing_compute_loss
    observation = make_format("hermes", tokenizer).observation_ids(["42\n"])  # what print(6 * 7) shows the model
    trainer.train()

    assert len(rollout.outputs) == len(loss_inputs) == len(reward_calls) == 2
    for out, inputs, rewarded in zip(rollout.outputs, loss_inputs, reward_calls, strict=True):
        # Environment tokens carry no loss: the mask the loss uses is the rollout's env_mask, row by row.
        masks_by_completion = defaultdict(set)
        for ids, mask in zip(out["completion_ids"], out["env_mask"], strict=True):
            masks_by_completion[tuple(ids)].add(tuple(mask))
        loss_mask = inputs["completion_mask"] * inputs["tool_mask"]
        for row in range(len(loss_mask)):
            length = int(inputs["completion_mask"][row].sum())
            (env_mask,) = masks_by_completion[tuple(inputs["completion_ids"][row, :length].tolist())]
            assert loss_mask[row, :length].tolist() == list(env_mask) and not loss_mask[row, length:].any()
            if not any(env_mask):  # a failed episode: no loss and, its reward being NaN, no advantage
                assert inputs["advantages"][row].item() == 0.0
        # And env_mask is 0 exactly on the interpreter's tokens: the tool turn showing "42", found by its ids.
        checked = 0
        for ids, mask, calls in zip(out["completion_ids"], out["env_mask"], out["num_tool_calls"], strict=True):
            if calls == 1:
                assert mask == mask_of(ids, observation), tokenizer.decode(ids)
                checked += 1
        assert checked >= 4 and out["aborted"].count(True) == 2
        # The extra fields reach the reward functions, aligned with the completions, next to the dataset columns.
        for field in ("env_reward", "correct", "num_tool_calls", "num_turns", "truncated", "aborted", "finish_reason"):
            assert rewarded[field] == out[field]
        assert rewarded["answer"] == [rollout.problem_for(prompt).answer for prompt in rewarded["prompts"]]

    logged = [entry for entry in trainer.state.log_history if "retool/accuracy" in entry]
    assert len(logged) == 2
    for entry in logged:
        assert entry["retool/tool_calls_per_episode"] > 0.5 and entry["retool/turns"] > 1.5
        assert entry["retool/aborted"] == pytest.approx(0.25) and entry["retool/accuracy"] == 0.0
        assert entry["rewards/correctness/mean"] == 0.0 and math.isfinite(entry["loss"])
    for entry, out in zip(logged, rollout.outputs, strict=True):  # failed episodes are left out of the mean
        scored = [reward for reward in out["env_reward"] if reward is not None]
        assert entry["rewards/env_reward/mean"] == pytest.approx(sum(scored) / len(scored))


@pytest.mark.slow  # about a minute on two busy cores: two Python start-ups with torch, the sandbox, three steps
def test_accelerate_launch_with_lora_trains_saves_and_logs(model_dir, tmp_path):
    """The user's entry point, as a subprocess: the tiny CPU config, the taught model, LoRA on."""
    output_dir = tmp_path / "run"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(SCRIPT),
               "--config", str(TINY_CONFIG), "--model_name_or_path", str(model_dir), "--output_dir", str(output_dir),
               "--max_steps", "2", "--dataset_limit", "2", "--temperature", str(TEMPERATURE),
               "--max_completion_length", "128", "--use_peft", "--lora_r", "8"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.monotonic()
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    print(f"accelerate launch: {time.monotonic() - start:.1f} s")

    assert json.loads((output_dir / "adapter_config.json").read_text())["r"] == 8  # a LoRA adapter was trained
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    steps = [entry for entry in history if "retool/tool_calls_per_episode" in entry]
    assert len(steps) == 2
    assert all(entry["retool/tool_calls_per_episode"] > 0.5 and entry["retool/aborted"] == 0.0 for entry in steps)
    assert all("rewards/env_reward/mean" in entry and "retool/truncation_rate" in entry for entry in steps)


# --------------------------------------------------------------------------------------------------- the configs
def grpo_parser():
    from training import grpo_trl

    return grpo_trl


@pytest.mark.parametrize("config", sorted(CONFIGS.glob("grpo_*.yaml")), ids=lambda path: path.name)
def test_each_shipped_config_parses(config):
    from trl import GRPOConfig, ModelConfig

    grpo_trl = grpo_parser()
    known = {f.name for cls in (grpo_trl.EnvArguments, GRPOConfig, ModelConfig) for f in dataclasses.fields(cls)}
    keys = set(yaml.safe_load(config.read_text()))
    assert keys <= known, f"not fields of EnvArguments, GRPOConfig or ModelConfig: {sorted(keys - known)}"
    # bf16 configs are for GPUs; on this CPU machine only use_cpu lets TrainingArguments validate them.
    env_args, training_args, model_args = grpo_trl.make_parser().parse_args_and_config(
        ["--config", str(config), "--use_cpu", "true"])
    assert training_args.generation_batch_size % training_args.num_generations == 0
    if "qwen3_4b" in config.name:
        assert (training_args.learning_rate, training_args.epsilon, training_args.epsilon_high) == (1e-6, 0.2, 0.28)
        assert training_args.beta == 0.0 and training_args.num_generations == 8 and training_args.use_vllm
        assert model_args.model_name_or_path == "Qwen/Qwen3-4B-Instruct-2507" and env_args.dataset == "dapo"


@pytest.mark.parametrize("config", [CONFIGS / "accelerate" / name for name in ("zero2.yaml", "zero3.yaml")],
                         ids=lambda path: path.name)
def test_each_accelerate_config_loads(config):
    from accelerate.commands.config.config_args import ClusterConfig

    cluster = ClusterConfig.from_yaml_file(str(config))  # rejects unknown keys
    assert cluster.distributed_type == "DEEPSPEED" and cluster.num_processes == 8
    assert cluster.deepspeed_config["zero_stage"] in (2, 3)
