"""slime and vime (slime on vLLM): a custom generate function, reward function and dynamic filter that play the
environment.

slime plugs them in by dotted path; the episode itself is `retool_env.rollout.run_episode`, so the tokens, mask and
reward slime trains on are exactly the environment's trajectory. Two generation clients speak slime's engines:

- `SGLangGenerator`: SGLang's `/generate` (`input_ids`, `return_logprob`), read from `meta_info.output_token_logprobs`.
- `VLLMRouterGenerator`: vLLM's token-in/token-out `/inference/v1/generate` (`token_ids`, `model`), read from
  `choices[0].token_ids` and `choices[0].logprobs.content[i].logprob`: vime's router.

`generate` honours what the rollout puts in `sampling_params`: temperature, top-p, top-k, the seed (slime's
`sampling_seed`, vime's `seed`), `max_new_tokens` (so `--eval-max-response-len` holds), `stop`/`stop_token_ids`
(beside the tool format's own), and SGLang's `custom_params` (top-p replay: `--rollout-top-p` below 1 fills
`rollout_top_p_token_ids`/`_offsets`, empty spans for environment tokens). The completion never outgrows
`--rollout-max-context-len`. Each turn's `meta_info` adds to `weight_versions`, `prefix_cache_info` and `spec_info`.

A turn whose logprobs are missing or do not match its tokens ends the sample as ABORTED, with no reward; logprobs are
never zero-filled. slime's fully-async rollout returns an ABORTED group to the buffer; its default rollout
(`generate_rollout`) does not, so under it pass `--dynamic-sampling-filter-path
retool_adapters.slime.drop_aborted_groups` (refused without it, at the first sample).

An aborted evaluation episode is played again (`retool_abort_retries`, default 2), then raises: slime's evaluation
reads `reward[key]` of every sample and has no abort path. With `sample_mode="turn"` (a chat template that rewrites
history) `generate` returns one `Sample` per rewritten context, sharing the episode's `rollout_id`; pass
`--custom-reward-post-process-path retool_adapters.slime.trajectory_rewards` so GRPO counts each trajectory once.

With `--reward-key` (slime's ReTool script sets `score`) the reward is a dict: `{key: reward, "correct", "pred",
"num_tool_calls"}`; without it, a float.

Plug in (slime's RL script)::

    --custom-generate-function-path retool_adapters.slime.generate
    --custom-rm-path retool_adapters.slime.reward_func
    --dynamic-sampling-filter-path retool_adapters.slime.drop_aborted_groups
    --custom-config-path retool.yaml   # optional: retool_env: {tool_format: hermes, max_tool_calls: 8}

Trajectory filters and records (`retool_env.filters`, `retool_env.records`; each off by default), set in the
`--custom-config-path` yaml beside `retool_env`:

- `retool_mask_void_turns: true` (SimpleTIR): a sample with a void turn gets `remove_sample` and a loss mask of
  0s, its reward still in its group's normalisation. Every sample's `metadata["retool"]` carries `void_turn` and
  `roc_penalty`.
- `retool_accuracy_filter: [0.1, 0.9]`: `drop_aborted_groups` (the dynamic filter above) drops a group whose
  accuracy lies outside the range (reason "accuracy"); slime's dynamic sampling then draws more groups
  (`--over-sampling-batch-size`): the papers' oversampling.
- `retool_roc_down_sample: n` (GRPO-RoC, with `--n-samples-per-prompt 2n`): the dynamic filter drops groups whose
  rewards are all equal (reason "roc_equal_reward"), and `--custom-reward-post-process-path
  retool_adapters.slime.roc_rewards` keeps n of each group (`roc_select`), normalising their rewards among
  themselves, and takes the others out of the loss (`remove_sample`, loss mask 0, advantage 0). slime's batch
  keeps its `rollout_batch_size * n_samples_per_prompt` samples (its reward normalisation and global batch are
  sized by them), so the dropped half is masked, not removed, as on TRL's path.
- `retool_records_path: runs/records.jsonl`: every episode `generate` plays is appended, one file per process
  (`records.<host>-<pid>.jsonl`), `group` the sample's `group_index`, evaluation episodes with `mode` "eval". The
  group filters decide later, so a record's `filtered` names `void_turn` only.

The environment's tokenizer is `args.hf_checkpoint`. Do not pass `--apply-chat-template`: the environment renders the
prompt itself from the raw problem in `sample.prompt` (a string, or messages whose last user message is the problem).
Partial rollout is not supported (a retried sample starts again from its prompt).
"""

from __future__ import annotations

