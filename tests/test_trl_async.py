"""Asynchronous GRPO on CPU: per-turn policy versions, and `ReToolRolloutWorker` feeding TRL's own consumer.

Real parts: the tiny Qwen2 taught to call the interpreter, generating with Hugging Face `generate`; the sandbox; TRL's
`RolloutSample`, `RolloutQueueDataset` (the trainer's staleness filter) and `AsyncGRPOTrainer`'s data path. What
cannot run on CPU is replaced, and only that: the trainer's weight transfer to vLLM (NCCL) becomes "bump the policy
version" (`update_model_version`, exactly what the trainer calls after a sync), and its training step, whose tree
attention needs FlashAttention-3 kernels on a GPU, is not taken.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import queue
import threading
import time
from collections import defaultdict

import numpy as np
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from retool_adapters.generators import HFGenerator
from retool_adapters.trl.async_worker import ReToolRolloutWorker, VersionedGenerator, group_advantages
from retool_adapters.trl.testing import build_tool_calling_qwen
from retool_env import ToolEnvironment
from retool_env.data import load_problems
from retool_env.rollout import EpisodeAborted, SamplingParams, run_episode

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


@pytest.fixture(scope="module", autouse=True)
def accelerate_state():
    """TRL's trainer-side classes log through accelerate, which wants its state initialised, as a trainer does."""
    from accelerate import PartialState

    PartialState(cpu=True)


@pytest.fixture(scope="module")
def problems():
    return load_problems("arith", split="train", limit=2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, problems):
    return build_tool_calling_qwen(tmp_path_factory.mktemp("tool_qwen"), problems)


@pytest.fixture(scope="module")
def generator(model_dir):
    return HFGenerator(AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir),
                       logprobs_mode="processed_logprobs")


class UpdateAfterFirstTurn:
    """Stands in for the trainer: after the first turn of an episode is generated, a weight sync bumps the version."""

    def __init__(self, generator) -> None:
        self.generator, self.version, self.calls = generator, 0, 0

    async def generate(self, prompt_ids, **kwargs):
        generation = await self.generator.generate(prompt_ids, **kwargs)
        self.calls += 1
        if self.calls == 1:
            self.version += 1
        return generation


@pytest.mark.parametrize("partial_rollout", [True, False])
def test_an_episode_crossing_a_weight_update_keeps_per_turn_versions(model_dir, problems, generator, partial_rollout):

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = UpdateAfterFirstTurn(generator)
    versioned = VersionedGenerator(trainer, lambda: trainer.version)
    env = ToolEnvironment(tokenizer, problems, max_tool_calls=2)
    episode = run_episode(env, versioned, problem=problems[0], sampling=SamplingParams(temperature=0.0),
                          require_logprobs=True, partial_rollout=partial_rollout)
    if not partial_rollout:
        with pytest.raises(EpisodeAborted, match="policy changed mid-episode"):
            asyncio.run(episode)
        return
    traj = asyncio.run(episode)
    env.close()
    # The taught model calls the interpreter, then answers: two turns, written by two policies.
    assert traj.num_tool_calls == 1 and traj.policy_versions == [0, 1]
    assert traj.to_dict()["turns"][1]["policy_version"] == 1


def test_advantages_are_computed_the_trainers_way():
    rewards = [1.0, -1.0, None, -0.9]
    advantages = group_advantages(rewards)
    scored = np.array([1.0, -1.0, -0.9])
    expected = (scored - scored.mean()) / (scored.std() + 1e-8)
    np.testing.assert_allclose(advantages[[0, 1, 3]], expected)
    assert advantages[2] == 0.0 and group_advantages([None, None]).tolist() == [0.0, 0.0]


