"""TRL's asynchronous GRPO: ReTool-Env episodes as `AsyncGRPOTrainer`'s `rollout_worker`.

```python
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
from retool_adapters.generators import OpenAICompletionsGenerator
from retool_adapters.trl.async_worker import ReToolRolloutWorker

worker = ReToolRolloutWorker(problems, tokenizer, OpenAICompletionsGenerator(args.vllm_server_base_url, model_name),
                             num_generations=args.num_generations, max_staleness=args.max_staleness,
                             max_completion_tokens=args.max_completion_length, max_tool_calls=4)
trainer = AsyncGRPOTrainer(model=model_name, args=args, train_dataset=problems_to_dataset(problems),
                           reward_funcs=[], rollout_worker=worker)   # the environment's reward is the reward
```

Generation runs apart from training: the worker plays groups of `num_generations` episodes of one problem without
pause, against the vLLM server the trainer pushes its weights to, and queues each finished group as `RolloutSample`s
(the whole episode as `input_ids`, the environment's mask as `completion_mask`, the generator's own logprobs as
`old_log_probs`, the group-normalised reward as `advantage`). Every turn records the policy version it was generated
with; an episode that a weight update crosses is finished on the new policy and tagged with its oldest version, so
the trainer's `max_staleness` measures its stalest tokens (`partial_rollout=False` drops it instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import queue
import random
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from retool_adapters.trl.rollout import episode_metrics, index_problems
from retool_env.config import EnvConfig
from retool_env.data import Problem
from retool_env.env import ToolEnvironment
from retool_env.filters import TrainingPlan, TrajectoryFilters
from retool_env.records import RecordWriter, episode_record
from retool_env.rewards import EpisodeStats
from retool_env.rollout import Generation, Generator, SamplingParams, derive_seed, run_episodes
from retool_env.trajectory import Trajectory


class VersionedGenerator:
    """A generator whose generations carry the policy version that was live when each request started."""

    def __init__(self, generator: Generator, policy_version: Callable[[], int]) -> None:
        self.generator, self.policy_version = generator, policy_version

    async def generate(self, prompt_ids: Sequence[int], **kwargs: Any) -> Generation:
        version = self.policy_version()  # a weight update during the request leaves the turn tagged older: stalest
        generation = await self.generator.generate(prompt_ids, **kwargs)
        return dataclasses.replace(generation, policy_version=version)


def group_advantages(rewards: Sequence[float | None]) -> np.ndarray:
    """GRPO's advantages as AsyncGRPOTrainer's own worker computes them: `(r - mean) / (std + 1e-8)` over the
    group's scored episodes; an unscored (failed) episode gets 0."""
    scores = np.array([np.nan if r is None else r for r in rewards], dtype=float)
    scored = ~np.isnan(scores)
    advantages = np.zeros_like(scores)
    if scored.any():
        advantages[scored] = (scores[scored] - scores[scored].mean()) / (scores[scored].std() + 1e-8)
    return advantages