import base64
import copy
import importlib
import json
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from retool_env.data import Problem, message_text, strip_dapo_template
from retool_env.env import ToolEnvironment
from retool_env.filters import TrajectoryFilters, has_void_turn, roc_penalty, roc_select
from retool_env.grading import grade
from retool_env.prompts import render_prompt
from retool_env.records import episode_record, process_record_writer
from retool_env.rewards import EpisodeStats, get_reward_fn
from retool_env.rollout import EpisodeAborted, Generation, SamplingParams, derive_seed, run_episode
from retool_env.tokens import load_tokenizer
from retool_env.trajectory import Trajectory

from .generators.base import (
    DEFAULT_SAMPLING,
    LogprobsMismatchError,
    TurnGenerator,
    sampling_from_mapping,
    spent_budget_turn,
)
from .generators.openai_completions import OpenAICompletionsGenerator

__all__ = ["SGLangGenerator", "VLLMRouterGenerator", "drop_aborted_groups", "fill_sample", "fill_samples", "generate",
           "reward_func", "roc_rewards", "trajectory_rewards"]

# vLLM's /inference/v1/generate sends this logprob when the sampled token is missing from the engine's top-k map.
_VLLM_MISSING_LOGPROB = -9999.0
# The rollout functions that send an ABORTED group on to training unless a dynamic filter drops it.
_DEFAULT_ROLLOUTS = ("slime.rollout.sglang_rollout.generate_rollout", "vime.rollout.vllm_rollout.generate_rollout")
_TOP_P_IDS = ("top_p_token_ids", "top_p_kept_token_ids")  # SGLang's meta_info keys for top-p replay
_TOP_P_OFFSETS = ("top_p_token_offsets", "top_p_kept_token_offsets")


def _finish(reason: Any) -> str:
    return reason if reason in ("stop", "length", "abort") else "abort"


class _EngineClient(OpenAICompletionsGenerator):
    """A router client whose `request` also returns the engine's `meta_info`; `generate` keeps the turn only.
    Subclasses name the engine's own keys and send the request body (`_send`)."""

    max_tokens_key = "max_tokens"
    seed_key = "seed"
    # The engine's params that return every sampled token, a stop string's too.
    keep_every_token: ClassVar[Mapping[str, Any]] = {}

    async def _generate(
        self, prompt_ids: list[int], max_tokens: int, stop_token_ids: list[int], stop: list[str],
        sampling: SamplingParams,
    ) -> Generation:
        return (await self.request(prompt_ids, max_tokens=max_tokens, stop_token_ids=stop_token_ids, stop=stop,
                                   sampling=sampling))[0]

    async def request(self, prompt_ids: Sequence[int], *, max_tokens: int, stop_token_ids: Sequence[int] = (),
                      stop: Sequence[str] = (), sampling: SamplingParams = DEFAULT_SAMPLING,
                      extra_params: Mapping[str, Any] | None = None) -> tuple[Generation, dict[str, Any]]:
        """One turn and the engine's `meta_info`; `extra_params` ride along in `sampling_params` (custom params)."""
        if max_tokens <= 0:
            return spent_budget_turn(), {}
        params: dict[str, Any] = {
            **(extra_params or {}),
            self.max_tokens_key: max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k, "stop": list(stop), "stop_token_ids": list(stop_token_ids),
            "skip_special_tokens": False, **self.keep_every_token,
            **({self.seed_key: sampling.seed} if sampling.seed is not None else {}),
        }
        return await self._send(list(prompt_ids), params)

    async def _send(self, prompt_ids: list[int], params: dict[str, Any]) -> tuple[Generation, dict[str, Any]]:
        raise NotImplementedError


class SGLangGenerator(_EngineClient):
    """SGLang's native `/generate` with token ids in and `meta_info.output_token_logprobs` out.

    `no_stop_trim` keeps a stop string's tokens in the output, so the returned ids are everything sampled.
    """

    max_tokens_key = "max_new_tokens"
    seed_key = "sampling_seed"
    keep_every_token: ClassVar[Mapping[str, Any]] = {"no_stop_trim": True, "spaces_between_special_tokens": False}

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, model="", **kwargs)
        self.url = base_url.rstrip("/") + "/generate"

    async def _send(self, prompt_ids: list[int], params: dict[str, Any]) -> tuple[Generation, dict[str, Any]]:
        body = await self._post({"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True,
                                 **self.extra_body})
        return parse_sglang_output(body), dict(body.get("meta_info") or {})


