"""verl: an agent loop that plays the environment, generating through verl's server manager with token ids.

`ReToolAgentLoop` is an `AgentLoopBase` registered as "retool_env". Each sample runs one episode with
`retool_env.rollout.run_episode`; `VerlServerGenerator` turns each turn into one `server_manager.generate(request_id,
prompt_ids=..., sampling_params=...)` call (one request id per episode: verl's sticky session keeps the prefix cache;
under `rollout.full_determinism` it is `det-{priority}`, as verl's own loops derive it). The output's `prompt_ids`,
`response_ids`, `response_mask`, `response_logprobs` and `reward_score` are the trajectory's own; verl pads them.
What verl's own loops record comes along: the server's `extra_fields` (`global_steps`, `min_global_steps` /
`max_global_steps`, which the v1 trainer's staleness control and metrics read), `metrics.num_preempted`, and a
`reward_extra_info` (`acc`, `score`, `verl_strict_acc`, `num_tool_calls`) for verl's validation metrics.

verl's trainers (`trainer.use_v1`, the default since verl 0.9, or the legacy one):

- `sample_mode="episode"` (default): one `AgentLoopOutput` per episode, on both trainers.
- `sample_mode="turn"`: a chat template that rewrites history (Qwen3) starts a new sample at each rewrite; the loop
  returns a list of outputs (v1 only: `AgentLoopWorkerTQ` stores each, and verl's GRPO
  `compute_advantage_for_multi_trajectories` takes each episode's last output and broadcasts its advantage to the
  others, so a trajectory counts once in its group).
- An aborted episode (the engine's "aborted", or SGLang's "abort"; logprobs missing while verl asked for them) is
  played again from its prompt up to `abort_retries` times, then raises `EpisodeAborted`: it never gets an invented
  reward. Under v1 the error marks the prompt's group "failure" and verl's replay buffer evicts the whole group
  (metric `rollout_failure/evicted_samples`); the legacy trainer has no group filter, so there the error fails the
  step.

Plug in (verl's trainer config)::

    actor_rollout_ref.rollout.agent.agent_loop_config_path=retool_agent.yaml
    # retool_agent.yaml
    - name: retool_env
      _target_: retool_adapters.verl.ReToolAgentLoop
      env_kwargs: {tool_format: hermes, max_tool_calls: 8, max_observation_tokens: 512}

Trajectory filters and records (`retool_env.filters`, `retool_env.records`; each off by default):

- `mask_void_turns: true` in the agent loop's yaml entry (SimpleTIR): an episode with a void turn keeps its reward
  (in its group's advantages) with `response_mask` all 0. Every sample's `reward_extra_info` carries
  `retool/void_turn_ratio` (1.0 for a void episode; verl's validation logs its mean) and `retool/roc_penalty`.
- `records_path: runs/records.jsonl` in the same entry: every episode the loop plays is appended, one file per
  process (`records.<host>-<pid>.jsonl`; verl runs agent loops in several Ray workers), `group` the prompt's `uid`,
  `policy_version` the weights' `global_steps` of its first turn. verl does not tell an agent loop whether it plays
  a validation sample, so validation episodes are recorded too (`mode` "train"). Group filters act later, in the
  replay buffer, so a record's `filtered` names `void_turn` only.
- The accuracy filter and RoC down-sampling (v1 sync trainer): `ReToolReplayBuffer`, verl's own `ReplayBuffer`
  with the DAPO eviction (an evicted group is refilled with twice as many new prompts: the papers' oversampling)
  deciding by the accuracy range, and RoC choosing n of each 2n (`rollout.n=2n`) as the batch is materialised, the
  others cleared from TransferQueue (the batch shrinks; verl pads it to its divisor)::

      trainer.v1.sampler.custom_sampler.path=pkg://retool_adapters.verl
      trainer.v1.sampler.custom_sampler.name=ReToolReplayBuffer
      +trainer.v1.sampler.sampler_kwargs.accuracy_filter=[0.1,0.9]
      +trainer.v1.sampler.sampler_kwargs.roc_down_sample=8
      +trainer.v1.sampler.sampler_kwargs.train_batch_size=${data.train_batch_size}

  The legacy trainer has no group hook between rollout and update (its batch is a fixed `train_batch_size * n`
  DataProto), so there only void-turn masking applies; verl's async v1 trainer (`ReplayBufferAsync`) is refused.

Then give each dataset row `agent_name: retool_env`, the raw problem as the last user message of `prompt`, and the
answer in `reward_model.ground_truth` (verl's RLHFDataset columns; DAPO's instruction wrapper is stripped). The
environment renders the prompt itself and its completion budget is `rollout.response_length`. This module imports
without verl; the agent loop class exists when verl does.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import uuid4

from retool_adapters.chat_templates import training_env_kwargs
from retool_env.data import Problem, message_text, strip_dapo_template
from retool_env.env import ToolEnvironment
from retool_env.filters import TrajectoryFilters, has_void_turn, roc_penalty, roc_select
from retool_env.grading import strict_box_correct
from retool_env.records import episode_record, process_record_writer
from retool_env.rollout import EpisodeAborted, Generation, SamplingParams, derive_seed, run_episode
from retool_env.trajectory import Trajectory

from .generators.base import LogprobsMismatchError, TurnGenerator, sampling_from_mapping

__all__ = ["AGENT_NAME", "VerlServerGenerator", "agent_loop_fields", "agent_loop_outputs", "problem_from_row"]

logger = logging.getLogger(__name__)

AGENT_NAME = "retool_env"
ABORT_REASONS = ("aborted", "abort")  # verl's vLLM server reports "aborted", its SGLang server "abort"
SPEC_DECODE_EXTRA_KEYS = ("spec_num_draft_tokens", "spec_num_accepted_tokens", "spec_num_verify_steps")


class VerlServerGenerator(TurnGenerator):
    """A `Generator` over verl's `LLMServerClient` / `AsyncLLMServerManager` (`generate(request_id, prompt_ids=,
    sampling_params=) -> TokenOutput`).

    `base_params` are verl's own sampling params for the batch (`logprobs`, `repetition_penalty`, ...); each turn adds
    the environment's `max_tokens` and stops. `backend` names the rollout engine, which decides how a stop string is
    kept in the output (vLLM `include_stop_str_in_output`, SGLang `no_stop_trim`). `priority` goes to the server
    (vLLM's scheduler). Like verl's `ToolAgentLoop`, the generator keeps the first turn's `extra_fields`, the last
    turn's `max_global_steps` and the sum of `num_preempted` (-1: the server does not report it).
    """

    def __init__(self, server_manager: Any, *, request_id: str | None = None,
                 base_params: Mapping[str, Any] | None = None, backend: str = "vllm", priority: int = 0) -> None:
        if backend not in ("vllm", "sglang"):
            raise ValueError(f"backend must be 'vllm' or 'sglang', not {backend!r}")
        self.server_manager = server_manager
        self.request_id = request_id or uuid4().hex
        self.base_params = dict(base_params or {})
        self.backend = backend
        self.priority = int(priority)
        self.extra_fields: dict[str, Any] = {}
        self.num_preempted: int | None = None

    async def _generate(
        self, prompt_ids: list[int], max_tokens: int, stop_token_ids: list[int], stop: list[str],
        sampling: SamplingParams,
    ) -> Generation:
        """Generate one turn with one server-manager call."""
        params = {**self.base_params, "temperature": sampling.temperature, "top_p": sampling.top_p,
                  "top_k": sampling.top_k, "max_tokens": max_tokens, "stop": list(stop),
                  "stop_token_ids": list(stop_token_ids), "skip_special_tokens": False,
                  **({"include_stop_str_in_output": True} if self.backend == "vllm" else {"no_stop_trim": True}),
                  **({"seed": sampling.seed} if sampling.seed is not None else {})}
        output = await self.server_manager.generate(self.request_id, prompt_ids=list(prompt_ids),
                                                    sampling_params=params,
                                                    **({"priority": self.priority} if self.priority else {}))
        self._record(output)
        token_ids = [int(t) for t in output.token_ids]
        if output.stop_reason in ABORT_REASONS:
            return Generation(token_ids=token_ids, logprobs=None, finish_reason="abort")
        logprobs = None if output.log_probs is None else [float(v) for v in output.log_probs]
        if logprobs is not None and len(logprobs) != len(token_ids):
            raise LogprobsMismatchError(f"the server returned {len(logprobs)} logprobs for {len(token_ids)} tokens")
        # verl reports "completed" for both stop and length: a full turn without a stop token was cut off.
        stopped = bool(token_ids) and token_ids[-1] in stop_token_ids
        finish_reason = "length" if len(token_ids) >= max_tokens and not stopped else "stop"
        return Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason)

    def _record(self, output: Any) -> None:
        """verl `ToolAgentLoop._handle_generating_state`'s bookkeeping of each turn's `TokenOutput`."""
        preempted = getattr(output, "num_preempted", None)
        if self.num_preempted is None:
            self.num_preempted = -1 if preempted is None else int(preempted)
        else:
            self.num_preempted += int(preempted or 0)
        extra = dict(getattr(output, "extra_fields", None) or {})
        if not self.extra_fields:
            self.extra_fields.update(extra)
            return
        if extra.get("max_global_steps") is not None:
            self.extra_fields["max_global_steps"] = extra["max_global_steps"]
        for key in SPEC_DECODE_EXTRA_KEYS:
            if key in extra and key in self.extra_fields:
                self.extra_fields[key] = int(self.extra_fields[key]) + int(extra[key])


def problem_from_row(row: Mapping[str, Any]) -> Problem:
    """The raw problem of a verl dataset row: `extra_info.question` or the last user message of `raw_prompt`
    without DAPO's instruction wrapper (as `load_problems` strips it), and `reward_model.ground_truth`."""
    extra = row.get("extra_info") or {}
    question = extra.get("question")
    if question is None:
        question = message_text(list(row["raw_prompt"]))
    answer = (row.get("reward_model") or {}).get("ground_truth", extra.get("answer", ""))
    return Problem(question=strip_dapo_template(str(question)), answer=str(answer),
                   id=str(extra.get("index", row.get("index", ""))))


def reward_extra_info(traj: Trajectory, verl_text: str | None = None) -> dict[str, float]:
    """What verl's reward managers return beside the score, for its metrics (`acc` is the accuracy verl's
    validation reports as `val-core`). `verl_strict_acc` is verl's `math_dapo` strict box verdict on `verl_text`,
    the whole response decoded as verl's reward manager decodes it, where the environment grades the answer turn."""
    info = {"acc": float(bool(traj.correct)), "score": float(traj.reward or 0.0),
            "num_tool_calls": float(traj.num_tool_calls),
            "retool/void_turn_ratio": float(has_void_turn(traj)), "retool/roc_penalty": roc_penalty(traj)}
    if verl_text is not None:
        info["verl_strict_acc"] = float(strict_box_correct(verl_text, traj.gold))
    return info


def agent_loop_fields(traj: Trajectory, *, with_logprobs: bool, engine_fields: Mapping[str, Any] | None = None,
                      verl_text: str | None = None) -> dict[str, Any]:
    """`AgentLoopOutput` fields of a finished one-sample episode (verl counts turns as 1 user + assistant + tool
    turns). `engine_fields` are the server's `extra_fields` (staleness tags), kept under the environment's own."""
    outputs = agent_loop_outputs(traj, with_logprobs=with_logprobs, engine_fields=engine_fields, verl_text=verl_text)
    if len(outputs) != 1:
        raise ValueError(f"the episode has {len(outputs)} samples (sample_mode='turn'): use agent_loop_outputs")
    return outputs[0]


def agent_loop_outputs(traj: Trajectory, *, with_logprobs: bool, engine_fields: Mapping[str, Any] | None = None,
                       verl_text: str | None = None) -> list[dict[str, Any]]:
    """One `AgentLoopOutput`'s fields per training sample of the episode (one unless `sample_mode="turn"` split it),
    each with the episode's reward and `reward_extra_info`."""
    extra = {**dict(engine_fields or {}), "correct": traj.correct, "num_tool_calls": traj.num_tool_calls,
             "finish_reason": traj.finish_reason, "aborted": False, "turn_scores": [], "tool_rewards": [],
             "reward_extra_info": reward_extra_info(traj, verl_text)}
    outputs = []
    for sample in traj.samples:
        turns = [traj.turns[i] for i in sample.turns]
        tool_turns = sum(turn.env_end > turn.end for turn in turns)
        outputs.append({
            "prompt_ids": list(sample.prompt_ids),
            "response_ids": list(sample.completion_ids),
            "response_mask": list(sample.env_mask),
            "response_logprobs": list(sample.logprobs) if with_logprobs else None,
            "reward_score": traj.reward,
            "num_turns": 1 + len(turns) + tool_turns,
            "extra_fields": {**extra, "reward_extra_info": dict(extra["reward_extra_info"])},
        })
    return outputs


_training_kwargs: dict[tuple[int, str], tuple[Any, dict[str, Any]]] = {}


def cached_training_env_kwargs(tokenizer: Any, env_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`training_env_kwargs` once per tokenizer and configuration in a process: verl builds the agent loop for
    every sample, and the template check renders the template several times and logs its choice."""
    key = (id(tokenizer), json.dumps(dict(env_kwargs), sort_keys=True, default=repr))
    if key not in _training_kwargs:  # the tokenizer is kept with the entry, so its id is not reused
        _training_kwargs[key] = (tokenizer, training_env_kwargs(tokenizer, env_kwargs))
    return dict(_training_kwargs[key][1])


try:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
except ImportError:  # verl is optional: the generator and field helpers above work without it
    pass
else:
    __all__ += ["ReToolAgentLoop"]

    @register(AGENT_NAME)
    class ReToolAgentLoop(AgentLoopBase):
        """One ReTool-Env episode per sample. `env_kwargs` go to `ToolEnvironment` (tool_format, prompt, sandbox,
        reward, max_tool_calls, sample_mode, ...); `backend` is the rollout engine ("vllm" or "sglang");
        `abort_retries` is how often an aborted episode is played again before it raises."""

        def __init__(self, *args: Any, env_kwargs: Mapping[str, Any] | None = None, backend: str | None = None,
                     abort_retries: int = 2, mask_void_turns: bool = False, records_path: str | None = None,
                     **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            rollout = self.config.actor_rollout_ref.rollout
            env_kwargs = {"max_completion_tokens": int(rollout.response_length), **dict(env_kwargs or {})}
            template_kwargs = getattr(self, "apply_chat_template_kwargs", None)  # data.apply_chat_template_kwargs
            if template_kwargs and "chat_template_kwargs" not in env_kwargs:
                env_kwargs["chat_template_kwargs"] = dict(template_kwargs)
            self.per_turn = env_kwargs.get("sample_mode", "episode") == "turn"
            trainer = self.config.get("trainer") or {}
            if self.per_turn and not trainer.get("use_v1", True):
                raise ValueError("sample_mode='turn' returns several outputs per episode, which only verl's v1 "
                                 "trainer takes (trainer.use_v1=true); the legacy trainer needs "
                                 "sample_mode='episode'")
            self.env_kwargs = cached_training_env_kwargs(self.tokenizer, env_kwargs)
            self.backend = backend or str(rollout.get("name", "vllm"))
            self.full_determinism = bool(rollout.get("full_determinism", False))
            self.abort_retries = int(abort_retries)
            self.mask_void_turns = bool(mask_void_turns)
            self.records = None if records_path is None else process_record_writer(records_path)

        async def run(self, sampling_params: dict[str, Any], priority: int = 0,
                      **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
            problem = problem_from_row(kwargs)
            priority = int(priority)  # may arrive as np.int64 from the non-tensor batch
            with_logprobs = bool(sampling_params.get("logprobs"))
            sampling = sampling_from_mapping(sampling_params)
            start = time.perf_counter()
            for attempt in range(self.abort_retries + 1):
                generator = self._generator(sampling_params, priority)
                env = ToolEnvironment(self.tokenizer, [problem], **self.env_kwargs)
                try:
                    traj = await run_episode(env, generator, problem=problem, sampling=sampling,
                                             require_logprobs=with_logprobs)
                    break
                except (EpisodeAborted, LogprobsMismatchError) as exc:
                    logger.warning("episode aborted (attempt %d of %d): %s", attempt + 1, self.abort_retries + 1, exc)
                    error = exc
                finally:
                    env.close()
            else:
                raise EpisodeAborted(f"the episode aborted {self.abort_retries + 1} times ({error}); it has no "
                                     "reward, so verl drops its group (v1) or fails the step (legacy)") from error
            text = self.tokenizer.decode(traj.completion_ids, skip_special_tokens=True)
            fields = agent_loop_outputs(traj, with_logprobs=with_logprobs, engine_fields=generator.extra_fields,
                                        verl_text=text)
            prompt_length = int(self.config.actor_rollout_ref.rollout.prompt_length)
            longest = max(len(f["prompt_ids"]) for f in fields)
            if longest > prompt_length:  # verl pads prompts to this length and cannot cut ours
                raise ValueError(f"the environment's prompt has {longest} tokens, more than "
                                 f"rollout.prompt_length={prompt_length}; raise rollout.prompt_length")
            masked = self.mask_void_turns and has_void_turn(traj)
            for f in fields if masked else ():  # SimpleTIR: out of the loss, its reward still in its group
                f["response_mask"] = [0] * len(f["response_mask"])
            if self.records is not None:
                self.records.write([episode_record(
                    traj, decode=self.tokenizer.decode, episode_stats=env.episode_stats(),
                    reward_scheme=env.config.reward, reward_kwargs=env.config.reward_options,
                    env_mask=[0] * len(traj.env_mask) if masked else None, filtered=["void_turn"] if masked else [],
                    question=problem.question, policy_version=generator.extra_fields.get(
                        "global_steps", kwargs.get("global_steps")),
                    group=kwargs.get("uid"), mode="train", trained_reward=traj.reward)])
            tool_seconds = sum(call.duration for call in traj.tool_calls)
            outputs = [AgentLoopOutput(**f, metrics=AgentLoopMetrics(
                generate_sequences=time.perf_counter() - start - tool_seconds, tool_calls=tool_seconds,
                num_preempted=generator.num_preempted if generator.num_preempted is not None else -1))
                for f in fields]
            return outputs if self.per_turn else outputs[0]

        def _generator(self, sampling_params: Mapping[str, Any], priority: int) -> VerlServerGenerator:
            base = {k: v for k, v in sampling_params.items() if k not in ("temperature", "top_p", "top_k")}
            request_id = f"det-{priority}" if self.full_determinism else None
            return VerlServerGenerator(self.server_manager, request_id=request_id, base_params=base,
                                       backend="sglang" if self.backend == "sglang" else "vllm", priority=priority)


def _session_of(key: str) -> str:
    """`{uid}_{session}` of a TransferQueue trajectory key `{uid}_{session}_{index}`."""
    return key.rsplit("_", 1)[0]


try:
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
except ImportError:  # verl's v1 trainer needs transferqueue
    pass
else:
    __all__ += ["ReToolReplayBuffer"]

    class ReToolReplayBuffer(ReplayBuffer):
        """verl v1's synchronous `ReplayBuffer` with the accuracy filter and GRPO-RoC of `retool_env.filters`.

        `sampler_kwargs`: `accuracy_filter` ([low, high]), `roc_down_sample` (n, with `rollout.n=2n`),
        `train_batch_size` (verl hands a custom sampler none: pass `${data.train_batch_size}`),
        `max_inflight_gen_batches` (default 1) and `seed` (RoC's draws, default 0). A finished group is evicted, and
        refilled with twice as many new prompts as verl's DAPO filter refills, when its accuracy (`acc` of its
        trajectories' `reward_extra_info`) lies outside the range, or, under RoC, when its scores are all equal
        (`training/filter_groups/evicted_samples` counts them). As a batch is materialised RoC keeps n
        trajectories of each group (`roc_select` on `score`, `acc`, `retool/roc_penalty`) and clears the others
        from TransferQueue, so GRPO's advantages are those of the n kept (`training/retool/roc_dropped`). verl hands
        a custom sampler no `algorithm.filter_groups`: RoC's equal-score rejection is that DAPO filter on `score`."""

        def __init__(self, trainer_mode: str, trainer_config: Any, max_off_policy_threshold: int | None,
                     max_off_policy_strategy: str, sampler_kwargs: Mapping[str, Any] | None,
                     poll_interval: float = 2.0, refill_fn: Any = None, **kwargs: Any) -> None:
            options = dict(sampler_kwargs or {})
            accuracy_filter = options.pop("accuracy_filter", None)
            self.retool_filters = TrajectoryFilters(
                accuracy_filter=None if accuracy_filter is None else tuple(accuracy_filter),
                roc_down_sample=options.pop("roc_down_sample", None))
            train_batch_size = options.pop("train_batch_size", None)
            max_inflight_gen_batches = int(options.pop("max_inflight_gen_batches", 1))
            self.roc_seed = int(options.pop("seed", 0))
            if options:
                raise ValueError(f"ReToolReplayBuffer's sampler_kwargs are accuracy_filter, roc_down_sample, "
                                 f"train_batch_size, max_inflight_gen_batches and seed; not {sorted(options)}")
            if trainer_mode != "sync":
                raise ValueError("ReToolReplayBuffer filters groups for verl's synchronous v1 trainer; its "
                                 f"{trainer_mode!r} trainer samples with ReplayBufferAsync")
            enabled = accuracy_filter is not None or self.retool_filters.roc_down_sample is not None
            if enabled and train_batch_size is None:
                raise ValueError("ReToolReplayBuffer needs the prompts of one batch to bound its oversampling: set "
                                 "trainer.v1.sampler.sampler_kwargs.train_batch_size=${data.train_batch_size}")
            super().__init__(trainer_mode, trainer_config, max_off_policy_threshold, max_off_policy_strategy,
                             sampler_kwargs, poll_interval=poll_interval, refill_fn=refill_fn,
                             filter_groups_metric="acc" if enabled else None, train_batch_size=train_batch_size,
                             gen_batch_size=1, max_inflight_gen_batches=max_inflight_gen_batches, **kwargs)
            self._global_steps = 0
            self._roc_metrics: dict[str, float] = {}

        def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
            """verl's synchronous sampling (evict, refill, select), then RoC's choice within each selected group."""
            self._global_steps, self._roc_metrics = global_steps, {}
            batch, metrics = super().sample(global_steps, partition_id, batch_size)
            return batch, {**metrics, **self._roc_metrics}

        def _trajectory_infos(self, partition_id: str, keys: Sequence[str]) -> dict[str, dict[str, dict]]:
            """`{uid: {uid_session: reward_extra_info}}` of the trajectories `keys` (a session's last output)."""
            if not keys:
                return {}
            keys = sorted(keys, key=lambda k: int(k.rsplit("_", 1)[1]))
            data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["extra_fields"])
            infos: dict[str, dict[str, dict]] = {}
            for key, value in zip(keys, list(data["extra_fields"]), strict=True):
                extra = getattr(value, "data", value)
                info = extra.get("reward_extra_info", {}) if isinstance(extra, dict) else {}
                infos.setdefault(key.split("_")[0], {})[_session_of(key)] = dict(info)
            return infos

        def _dapo_filtered_keys(self, partition_id: str) -> tuple[set[str], Counter]:
            """The finished groups to evict (the accuracy filter, RoC's equal scores), cached as verl's are."""
            if partition_id == "val" or self.filter_groups_metric is None:
                return set(), Counter()
            finished, cache = self.finished_keys[partition_id], self._dapo_classification_cache[partition_id]
            for uid in cache.keys() - finished:
                del cache[uid]
            new = finished - cache.keys()
            keys = [key for key in self.partitions[partition_id] if key.split("_")[0] in new]
            infos = self._trajectory_infos(partition_id, keys)
            for uid in new:
                cache[uid] = self._eviction_value(list(infos.get(uid, {}).values()))
            evicted = {uid: value for uid, value in cache.items() if value is not None}
            return set(evicted), Counter(evicted.values())

        def _eviction_value(self, infos: Sequence[Mapping[str, Any]]) -> float | None:
            """None to keep a group; else the value verl's DAPO diagnostic counts it under (accuracy, or the
            shared score)."""
            if not infos:
                return None
            correct = [bool(info["acc"]) for info in infos]
            if self.retool_filters.is_outside_accuracy(correct):
                return sum(correct) / len(correct)
            scores = {float(info["score"]) for info in infos}
            if self.retool_filters.roc_down_sample is not None and len(scores) == 1:
                return scores.pop()
            return None

        def _materialize_batch(self, partition_id: str, selected_prompt_uids: list[str],
                               partition_snapshot: dict[str, dict]) -> Any:
            batch = super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)
            keep = self.retool_filters.roc_down_sample
            if partition_id == "val" or keep is None:
                return batch
            infos = self._trajectory_infos(partition_id, list(batch.keys))
            rng = random.Random(derive_seed(self.roc_seed, "roc", self._global_steps))
            kept: set[str] = set()
            for uid in selected_prompt_uids:
                sessions = sorted(infos.get(uid, {}), key=lambda s: int(s.rsplit("_", 1)[1]))
                group = [infos[uid][s] for s in sessions]
                chosen = roc_select([float(i["score"]) for i in group], [bool(i["acc"]) for i in group],
                                    [float(i["retool/roc_penalty"]) for i in group], keep, rng)
                kept |= {sessions[position] for position in chosen}
            rows = [(key, tag) for key, tag in zip(batch.keys, batch.tags, strict=True) if _session_of(key) in kept]
            dropped = [key for key in batch.keys if _session_of(key) not in kept]
            if dropped:
                tq.kv_clear(partition_id=partition_id, keys=dropped)
            played = {_session_of(key) for key in batch.keys}
            self._roc_metrics = {"training/retool/roc_dropped": (len(played) - len(kept & played)) / max(
                len(played), 1)}
            return KVBatchMeta(partition_id=partition_id, keys=[k for k, _ in rows], tags=[t for _, t in rows])