class ReToolRolloutWorker:
    """AsyncGRPOTrainer's `rollout_worker` (TRL's `RolloutWorkerProtocol`) over `retool_env.rollout.run_episodes`.

    A thread of the trainer's main process runs an event loop with `max_inflight_groups` groups in flight, drawing
    problems in a shuffled cycle; episodes continue as soon as their own tool calls return. `env_kwargs` are
    `EnvConfig`'s fields. `generator` is any `Generator` (an OpenAI-compatible client of the vLLM server the trainer
    syncs, for the real run). Samples whose tokens are more than `max_staleness` versions old when their group ends
    are dropped here (`retool/dropped_stale_samples_total`) as the trainer would drop them on arrival. Failed
    episodes (generator error, `episode_timeout`, a crossed update without `partial_rollout`) are never queued.
    A seeded `sampling` gives each group a seed of its own (`group_sampling`). A PEFT policy needs a server started
    without `--enable-lora` (TRL then pushes merged weights): the adapters TRL loads under `--enable-lora` are named
    per version, and the generator's requests name the base model. `mask_void_turns` is `ReToolRollout`'s (SimpleTIR):
    a sample with a void turn is queued with `completion_mask` all 0, its reward still in its group's advantages.
    `sign_safe_shaping` is `ReToolRollout`'s too: the group's rewards pass through
    `retool_env.rewards.sign_safe_rewards` before its advantages, so no correct episode gets a negative one.
    `records_path` appends every episode of every group (`retool_env.records`; `policy_version` the oldest of its
    turns, `filtered` naming `void_turn` or `stale`, a sample dropped as too stale) to a JSONL file, from the worker's
    thread, as each group ends.

    `accuracy_filter=(low, high)` and `roc_down_sample=n` are `ReToolRollout`'s (SimpleTIR, rStar2-Agent's GRPO-RoC;
    `retool_env.filters`), with the papers' oversampling for real, as the worker's batch has no fixed shape: a group
    outside the accuracy range, or (RoC) whose rewards are all equal, is not queued at all, and the next group
    takes its place; of a RoC group (play it with `num_generations=2n`) the n kept are queued, their advantages
    over those n alone. `retool/filtered_groups`, `retool/roc_rejected_groups` and `retool/roc_dropped` log the
    shares, the records name each episode's filters.
    """

    def __init__(
        self,
        problems: Sequence[Problem],
        tokenizer: Any,
        generator: Generator,
        *,
        num_generations: int = 8,
        sampling: SamplingParams | None = None,
        max_inflight_groups: int = 4,
        max_staleness: int | None = None,
        partial_rollout: bool = True,
        episode_timeout: float | None = None,
        queue_maxsize: int = 0,
        seed: int = 0,
        mask_void_turns: bool = False,
        accuracy_filter: tuple[float, float] | None = None,
        roc_down_sample: int | None = None,
        sign_safe_shaping: bool | str = False,
        records_path: str | None = None,
        **env_kwargs: Any,
    ) -> None:
        if not problems:
            raise ValueError("ReToolRolloutWorker needs problems to play")
        index_problems(problems)  # the same question with two answers is an error here too
        self.problems = list(problems)
        self._questions = {problem.id: problem.question for problem in self.problems}
        self.tokenizer = tokenizer
        self.generator = VersionedGenerator(generator, lambda: self.model_version)
        self.num_generations = num_generations
        self.sampling = sampling or SamplingParams()
        self.max_inflight_groups = max_inflight_groups
        self.max_staleness = max_staleness
        self.partial_rollout = partial_rollout
        self.episode_timeout = episode_timeout
        self.env_config = EnvConfig(**env_kwargs)
        self.seed = seed
        self.mask_void_turns = mask_void_turns
        self.accuracy_filter = accuracy_filter
        self.roc_down_sample = roc_down_sample
        self.sign_safe_shaping = sign_safe_shaping
        TrajectoryFilters(mask_void_turns, accuracy_filter, roc_down_sample, sign_safe_shaping)  # checks them
        self.records = None if records_path is None else RecordWriter(records_path)
        self._record_env: ToolEnvironment | None = None
        self.rollout_buffer: queue.Queue = queue.Queue(maxsize=queue_maxsize)
        self.metrics_queue: queue.Queue = queue.Queue()
        self.model_version = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._heartbeat = time.time()
        self._last_failure = "none"

    # --------------------------------------------------------------------------------------- RolloutWorkerProtocol
    def start(self) -> None:
        """Begin producing rollouts (the trainer calls it once, after the first weight sync)."""
        if self._thread is not None:
            return
        self._heartbeat = time.time()
        self._thread = threading.Thread(target=self._run, name="retool-rollout-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Cancel the groups in flight and wait for the thread to end: within a second or so, plus the generator
        call and tool calls in progress (a full bounded buffer holds nothing up); a warning if it outlives `timeout`
        (a generator call that never returns), as the trainer stops the worker while shutting down."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            if self._thread.is_alive():
                warnings.warn(f"the ReTool rollout worker did not stop within {timeout:.0f} s (a generator call that "
                              f"never returns?); its daemon thread is left behind", RuntimeWarning, stacklevel=2)
            self._thread = None

    def update_model_version(self, model_version: int) -> None:
        """The trainer has pushed new weights: turns generated from now on carry this version."""
        self.model_version = model_version

    def check_health(self, stale_after_s: float) -> None:
        """Raise if the worker failed, or queued no sample for `stale_after_s` seconds (a generator that fails every
        episode, say)."""
        if self._error is not None:
            raise RuntimeError("the ReTool rollout worker failed; see the chained exception") from self._error
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            raise RuntimeError("the ReTool rollout worker stopped without an error")
        age = time.time() - self._heartbeat
        if age > stale_after_s:
            raise RuntimeError(f"the ReTool rollout worker finished no group in {age:.0f} s (> {stale_after_s:.0f} s); "
                               f"the last failed episode: {self._last_failure}")

    # ------------------------------------------------------------------------------------------------ the loop
    def _run(self) -> None:
        try:
            asyncio.run(self._generate_forever())
        except BaseException as error:  # reported through check_health, which the trainer polls
            self._error = error

    async def _generate_forever(self) -> None:
        problems = self._problem_cycle()
        group_ids = itertools.count()
        inflight: set[asyncio.Task] = set()
        try:
            while not self._stop.is_set():
                while len(inflight) < self.max_inflight_groups:
                    inflight.add(asyncio.create_task(self._play_group(next(problems), next(group_ids))))
                done, inflight = await asyncio.wait(inflight, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # a bug in the worker itself stops it; an episode's failure never does
        finally:
            for task in inflight:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*inflight, return_exceptions=True)

    def _problem_cycle(self):
        rng = random.Random(self.seed)
        while True:
            order = list(self.problems)
            rng.shuffle(order)
            yield from order

    def group_sampling(self, group_id: int) -> SamplingParams:
        """The group's sampling settings: with a seed, one derived from it and the group (episode j of the group then
        samples under that + j, each turn under its own, see `run_episodes`), so no two groups replay each other's
        draws."""
        if self.sampling.seed is None:
            return self.sampling
        return dataclasses.replace(self.sampling, seed=derive_seed(self.sampling.seed, "group", group_id))

    async def _play_group(self, problem: Problem, group_id: int) -> None:
        trajectories = await run_episodes(
            [problem], self._make_env, self.generator, n_per_problem=self.num_generations,
            concurrency=self.num_generations, sampling=self.group_sampling(group_id),
            episode_timeout=self.episode_timeout,
            require_logprobs=True, partial_rollout=self.partial_rollout, progress=False,
        )
        plan = self.training_plan(trajectories, group_id)
        samples = self.to_samples(trajectories, group_id, plan=plan)
        fresh = [s for s in samples if self.max_staleness is None
                 or self.model_version - s.model_version <= self.max_staleness]
        self._push_metrics(trajectories, dropped_stale=len(samples) - len(fresh), plan=plan)  # first: see a sample
        if self.records is not None:
            self.write_records(trajectories, samples, fresh, group_id, plan=plan)
        for sample in fresh:
            if not await self._enqueue(sample):
                return
        if samples:
            self._heartbeat = time.time()
        elif any(not t.aborted and t.completion_ids for t in trajectories):  # the filters took the whole group
            names = sorted({name for filters in plan.filters for name in filters})
            self._last_failure = f"every episode of the group was filtered out ({', '.join(names)})"
        else:  # every episode failed: check_health says why once no group has succeeded for too long
            self._last_failure = trajectories[0].finish_reason if trajectories else "no episode ran"

    async def _enqueue(self, sample: Any) -> bool:
        """Put a sample in the buffer, waiting on the event loop (never in a thread, which `stop()` could not end)
        while a bounded buffer is full; False if the worker was stopped first."""
        while not self._stop.is_set():
            sample.enqueued_at = time.time()
            try:
                self.rollout_buffer.put_nowait(sample)
                return True
            except queue.Full:
                await asyncio.sleep(0.05)
        return False

    def _make_env(self) -> ToolEnvironment:
        return ToolEnvironment(self.tokenizer, self.problems, **self.env_config)

    def write_records(self, trajectories: Sequence[Trajectory], samples: Sequence[Any], fresh: Sequence[Any],
                      group_id: int, plan: TrainingPlan | None = None) -> None:
        """Append the group's episodes to `records_path` (see `retool_env.records`); `samples` are `to_samples`'s."""
        if self.records is None:
            return
        if self._record_env is None:
            self._record_env = self._make_env()
        plan = plan or self.training_plan(trajectories, group_id)
        env, seed = self._record_env, self.group_sampling(group_id).seed
        queued, by_episode, records = {id(s) for s in fresh}, iter(samples), []
        for j, traj in enumerate(trajectories):
            failed = traj.aborted or not traj.completion_ids
            sample = None if failed or not self.is_queued(plan.filters[j]) else next(by_episode)
            mask = (None if failed else [0] * len(traj.env_mask) if sample is None
                    else sample.completion_mask[len(traj.prompt_ids):].tolist())
            filtered = list(plan.filters[j]) + ([] if sample is None or id(sample) in queued else ["stale"])
            versions = [v for v in traj.policy_versions if v is not None]
            records.append(episode_record(
                traj, decode=env.tokenizer.decode,
                episode_stats=None if failed else EpisodeStats.of(traj), reward_scheme=env.config.reward,
                reward_kwargs=env.config.reward_options, env_mask=mask, filtered=filtered,
                question=self._questions.get(traj.problem_id), policy_version=min(versions, default=None),
                seed=None if seed is None else seed + j, group=group_id, mode="train",
                trained_reward=None if sample is None else plan.rewards[j]))
        self.records.write(records)

    # ----------------------------------------------------------------------------------------- samples, metrics
    @property
    def filters(self) -> TrajectoryFilters:
        """The trajectory filter options, as `retool_env.filters` applies them."""
        return TrajectoryFilters(self.mask_void_turns, self.accuracy_filter, self.roc_down_sample,
                                 self.sign_safe_shaping)

    def training_plan(self, trajectories: Sequence[Trajectory], group_id: int) -> TrainingPlan:
        """The filters' plan of one group (`TrajectoryFilters.plan`), RoC's draw seeded by the worker and group."""
        return self.filters.plan(trajectories, [group_id] * len(trajectories),
                                 roc_seed=derive_seed(self.seed, "roc", group_id))

    @staticmethod
    def is_queued(filters: Sequence[str]) -> bool:
        """Whether an episode with these filters is queued: a void turn's is (masked), the group filters' not."""
        return not set(filters) & {"accuracy", "roc", "roc_equal_reward"}

    def trained_rewards(self, trajectories: Sequence[Trajectory], group_id: int = 0) -> list[float | None]:
        """The group's rewards as its advantages see them: None for a failed episode or one RoC dropped;
        `sign_safe_shaping` applied."""
        return self.training_plan(trajectories, group_id).rewards

    def to_samples(self, trajectories: Sequence[Trajectory], group_id: int,
                   plan: TrainingPlan | None = None) -> list[Any]:
        """The group's queued episodes as TRL `RolloutSample`s: failed episodes left out (their advantage would be
        0), and those the group filters took out (`is_queued`)."""
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        plan = plan or self.training_plan(trajectories, group_id)
        failed = [t.aborted or not t.completion_ids for t in trajectories]
        advantages = group_advantages(plan.rewards)
        scored = [r for r in plan.rewards if r is not None]
        reward_std = float(np.std(scored)) if scored else float("nan")
        samples = []
        for traj, bad, filters, advantage in zip(trajectories, failed, plan.filters, advantages, strict=True):
            if bad or not self.is_queued(filters):
                continue
            versions = [v for v in traj.policy_versions if v is not None]
            prompt = len(traj.prompt_ids)
            void = "void_turn" in filters
            samples.append(RolloutSample(
                prompt=[], completion=[],
                input_ids=np.asarray(traj.prompt_ids + traj.completion_ids, dtype=np.int64),
                completion_mask=np.asarray([0] * (prompt + len(traj.env_mask)) if void else
                                           [0] * prompt + traj.env_mask, dtype=np.int64),
                old_log_probs=np.asarray([0.0] * prompt + traj.logprobs, dtype=np.float32),
                advantage=float(advantage),
                model_version=min(versions, default=self.model_version),  # its stalest tokens
                group_id=group_id,
                metrics={"reward": float(traj.reward or 0.0), "reward_std": reward_std,
                         "rewards/env_reward": float(traj.reward or 0.0),
                         "rewards/correctness": float(bool(traj.correct)),
                         "retool/policy_versions_per_episode": float(len(set(versions)))},
            ))
        return samples

    def _push_metrics(self, trajectories: Sequence[Trajectory], dropped_stale: int,
                      plan: TrainingPlan | None = None) -> None:
        """`retool/*` as the synchronous path logs them, as (sum, count) rates the trainer pools over its window."""
        metrics: dict[str, Any] = {name: (sum(values), len(values))
                                   for name, values in episode_metrics(trajectories).items()}
        metrics["retool/dropped_stale_samples_total"] = float(dropped_stale)
        filters = [] if plan is None else plan.filters
        if self.accuracy_filter is not None:
            metrics["retool/filtered_groups"] = (float(any("accuracy" in f for f in filters)), 1)
        if self.roc_down_sample is not None and filters:
            metrics["retool/roc_rejected_groups"] = (float(any("roc_equal_reward" in f for f in filters)), 1)
            metrics["retool/roc_dropped"] = (float(sum("roc" in f for f in filters)), len(filters))
        self.metrics_queue.put(metrics)