def parse_sglang_output(body: Mapping[str, Any]) -> Generation:
    """Token ids, logprobs and finish reason from SGLang's `/generate` answer (`[logprob, token_id, text]` rows)."""
    meta = body.get("meta_info") or {}
    reason = _finish((meta.get("finish_reason") or {}).get("type"))
    rows = meta.get("output_token_logprobs")
    if rows is None:
        if reason == "abort":
            return Generation(token_ids=[], logprobs=None, finish_reason="abort")
        raise LogprobsMismatchError("SGLang returned no output_token_logprobs (was return_logprob set?)")
    logprobs = [row[0] for row in rows]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in logprobs):
        raise LogprobsMismatchError(f"SGLang returned missing or non-finite logprobs: {logprobs}")
    return Generation(token_ids=[int(row[1]) for row in rows], logprobs=[float(v) for v in logprobs],
                      finish_reason=reason)


class VLLMRouterGenerator(_EngineClient):
    """vLLM's token-in/token-out `/inference/v1/generate` (vime's router), with `model` as vime sends it; the
    `meta_info` it returns is in SGLang's shape, from the choice and `usage` (as vime builds it)."""

    keep_every_token: ClassVar[Mapping[str, Any]] = {"include_stop_str_in_output": True, "logprobs": 0}

    def __init__(self, base_url: str, model: str | None = None, **kwargs: Any) -> None:
        super().__init__(base_url, model=model or "", **kwargs)
        self.url = base_url.rstrip("/") + "/inference/v1/generate"
        self.model = model or ""  # sent only when given

    async def _send(self, prompt_ids: list[int], params: dict[str, Any]) -> tuple[Generation, dict[str, Any]]:
        payload = {"token_ids": prompt_ids, "sampling_params": params, **self.extra_body}
        if self.model:
            payload["model"] = self.model
        body = await self._post(payload)
        choice, usage = body["choices"][0], body.get("usage") or {}
        generation = parse_vllm_choice(choice)
        meta = {"finish_reason": {"type": generation.finish_reason}}
        if usage:
            meta.update(prompt_tokens=usage.get("prompt_tokens", 0),
                        completion_tokens=usage.get("completion_tokens", 0),
                        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
        return generation, meta


def parse_vllm_choice(choice: Mapping[str, Any]) -> Generation:
    """Token ids, logprobs and finish reason from one choice of `/inference/v1/generate`."""
    token_ids = choice.get("token_ids")
    reason = _finish(choice.get("finish_reason") or "stop")
    if token_ids is None:
        if reason == "abort":
            return Generation(token_ids=[], logprobs=None, finish_reason="abort")
        raise ValueError("the router returned no token_ids")
    content = (choice.get("logprobs") or {}).get("content")
    if content is None or len(content) != len(token_ids):
        got = "no" if content is None else len(content)
        raise LogprobsMismatchError(f"the router returned {got} logprobs for {len(token_ids)} tokens")
    if any(entry.get("token_id", t) != t for entry, t in zip(content, token_ids, strict=True)):
        raise LogprobsMismatchError("the logprobs belong to other tokens than the returned token_ids")
    logprobs = [entry.get("logprob") for entry in content]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > _VLLM_MISSING_LOGPROB for v in logprobs):
        raise LogprobsMismatchError(f"the router returned missing or sentinel logprobs: {logprobs}")
    return Generation(token_ids=list(token_ids), logprobs=[float(v) for v in logprobs], finish_reason=reason)


class _EpisodeTurns(TurnGenerator):
    """The Generator of one episode: adds the rollout's own params to each request and keeps each turn's meta_info."""

    def __init__(self, client: SGLangGenerator | VLLMRouterGenerator, sampling_params: Mapping[str, Any]) -> None:
        self.client = client
        self.stop = list(sampling_params.get("stop") or [])
        self.stop_token_ids = list(sampling_params.get("stop_token_ids") or [])
        # SGLang takes slime's params as they are (custom_params, repetition_penalty, ...); vLLM only what we map.
        self.extra_params = dict(sampling_params) if isinstance(client, SGLangGenerator) else {}
        self.metas: list[dict[str, Any]] = []

    async def _generate(
        self, prompt_ids: list[int], max_tokens: int, stop_token_ids: list[int], stop: list[str],
        sampling: SamplingParams,
    ) -> Generation:
        generation, meta = await self.client.request(
            prompt_ids, max_tokens=max_tokens, stop_token_ids=[*stop_token_ids, *self.stop_token_ids],
            stop=[*stop, *self.stop], sampling=sampling, extra_params=self.extra_params)
        self.metas.append({**meta, "num_tokens": len(generation.token_ids)})
        return generation


