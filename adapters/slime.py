"""slime (and its vLLM port): a custom generate function and reward function that play the environment.

slime plugs both in by dotted path; the episode itself is `retool_env.rollout.run_episode`, so the tokens, mask and
reward slime trains on are exactly the environment's trajectory. Two generation clients speak slime's engines:

- `SGLangGenerator`: SGLang's `/generate` (`input_ids`, `return_logprob`), read from `meta_info.output_token_logprobs`.
- `VLLMRouterGenerator`: vLLM's token-in/token-out `/inference/v1/generate` (`token_ids`), read from
  `choices[0].token_ids` and `choices[0].logprobs.content[i].logprob`: the slime-to-vLLM port's router.

A turn whose logprobs are missing or do not match its tokens ends the sample as ABORTED (slime returns the group to
the buffer); logprobs are never zero-filled.

Plug in (slime's RL script)::

    --custom-generate-function-path retool_adapters.slime.generate
    --custom-rm-path retool_adapters.slime.reward_func
    --custom-config-path retool.yaml   # optional: retool_env: {tool_format: hermes, max_tool_calls: 8}
                                       #           retool_backend: vllm     (default sglang)

The environment's tokenizer is `args.hf_checkpoint`; its completion budget is `args.rollout_max_response_len`.
Do not pass `--apply-chat-template`: the environment renders the prompt itself from the raw problem in
`sample.prompt` (a string, or messages whose last user message is the problem).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from retool_env.data import Problem
from retool_env.env import ToolEnvironment, load_tokenizer
from retool_env.grading import grade
from retool_env.rewards import EpisodeStats, get_reward_fn
from retool_env.rollout import EpisodeAborted, Generation, SamplingParams, run_episode
from retool_env.trajectory import Trajectory

from .generators._common import DEFAULT_SAMPLING, LogprobsMismatchError
from .generators.openai_completions import OpenAICompletionsGenerator

__all__ = ["SGLangGenerator", "VLLMRouterGenerator", "fill_sample", "generate", "reward_func"]

# vLLM's /inference/v1/generate sends this logprob when the sampled token is missing from the engine's top-k map.
_VLLM_MISSING_LOGPROB = -9999.0


def _finish(reason: Any) -> str:
    return reason if reason in ("stop", "length", "abort") else "abort"


class SGLangGenerator(OpenAICompletionsGenerator):
    """SGLang's native `/generate` with token ids in and `meta_info.output_token_logprobs` out.

    `no_stop_trim` keeps a stop string's tokens in the output, so the returned ids are everything sampled.
    """

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, model="", **kwargs)
        self.url = base_url.rstrip("/") + "/generate"

    async def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        stop_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        sampling: SamplingParams = DEFAULT_SAMPLING,
    ) -> Generation:
        """Generate one turn with one `/generate` request."""
        if max_tokens <= 0:
            return Generation(token_ids=[], logprobs=[], finish_reason="length")
        params: dict[str, Any] = {
            "max_new_tokens": max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k, "stop": list(stop), "stop_token_ids": list(stop_token_ids),
            "no_stop_trim": True, "skip_special_tokens": False, "spaces_between_special_tokens": False,
            **({"sampling_seed": sampling.seed} if sampling.seed is not None else {}),
        }
        body = await self._post({"input_ids": list(prompt_ids), "sampling_params": params, "return_logprob": True,
                                 **self.extra_body})
        return parse_sglang_output(body)


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


class VLLMRouterGenerator(OpenAICompletionsGenerator):
    """vLLM's token-in/token-out `/inference/v1/generate` (the vLLM port of slime's router)."""

    def __init__(self, base_url: str, model: str | None = None, **kwargs: Any) -> None:
        super().__init__(base_url, model=model or "", **kwargs)
        self.url = base_url.rstrip("/") + "/inference/v1/generate"
        self.model = model

    async def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        stop_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        sampling: SamplingParams = DEFAULT_SAMPLING,
    ) -> Generation:
        """Generate one turn with one `/inference/v1/generate` request."""
        if max_tokens <= 0:
            return Generation(token_ids=[], logprobs=[], finish_reason="length")
        params: dict[str, Any] = {
            "max_tokens": max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k, "stop": list(stop), "stop_token_ids": list(stop_token_ids),
            "include_stop_str_in_output": True, "skip_special_tokens": False, "logprobs": 0,
            **({"seed": sampling.seed} if sampling.seed is not None else {}),
        }
        payload = {"token_ids": list(prompt_ids), "sampling_params": params, **self.extra_body}
        if self.model:
            payload["model"] = self.model
        return parse_vllm_choice((await self._post(payload))["choices"][0])


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


# ------------------------------------------------------------------------------------------------ slime plug-ins
_envs: dict[str, list[ToolEnvironment]] = {}  # idle environments per configuration, reused across samples
_generators: dict[str, OpenAICompletionsGenerator] = {}
_tokenizers: dict[str, Any] = {}


def _env_kwargs(args: Any) -> dict[str, Any]:
    kwargs = dict(getattr(args, "retool_env", None) or {})
    if getattr(args, "rollout_max_response_len", None):
        kwargs.setdefault("max_completion_tokens", int(args.rollout_max_response_len))
    return kwargs


def _env_key(args: Any) -> str:
    return json.dumps([args.hf_checkpoint, _env_kwargs(args)], sort_keys=True, default=str)


def _take_env(args: Any, problem: Problem) -> ToolEnvironment:
    if envs := _envs.setdefault(_env_key(args), []):
        return envs.pop()
    path = args.hf_checkpoint
    if path not in _tokenizers:
        _tokenizers[path] = load_tokenizer(path)
    return ToolEnvironment(_tokenizers[path], [problem], **_env_kwargs(args))


def _generator(args: Any) -> OpenAICompletionsGenerator:
    url = getattr(args, "retool_router_url", None) or f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    backend = getattr(args, "retool_backend", "sglang")
    model = getattr(args, "retool_model", None)
    key = f"{backend} {url} {model}"
    if key not in _generators:
        if backend not in ("sglang", "vllm"):
            raise ValueError(f"retool_backend must be 'sglang' or 'vllm', not {backend!r}")
        _generators[key] = SGLangGenerator(url) if backend == "sglang" else VLLMRouterGenerator(url, model)
    return _generators[key]


def problem_from_sample(sample: Any) -> Problem:
    """The raw problem of a slime sample: `sample.prompt` (text, or the last user message) and `sample.label`."""
    prompt = sample.prompt
    if not isinstance(prompt, str):
        prompt = next(m["content"] for m in reversed(prompt) if m.get("role") == "user")
    if "<|im_start|>" in prompt:
        raise ValueError("sample.prompt is already chat-templated; drop --apply-chat-template (the environment "
                         "renders the prompt itself)")
    return Problem(question=prompt, answer=str(sample.label or ""), id=str(sample.index or ""))


def fill_sample(sample: Any, traj: Trajectory, tokenizer: Any) -> Any:
    """Write an episode into a slime `Sample`: tokens, response, loss mask, rollout logprobs, reward, status."""
    sample.tokens = [*traj.prompt_ids, *traj.completion_ids]
    sample.response_length = len(traj.completion_ids)
    sample.response = tokenizer.decode(traj.completion_ids)
    sample.loss_mask = list(traj.env_mask)
    sample.rollout_log_probs = list(traj.logprobs) if traj.has_logprobs else None
    sample.reward = traj.reward
    sample.tool_call_count = traj.num_tool_calls  # what slime's own retool example records
    sample.metadata = {**(sample.metadata or {}), "retool": {
        "reward": traj.reward, "correct": traj.correct, "pred": traj.pred, "num_tool_calls": traj.num_tool_calls,
        "num_turns": traj.num_turns, "finish_reason": traj.finish_reason}}
    status = type(sample).Status
    sample.status = status.TRUNCATED if traj.truncated else status.COMPLETED
    return sample


def abort_sample(sample: Any, reason: str) -> Any:
    """Mark a sample ABORTED with no response (slime retries its group), saying why in its metadata."""
    sample.response, sample.response_length, sample.loss_mask, sample.rollout_log_probs = "", 0, [], None
    sample.reward = None
    sample.metadata = {**(sample.metadata or {}), "retool": {"aborted": reason}}
    sample.status = type(sample).Status.ABORTED
    return sample


async def generate(args: Any, sample: Any, sampling_params: Mapping[str, Any], evaluation: bool = False) -> Any:
    """slime's custom generate function: one episode of the environment per sample.

    Honours slime's temperature / top_p / top_k; the environment sets each turn's token budget and stop tokens.
    Partial rollout is not supported (a retried sample starts again from its prompt).
    """
    problem = problem_from_sample(sample)
    env = _take_env(args, problem)
    sampling = SamplingParams(temperature=float(sampling_params.get("temperature", 1.0)),
                              top_p=float(sampling_params.get("top_p", 1.0)),
                              top_k=int(sampling_params.get("top_k", -1)),
                              seed=sampling_params.get("sampling_seed"))
    try:
        traj = await run_episode(env, _generator(args), problem=problem, sampling=sampling, require_logprobs=True)
        return fill_sample(sample, traj, env.tokenizer)
    except (EpisodeAborted, LogprobsMismatchError) as exc:
        return abort_sample(sample, str(exc))
    finally:
        _envs[_env_key(args)].append(env)


async def reward_func(args: Any, sample: Any, **kwargs: Any) -> float | list[float]:
    """slime's custom reward: the environment's reward for the episode (a list of samples when `--group-rm`).

    A sample that did not come from `generate` above is graded on its response text with `args.retool_reward`
    (default "retool"), counting `sample.tool_call_count` tool calls.
    """
    if isinstance(sample, list):
        return [await reward_func(args, s, **kwargs) for s in sample]
    record = (sample.metadata or {}).get("retool") or {}
    if record.get("reward") is not None:
        return float(record["reward"])
    verdict = grade(sample.response, str(sample.label or ""))
    calls = int(getattr(sample, "tool_call_count", 0) or 0)
    return float(get_reward_fn(getattr(args, "retool_reward", "retool"))(verdict, EpisodeStats(num_tool_calls=calls)))