def test_the_worker_feeds_trls_rollout_queue_with_versioned_samples(model_dir, problems, generator):
    from trl.experimental.async_grpo.async_grpo_trainer import RolloutQueueDataset

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    worker = ReToolRolloutWorker(problems, tokenizer, generator, num_generations=4, max_inflight_groups=2,
                                 sampling=SamplingParams(temperature=0.7), max_completion_tokens=128,
                                 max_tool_calls=2, max_staleness=1)
    metrics = defaultdict(list)
    trainer_version = {"value": 0}
    dataset = RolloutQueueDataset(worker.rollout_buffer, lambda: trainer_version["value"], worker.check_health,
                                  stale_after_s=120, metrics=metrics, max_staleness=1, poll_interval_s=1.0)
    worker.start()
    try:
        consumed = []
        for sample in itertools.islice(iter(dataset), 12):
            consumed.append(sample)
            if len(consumed) == 4:  # a "weight sync" mid-run, as the trainer does after its step
                trainer_version["value"] = 1
                worker.update_model_version(1)
        worker.check_health(stale_after_s=120)
    finally:
        worker.stop()

    by_group = defaultdict(list)
    for sample in consumed:
        by_group[sample["group_id"]].append(sample)
        ids, mask, logprobs = sample["input_ids"], sample["completion_mask"], sample["old_log_probs"]
        assert ids.shape == mask.shape == logprobs.shape and ids.dtype == np.int64
        prompt = int(np.argmax(mask))  # the prompt is context, the model's first token is trained
        assert mask[:prompt].sum() == 0 and (logprobs[mask == 0] == 0).all() and (logprobs[mask == 1] < 0).all()
        assert sample["metrics"]["rewards/env_reward"] in (-1.0, pytest.approx(-0.9), pytest.approx(-0.8))
    # The interpreter's output sits inside the completion with mask 0: no loss on it.
    shown = [tokenizer.decode(s["input_ids"][int(np.argmax(s["completion_mask"])):][
        s["completion_mask"][int(np.argmax(s["completion_mask"])):] == 0]) for s in consumed]
    assert sum("42" in text for text in shown) >= 8
    assert len(by_group) >= 3
    # A full group of 4 shares a prompt and its advantages sum to 0 (all -0.9 here: zero advantage, as in GRPO).
    full = [group for group in by_group.values() if len(group) == 4]
    assert full and all(len({s["input_ids"][:8].tobytes() for s in group}) == 1 for group in full)
    assert all(abs(sum(s["advantage"] for s in group)) < 1e-6 for group in full)
    assert metrics["sample/staleness_max"] and max(metrics["sample/staleness_max"]) <= 1

    pushed = []
    while True:
        try:
            pushed.append(worker.metrics_queue.get_nowait())
        except queue.Empty:
            break
    assert pushed and all("retool/tool_calls_per_episode" in m for m in pushed)
    calls, episodes = map(sum, zip(*(m["retool/tool_calls_per_episode"] for m in pushed), strict=True))
    assert episodes >= 12 and calls / episodes > 0.5


def test_stale_samples_are_dropped_by_the_worker_and_by_the_trainer(model_dir, problems, generator):
    from trl.experimental.async_grpo.async_grpo_trainer import RolloutQueueDataset

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    worker = ReToolRolloutWorker(problems, tokenizer, generator, num_generations=2, max_staleness=1,
                                 max_completion_tokens=128, max_tool_calls=2)
    trajectories = []
    for version in (0, 2):
        worker.update_model_version(version)
        env = worker._make_env()
        trajectories.append(asyncio.run(run_episode(env, worker.generator, problem=problems[0],
                                                    require_logprobs=True)))
        env.close()
    samples = worker.to_samples(trajectories, group_id=0)
    assert [s.model_version for s in samples] == [0, 2]
    buffer: queue.Queue = queue.Queue()
    for sample in samples:
        buffer.put(sample)
    metrics = defaultdict(list)
    dataset = RolloutQueueDataset(buffer, lambda: 2, lambda stale_after_s: None, stale_after_s=60, metrics=metrics,
                                  max_staleness=1, poll_interval_s=0.1)
    (kept,) = itertools.islice(iter(dataset), 1)
    assert kept["input_ids"].tolist() == samples[1].input_ids.tolist()
    assert metrics["sample/dropped_stale_total"] == [1.0]  # TRL's own filter dropped the version-0 sample

    # The worker drops them before queuing: a group whose first turns were written two versions ago.
    class SyncAfterFirstTurns:
        async def generate(self, prompt_ids, **kwargs):
            generation = await generator.generate(prompt_ids, **kwargs)
            worker.update_model_version(2)
            return generation

    worker.update_model_version(0)
    worker.generator = VersionedGenerator(SyncAfterFirstTurns(), lambda: worker.model_version)
    asyncio.run(worker._play_group(problems[0], group_id=1))
    assert worker.rollout_buffer.empty()
    assert worker.metrics_queue.get_nowait()["retool/dropped_stale_samples_total"] == 2.0