# ------------------------------------------------------------------------------------------------ slime plug-ins
_envs: dict[str, list[ToolEnvironment]] = {}  # idle environments per configuration, reused across samples
_generators: dict[str, SGLangGenerator | VLLMRouterGenerator] = {}
_tokenizers: dict[str, Any] = {}


def _env_kwargs(args: Any) -> dict[str, Any]:
    return dict(getattr(args, "retool_env", None) or {})


def _env_key(args: Any) -> str:
    return json.dumps([args.hf_checkpoint, _env_kwargs(args)], sort_keys=True, default=str)


def _take_env(args: Any, problem: Problem) -> ToolEnvironment:
    if envs := _envs.setdefault(_env_key(args), []):
        return envs.pop()
    path = args.hf_checkpoint
    if path not in _tokenizers:
        _tokenizers[path] = load_tokenizer(path)
    return ToolEnvironment(_tokenizers[path], [problem], **_env_kwargs(args))


def _backend(args: Any) -> str:
    """`retool_backend` when set; else vLLM under vime (which has `vllm_router_ip`), SGLang under slime."""
    backend = getattr(args, "retool_backend", None) or ("vllm" if hasattr(args, "vllm_router_ip") else "sglang")
    if backend not in ("sglang", "vllm"):
        raise ValueError(f"retool_backend must be 'sglang' or 'vllm', not {backend!r}")
    return backend


def _router_url(args: Any, backend: str) -> str:
    if url := getattr(args, "retool_router_url", None):
        return url
    for prefix in (("vllm", "sglang") if backend == "vllm" else ("sglang",)):
        ip, port = getattr(args, f"{prefix}_router_ip", None), getattr(args, f"{prefix}_router_port", None)
        if ip and port:
            return f"http://{ip}:{port}"
    raise ValueError(f"no {backend} router address in the arguments (vime: vllm_router_ip/port, slime: "
                     "sglang_router_ip/port); set retool_router_url in --custom-config-path")


def _generator(args: Any) -> SGLangGenerator | VLLMRouterGenerator:
    backend = _backend(args)
    url = _router_url(args, backend)
    model = getattr(args, "retool_model", None) or args.hf_checkpoint  # vime sends model=args.hf_checkpoint
    key = f"{backend} {url} {model}"
    if key not in _generators:
        _generators[key] = SGLangGenerator(url) if backend == "sglang" else VLLMRouterGenerator(url, model)
    return _generators[key]


def _wants_top_p(sampling_params: Mapping[str, Any]) -> bool:
    return bool((sampling_params.get("custom_params") or {}).get("return_top_p_token_ids"))


def _refuse_what_cannot_be_served(args: Any, sampling_params: Mapping[str, Any], evaluation: bool) -> None:
    """Settings whose samples would break the trainer or train on aborted episodes: a clear error, before any."""
    if evaluation:
        return
    if _backend(args) == "vllm" and (_wants_top_p(sampling_params) or getattr(args, "rollout_top_p", 1.0) != 1.0):
        raise ValueError("top-p replay (--rollout-top-p below 1) needs SGLang's return_top_p_token_ids; vLLM's "
                         "/inference/v1/generate does not return the kept token ids: use --rollout-top-p 1.0")
    if _env_kwargs(args).get("sample_mode", "episode") == "turn":
        if getattr(args, "custom_reward_post_process_path", None) is None:
            raise ValueError("sample_mode='turn' returns several samples per episode, which slime's default reward "
                             "normalisation counts once each: pass --custom-reward-post-process-path "
                             "retool_adapters.slime.trajectory_rewards (one advantage per trajectory)")
        if _wants_top_p(sampling_params) or getattr(args, "rollout_top_p", 1.0) != 1.0:
            raise ValueError("top-p replay is not supported with sample_mode='turn': use --rollout-top-p 1.0")
    if getattr(args, "rollout_function_path", None) in _DEFAULT_ROLLOUTS and not getattr(
            args, "dynamic_sampling_filter_path", None):
        raise ValueError("the default rollout function sends ABORTED samples to training: pass "
                         "--dynamic-sampling-filter-path retool_adapters.slime.drop_aborted_groups, or use the "
                         "fully-async rollout (it returns aborted groups to the buffer)")


def _completion_budget(args: Any, env: ToolEnvironment, problem: Problem, sampling_params: Mapping[str, Any]) -> int:
    """The rollout's `max_new_tokens` (train or eval length), kept inside `--rollout-max-context-len`."""
    budget = int(sampling_params.get("max_new_tokens") or args.rollout_max_response_len)
    if context := getattr(args, "rollout_max_context_len", None):
        prompt = render_prompt(env.tokenizer, env.prompt, problem.question, env.format.tools)
        budget = min(budget, int(context) - len(prompt))
    return budget


def problem_from_sample(sample: Any) -> Problem:
    """The raw problem of a slime sample: `sample.prompt` (text, or the last user message) and `sample.label`."""
    prompt = message_text(sample.prompt)
    if "<|im_start|>" in prompt:
        raise ValueError("sample.prompt is already chat-templated; drop --apply-chat-template (the environment "
                         "renders the prompt itself)")
    # DAPO's instruction wrapper (slime's dapo-math-17k jsonl) goes, as load_problems strips it: the environment
    # renders its own instruction.
    return Problem(question=strip_dapo_template(prompt), answer=str(sample.label or ""), id=str(sample.index or ""))


def _int32s(meta: Mapping[str, Any], keys: Sequence[str]) -> list[int] | None:
    """An int32 array of SGLang's meta_info: a list, or base64 of little-endian bytes."""
    value = next((meta[k] for k in keys if meta.get(k) is not None), None)
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value), dtype="<i4").tolist()
    return None if value is None else [int(v) for v in value]


def top_p_spans(traj: Trajectory, metas: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[int]]:
    """slime's ragged top-p replay for the whole response: each model token's kept ids from its turn's meta_info,
    an empty span for every environment token (as `Sample.append_response_tokens(trainable=False)` pads)."""
    spans: list[list[int]] = []
    for meta in metas:
        ids, offsets = _int32s(meta, _TOP_P_IDS), _int32s(meta, _TOP_P_OFFSETS)
        if ids is None or offsets is None:
            if not meta["num_tokens"]:
                continue  # a turn of no tokens needs no spans
            raise ValueError("the engine returned no top-p token ids for custom_params.return_top_p_token_ids; "
                             "use an SGLang with top-p replay, or --rollout-top-p 1.0")
        if meta["num_tokens"] and (len(offsets) != meta["num_tokens"] + 1 or offsets[-1] != len(ids)):
            raise ValueError(f"top-p offsets {len(offsets)} for {meta['num_tokens']} tokens and {len(ids)} ids")
        spans += [ids[offsets[i]:offsets[i + 1]] for i in range(meta["num_tokens"])]
    if len(spans) != sum(traj.env_mask):
        raise ValueError(f"{len(spans)} top-p spans for {sum(traj.env_mask)} generated tokens")
    model_spans = iter(spans)
    ids, offsets = [], [0]
    for mask in traj.env_mask:
        ids += next(model_spans) if mask else []
        offsets.append(len(ids))
    return ids, offsets


def _add_engine_meta(args: Any, sample: Any, metas: Sequence[Mapping[str, Any]]) -> None:
    """What slime's `Sample._apply_meta_info` records from each turn: weight version, prefix cache, speculation."""
    sample.weight_versions = []
    for name in ("prefix_cache_info", "spec_info"):
        if hasattr(sample, name):
            setattr(sample, name, type(getattr(sample, name))())
    for meta in metas:
        if "finish_reason" not in meta:
            continue
        if hasattr(sample, "prefix_cache_info"):
            sample.prefix_cache_info.add(meta)
        if getattr(args, "sglang_speculative_algorithm", False):
            sample.spec_info.add(meta)
        if "weight_version" in meta:
            sample.weight_versions.append(meta["weight_version"])


def _reward(args: Any, record: Mapping[str, Any]) -> float | dict[str, Any] | None:
    """A float; a dict under `--reward-key`/`--eval-reward-key` (the key holds the reward, beside diagnostics)."""
    keys = [k for k in (getattr(args, "reward_key", None), getattr(args, "eval_reward_key", None)) if k]
    if record.get("reward") is None or not keys:
        return record.get("reward")
    return {"correct": record.get("correct"), "pred": record.get("pred"),
            "num_tool_calls": record.get("num_tool_calls"), **dict.fromkeys(keys, record["reward"])}