def test_a_failing_worker_is_reported_by_check_health(model_dir, problems):
    class Broken:
        async def generate(self, prompt_ids, **kwargs):
            raise RuntimeError("injected generator failure")

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    worker = ReToolRolloutWorker(problems, tokenizer, Broken(), num_generations=2)
    worker.start()
    deadline = time.time() + 30
    while worker._last_failure == "none" and time.time() < deadline:  # the sandbox starts with the first group
        time.sleep(0.1)
    time.sleep(0.6)
    with pytest.raises(RuntimeError, match="injected generator failure"):  # every episode fails: no sample, and why
        worker.check_health(stale_after_s=0.5)
    worker.stop()

    crashing = ReToolRolloutWorker(problems, tokenizer, Broken(), num_generations=2, sandbox="no-such-sandbox")
    crashing.start()  # an environment that cannot be built is a bug in the set-up: the worker stops and says so
    deadline = time.time() + 30
    while crashing._error is None and time.time() < deadline:
        time.sleep(0.1)
    with pytest.raises(RuntimeError, match="failed"):
        crashing.check_health(stale_after_s=60)
    crashing.stop()
    assert not any(t.name == "retool-rollout-worker" for t in threading.enumerate())
    del worker, crashing
    gc.collect()  # the failed loops' frames now, not in a later garbage collection inside CPython 3.11's compiler