def fill_sample(sample: Any, traj: Trajectory, tokenizer: Any, args: Any = None,
                metas: Sequence[Mapping[str, Any]] = (), top_p: bool = False) -> Any:
    """Write an episode into a slime `Sample`: tokens, response, loss mask, rollout logprobs, top-p spans, engine
    meta_info, reward, status."""
    sample.tokens = [*traj.prompt_ids, *traj.completion_ids]
    sample.response_length = len(traj.completion_ids)
    sample.response = tokenizer.decode(traj.completion_ids)
    sample.loss_mask = list(traj.env_mask)
    sample.rollout_log_probs = list(traj.logprobs) if traj.has_logprobs else None
    sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets = top_p_spans(traj, metas) if top_p else (
        None, None)
    _add_engine_meta(args, sample, metas)
    sample.tool_call_count = traj.num_tool_calls  # what slime's own retool example records
    record = {"reward": traj.reward, "correct": traj.correct, "pred": traj.pred, "num_tool_calls": traj.num_tool_calls,
              "num_turns": traj.num_turns, "finish_reason": traj.finish_reason, "void_turn": has_void_turn(traj),
              "roc_penalty": roc_penalty(traj)}
    sample.metadata = {**(sample.metadata or {}), "retool": record}
    sample.reward = _reward(args, record)
    status = type(sample).Status
    sample.status = status.TRUNCATED if traj.truncated else status.COMPLETED
    return sample


def abort_sample(sample: Any, reason: str) -> Any:
    """Mark a sample ABORTED with no response and no reward, saying why in its metadata."""
    sample.response, sample.response_length, sample.loss_mask, sample.rollout_log_probs = "", 0, [], None
    sample.rollout_top_p_token_ids = sample.rollout_top_p_token_offsets = None
    sample.reward = None
    sample.metadata = {**(sample.metadata or {}), "retool": {"aborted": reason}}
    sample.status = type(sample).Status.ABORTED
    return sample


async def generate(args: Any, sample: Any, sampling_params: Mapping[str, Any], evaluation: bool = False) -> Any:
    """slime's and vime's custom generate function: one episode of the environment per sample; with
    `sample_mode="turn"`, a list of samples (one per context the chat template rewrote) sharing one `rollout_id`.

    Training: an aborted episode is an ABORTED sample (the rollout returns its group to the buffer, or
    `drop_aborted_groups` drops it). Evaluation has no such path (slime reads `reward[key]` of every sample), so an
    aborted evaluation episode is played again up to `retool_abort_retries` times (default 2), then raises."""
    _refuse_what_cannot_be_served(args, sampling_params, evaluation)
    problem = problem_from_sample(sample)
    sampling = sampling_from_mapping(sampling_params)
    attempts = 1 + (int(getattr(args, "retool_abort_retries", 2)) if evaluation else 0)
    for attempt in range(attempts):
        env = _take_env(args, problem)
        turns = _EpisodeTurns(_generator(args), sampling_params)
        budget = {"max_completion_tokens": _completion_budget(args, env, problem, sampling_params)}
        try:
            traj = await run_episode(env, turns, problem=problem, sampling=sampling, require_logprobs=True,
                                     options=budget)
            if _env_kwargs(args).get("sample_mode", "episode") == "turn":
                filled = fill_samples(sample, traj, env.tokenizer, args, turns.metas)
            else:
                filled = fill_sample(sample, traj, env.tokenizer, args, turns.metas,
                                     top_p=_wants_top_p(sampling_params))
            masked = not evaluation and _filters(args).mask_void_turns and has_void_turn(traj)
            for part in (filled if isinstance(filled, list) else [filled]) if masked else []:
                remove_from_loss(part)  # SimpleTIR: out of the loss, its reward still in its group
            _write_record(args, env, traj, problem, sample, masked, evaluation, sampling.seed, turns.metas)
            return filled
        except (EpisodeAborted, LogprobsMismatchError) as exc:
            if attempt + 1 == attempts and evaluation:
                raise EpisodeAborted(f"an evaluation episode aborted {attempts} times: {exc}") from exc
            if attempt + 1 == attempts:
                return abort_sample(sample, str(exc))
        finally:
            _envs[_env_key(args)].append(env)
    raise AssertionError("unreachable")


def fill_samples(sample: Any, traj: Trajectory, tokenizer: Any, args: Any = None,
                 metas: Sequence[Mapping[str, Any]] = ()) -> list[Any]:
    """The training samples of a `sample_mode="turn"` episode as slime samples: one per sample of the trajectory,
    each a copy of `sample` with its own tokens, loss mask and logprobs, the episode's reward, and one shared
    `rollout_id` (slime's contract for one rollout split into several samples: its loss counts the rollout once)."""
    if len(traj.samples) == 1:
        return [fill_sample(sample, traj, tokenizer, args, metas)]
    rollout_id = sample.rollout_id if sample.rollout_id is not None else sample.index
    filled = fill_sample(copy.deepcopy(sample), traj, tokenizer, args, metas)  # reward, status, metadata, meta_info
    out = []
    for part in traj.samples:
        s = copy.deepcopy(filled)
        s.tokens = [*part.prompt_ids, *part.completion_ids]
        s.response_length = len(part.completion_ids)
        s.response = tokenizer.decode(part.completion_ids)
        s.loss_mask = list(part.env_mask)
        s.rollout_log_probs = list(part.logprobs) if traj.has_logprobs else None
        s.rollout_id = rollout_id
        out.append(s)
    return out


def remove_from_loss(sample: Any) -> None:
    """slime's way to keep a sample out of the loss, its reward still in its group: `remove_sample` (slime zeroes
    its loss mask when it builds the training data), and the loss mask zeroed here too."""
    sample.remove_sample = True
    sample.loss_mask = [0] * sample.response_length


def _filters(args: Any) -> TrajectoryFilters:
    """The trajectory filter options of the `--custom-config-path` yaml (`retool_mask_void_turns`, ...)."""
    accuracy_filter = getattr(args, "retool_accuracy_filter", None)
    return TrajectoryFilters(mask_void_turns=bool(getattr(args, "retool_mask_void_turns", False)),
                             accuracy_filter=None if accuracy_filter is None else tuple(accuracy_filter),
                             roc_down_sample=getattr(args, "retool_roc_down_sample", None))


def _write_record(args: Any, env: ToolEnvironment, traj: Trajectory, problem: Problem, sample: Any, masked: bool,
                  evaluation: bool, seed: int | None, metas: Sequence[Mapping[str, Any]]) -> None:
    """Append the episode to `retool_records_path` (one file per process), when set."""
    path = getattr(args, "retool_records_path", None)
    if path is None:
        return
    versions = [str(meta["weight_version"]) for meta in metas if "weight_version" in meta]
    version = versions[0] if versions else None
    process_record_writer(path).write([episode_record(
        traj, decode=env.tokenizer.decode, episode_stats=env.episode_stats(), reward_scheme=env.config.reward,
        reward_kwargs=env.config.reward_options, env_mask=[0] * len(traj.env_mask) if masked else None,
        filtered=["void_turn"] if masked else [], question=problem.question,
        policy_version=int(version) if version is not None and version.isdigit() else version,
        seed=seed, group=sample.group_index, mode="eval" if evaluation else "train", trained_reward=traj.reward)])


async def reward_func(args: Any, sample: Any, **kwargs: Any) -> float | dict[str, Any] | list | None:
    """slime's custom reward: the environment's reward for the episode (a list of samples when `--group-rm`).

    An ABORTED sample has no reward (None): it is no wrong answer. A sample that did not come from `generate` above
    is graded on its response text with `args.retool_reward` (default "retool"), counting `sample.tool_call_count`.
    """
    if isinstance(sample, list):
        return [await reward_func(args, s, **kwargs) for s in sample]
    if sample.status is type(sample).Status.ABORTED:
        return None
    record = (sample.metadata or {}).get("retool") or {}
    if record.get("reward") is None:
        verdict = grade(sample.response, str(sample.label or ""))
        calls = int(getattr(sample, "tool_call_count", 0) or 0)
        reward_fn = get_reward_fn(getattr(args, "retool_reward", "retool"))
        record = {"reward": float(reward_fn(verdict, EpisodeStats(num_tool_calls=calls))),
                  "correct": verdict.correct, "pred": verdict.pred, "num_tool_calls": calls}
    return _reward(args, record)


def drop_aborted_groups(args: Any, samples: list[Any], **kwargs: Any) -> Any:
    """slime's `--dynamic-sampling-filter-path`: drop a group with an ABORTED sample (reason "aborted"); keep the
    others, or ask `args.retool_dynamic_filter_path` (say, slime's `check_reward_nonzero_std`) about them."""
    if any(s.status is type(s).Status.ABORTED for s in _flat(samples)):
        return _filter_output(keep=False, reason="aborted")
    filters, episodes = _filters(args), [item[0] if isinstance(item, list) else item for item in samples]
    if filters.is_outside_accuracy([bool(_retool_record(s).get("correct")) for s in episodes]):
        return _filter_output(keep=False, reason="accuracy")
    if filters.roc_down_sample is not None and len({float(s.get_reward_value(args)) for s in episodes}) == 1:
        return _filter_output(keep=False, reason="roc_equal_reward")
    if path := getattr(args, "retool_dynamic_filter_path", None):
        module, name = path.rsplit(".", 1)
        return getattr(importlib.import_module(module), name)(args, samples, **kwargs)
    return _filter_output(keep=True)