def test_stop_is_prompt_when_the_bounded_buffer_is_full(model_dir, problems, generator):
    """A full `queue_maxsize` buffer that nobody reads: `stop()` still ends the worker's thread in seconds."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    worker = ReToolRolloutWorker(problems, tokenizer, generator, num_generations=2, max_inflight_groups=2,
                                 queue_maxsize=1, max_completion_tokens=64, max_tool_calls=1)
    worker.start()
    deadline = time.time() + 120
    while not worker.rollout_buffer.full() and time.time() < deadline:
        time.sleep(0.1)
    assert worker.rollout_buffer.full()
    time.sleep(1.0)  # the group's second sample now waits for room
    thread = worker._thread
    started = time.monotonic()
    worker.stop(timeout=30)
    assert time.monotonic() - started < 20 and not thread.is_alive()
    assert worker.rollout_buffer.qsize() == 1  # nothing was pushed after the stop
    worker.check_health(stale_after_s=600)  # stopped, not failed


def test_seeded_groups_sample_under_seeds_of_their_own():
    from retool_env.data import Problem

    seeded = ReToolRolloutWorker([Problem("q", "1")], None, None, sampling=SamplingParams(temperature=0.5, seed=7))
    seeds = [seeded.group_sampling(g).seed for g in range(4)]
    assert len(set(seeds)) == 4 and seeds == [seeded.group_sampling(g).seed for g in range(4)]
    assert all(abs(a - b) > 1000 for a, b in itertools.combinations(seeds, 2))  # episode j samples under seed + j
    assert seeded.group_sampling(0).temperature == 0.5
    unseeded = ReToolRolloutWorker([Problem("q", "1")], None, None)
    assert unseeded.group_sampling(3).seed is None


def test_void_turn_samples_are_queued_without_trained_tokens():
    from retool_env.data import Problem
    from retool_env.trajectory import Trajectory

    def traj(finish_reason, reward, pred):
        return Trajectory(prompt_ids=[1, 2], completion_ids=[5, 6], env_mask=[1, 1], logprobs=[-0.1, -0.2],
                          finish_reason=finish_reason, reward=reward, pred=pred)

    group = [traj("answer", 1.0, "4"), traj("length", -1.0, None)]
    on = ReToolRolloutWorker([Problem("q", "4")], None, None, mask_void_turns=True).to_samples(group, group_id=0)
    off = ReToolRolloutWorker([Problem("q", "4")], None, None).to_samples(group, group_id=0)
    assert on[0].completion_mask.tolist() == off[0].completion_mask.tolist() == [0, 0, 1, 1]
    assert on[1].completion_mask.tolist() == [0, 0, 0, 0] and off[1].completion_mask.tolist() == [0, 0, 1, 1]
    assert [s.advantage for s in on] == [s.advantage for s in off] and on[0].advantage > 0  # still in its group


# ------------------------------------------------------------------------------------------- training/grpo_trl.py
def test_the_async_recipe_parses_and_the_script_takes_async():
    import subprocess
    import sys
    from pathlib import Path

    from training import grpo_trl

    root = Path(__file__).resolve().parents[1]
    config = root / "training" / "configs" / "async_grpo_qwen3_4b_dapo.yaml"
    env_args, training_args, model_args = grpo_trl.make_parser(asynchronous=True).parse_args_and_config(
        ["--config", str(config), "--use_cpu", "true"])  # bf16 validates only on a GPU, or with use_cpu
    assert type(training_args).__name__ == "AsyncGRPOConfig" and training_args.max_staleness == 2
    assert training_args.dtype == "bfloat16" and training_args.num_generations == 8 and env_args.dataset == "dapo"
    assert model_args.model_name_or_path == "Qwen/Qwen3-4B-Instruct-2507"
    result = subprocess.run([sys.executable, str(root / "training" / "grpo_trl.py"), "--async", "--help-all"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "--max_staleness" in result.stdout and "--max_tool_calls" in result.stdout


def test_sign_safe_shaping_keeps_correct_samples_advantages_non_negative():
    from retool_env.data import Problem
    from retool_env.trajectory import Trajectory

    def traj(reward, correct):
        return Trajectory(prompt_ids=[1, 2], completion_ids=[5, 6], env_mask=[1, 1], logprobs=[-0.1, -0.2],
                          finish_reason="answer", reward=reward, correct=correct, pred="4")

    group = [traj(1.0, True), traj(1.0, True), traj(0.0, True), traj(-1.0, False)]  # a tool cost made 0.0
    plain = ReToolRolloutWorker([Problem("q", "4")], None, None).to_samples(group, group_id=0)
    safe = ReToolRolloutWorker([Problem("q", "4")], None, None, sign_safe_shaping=True).to_samples(group, group_id=0)
    assert plain[2].advantage < 0 and min(s.advantage for s in safe[:3]) > 0 and safe[3].advantage < 0
    assert [s.metrics["rewards/env_reward"] for s in safe] == [1.0, 1.0, 0.0, -1.0]  # the env's reward, logged


def test_the_worker_records_every_episode_of_a_group(model_dir, problems, generator, tmp_path):
    import asyncio

    from retool_env.records import read_records, regrade

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    worker = ReToolRolloutWorker(problems, tokenizer, generator, num_generations=3, max_completion_tokens=128,
                                 sampling=SamplingParams(temperature=0.7, seed=5), max_tool_calls=2,
                                 records_path=str(tmp_path / "records.jsonl"))
    asyncio.run(worker._play_group(problems[0], group_id=7))
    records = list(read_records(tmp_path / "records.jsonl"))
    queued = [worker.rollout_buffer.get_nowait() for _ in range(worker.rollout_buffer.qsize())]
    assert len(records) == 3 and {r["group"] for r in records} == {7} and len({r["seed"] for r in records}) == 3
    assert all(r["problem_id"] == problems[0].id and r["question"] == problems[0].question for r in records)
    done = [r for r in records if not r["aborted"]]
    assert [r["completion_ids"] for r in done] == [
        s.input_ids[len(r["prompt_ids"]):].tolist() for s, r in zip(queued, done, strict=True)]
    assert all(r["policy_version"] == 0 and r["tool_calls"] for r in records)
    report = regrade(records)
    assert report.regraded == len(queued) and report.reward_mismatches == 0