def _retool_record(sample: Any) -> dict[str, Any]:
    return (sample.metadata or {}).get("retool") or {}


def _flat(samples: Sequence[Any]) -> list[Any]:
    """A group's samples, with the per-turn lists of `sample_mode="turn"` episodes opened."""
    return [s for item in samples for s in (item if isinstance(item, list) else [item])]


def trajectory_rewards(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """slime's `--custom-reward-post-process-path` for `sample_mode="turn"`: GRPO's group normalisation (slime's
    `_post_process_rewards`: minus the group mean, over the std + 1e-6 under `--grpo-std-normalization`) over
    trajectories, not samples (a prompt's group is its `group_index`, a trajectory its `rollout_id`), each
    trajectory's value broadcast to its samples. Counting each sample would weigh long episodes more in the mean
    (mixing per-turn samples into one group made an agent stop calling tools: agent-lightning#489)."""
    raw = [float(s.get_reward_value(args)) for s in samples]
    trajectories: dict[Any, dict[Any, float]] = {}
    for s, r in zip(samples, raw, strict=True):
        trajectories.setdefault(s.group_index, {})[s.rollout_id if s.rollout_id is not None else id(s)] = r
    value: dict[tuple[Any, Any], float] = {}
    for group, rewards in trajectories.items():
        value.update({(group, key): v for key, v in zip(rewards, _normalise(args, list(rewards.values())),
                                                        strict=True)})
    out = [value[(s.group_index, s.rollout_id if s.rollout_id is not None else id(s))] for s in samples]
    return raw, out


def _normalise(args: Any, rewards: list[float]) -> list[float]:
    """slime's `_post_process_rewards` over one group: minus the mean, over the std + 1e-6 under
    `--grpo-std-normalization`, as `--advantage-estimator` and `--rewards-normalization` ask."""
    import torch

    t = torch.tensor(rewards, dtype=torch.float)
    if getattr(args, "rewards_normalization", True) and getattr(
            args, "advantage_estimator", "grpo") in ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"):
        t = t - t.mean()
        if getattr(args, "advantage_estimator", "grpo") in ("grpo", "gspo", "cispo") and getattr(
                args, "grpo_std_normalization", True):
            t = t / (t.std() + 1e-6)
    return t.tolist()


def roc_rewards(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """slime's `--custom-reward-post-process-path` for GRPO-RoC (`retool_roc_down_sample: n`, groups of 2n): per
    group (`group_index`), `roc_select` keeps n trajectories (by `rollout_id`, so `sample_mode="turn"` counts each
    once, as `trajectory_rewards` does), their rewards normalised among themselves; the others get 0 and leave the
    loss (`remove_from_loss`). The draw is seeded by `--rollout-seed` and the group."""
    keep = _filters(args).roc_down_sample
    if keep is None:
        raise ValueError("roc_rewards down-samples to `retool_roc_down_sample` episodes per group: set it in the "
                         "--custom-config-path yaml")
    raw = [float(s.get_reward_value(args)) for s in samples]
    trajectories: dict[Any, dict[Any, list[int]]] = {}
    for i, s in enumerate(samples):
        trajectories.setdefault(s.group_index, {}).setdefault(
            s.rollout_id if s.rollout_id is not None else id(s), []).append(i)
    out = [0.0] * len(samples)
    for group, members in trajectories.items():
        keys = list(members)
        first = [samples[members[key][0]] for key in keys]
        rng = random.Random(derive_seed(getattr(args, "rollout_seed", 0), "roc", group))
        kept = sorted(roc_select([raw[members[key][0]] for key in keys],
                                 [bool(_retool_record(s).get("correct")) for s in first],
                                 [float(_retool_record(s).get("roc_penalty", 0.5)) for s in first], keep, rng))
        values = _normalise(args, [raw[members[keys[k]][0]] for k in kept])
        for position, key in enumerate(keys):
            for i in members[key]:
                if position in kept:
                    out[i] = values[kept.index(position)]
                else:
                    remove_from_loss(samples[i])
    return raw, out


def _filter_output(keep: bool, reason: str | None = None) -> Any:
    """slime's (or vime's) `DynamicFilterOutput`, whose reason becomes a drop metric; a bool where neither exists."""
    for module in ("slime.rollout.filter_hub.base_types", "vime.rollout.filter_hub.base_types"):
        try:
            return importlib.import_module(module).DynamicFilterOutput(keep=keep, reason=reason)
        except ImportError:
            continue
    return keep
