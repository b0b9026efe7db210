"""verl: an agent loop that plays the environment, generating through verl's server manager with token ids.

`ReToolAgentLoop` is an `AgentLoopBase` registered as "retool_env". Each sample runs one episode with
`retool_env.rollout.run_episode`; `VerlServerGenerator` turns each turn into one `server_manager.generate(request_id,
prompt_ids=..., sampling_params=...)` call (one request id per episode: verl's sticky session keeps the prefix cache).
The output's `prompt_ids`, `response_ids`, `response_mask`, `response_logprobs` and `reward_score` are the
trajectory's own; verl pads them. An episode whose generation is aborted, or whose logprobs are missing while verl
asked for them, comes back in verl's aborted shape: an empty response (verl's metrics count `response_length == 0`
as aborted) with no loss-bearing tokens, never with invented logprobs.

Plug in (verl's trainer config)::

    actor_rollout_ref.rollout.agent.agent_loop_config_path=retool_agent.yaml
    # retool_agent.yaml
    - name: retool_env
      _target_: retool_adapters.verl.ReToolAgentLoop
      env_kwargs: {tool_format: hermes, max_tool_calls: 8, max_observation_tokens: 512}

and give each dataset row `agent_name: retool_env`, the raw problem as the last user message of `prompt`, and the
answer in `reward_model.ground_truth` (verl's RLHFDataset columns). The environment renders the prompt itself and
its completion budget is `rollout.response_length`. This module imports without verl; the agent loop class exists
when verl does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import uuid4

from retool_adapters.chat_templates import training_env_kwargs
from retool_env.data import Problem
from retool_env.env import ToolEnvironment
from retool_env.rollout import EpisodeAborted, Generation, SamplingParams, run_episode
from retool_env.trajectory import Trajectory

from .generators._common import LogprobsMismatchError, TurnGenerator

__all__ = ["AGENT_NAME", "VerlServerGenerator", "agent_loop_fields", "problem_from_row"]

AGENT_NAME = "retool_env"


class VerlServerGenerator(TurnGenerator):
    """A `Generator` over verl's `LLMServerClient` / `AsyncLLMServerManager` (`generate(request_id, prompt_ids=,
    sampling_params=) -> TokenOutput`).

    `base_params` are verl's own sampling params for the batch (`logprobs`, `repetition_penalty`, ...); each turn adds
    the environment's `max_tokens` and stops. `backend` names the rollout engine, which decides how a stop string is
    kept in the output (vLLM `include_stop_str_in_output`, SGLang `no_stop_trim`).
    """

    def __init__(self, server_manager: Any, *, request_id: str | None = None,
                 base_params: Mapping[str, Any] | None = None, backend: str = "vllm") -> None:
        if backend not in ("vllm", "sglang"):
            raise ValueError(f"backend must be 'vllm' or 'sglang', not {backend!r}")
        self.server_manager = server_manager
        self.request_id = request_id or uuid4().hex
        self.base_params = dict(base_params or {})
        self.backend = backend

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
                                                    sampling_params=params)
        token_ids = [int(t) for t in output.token_ids]
        if output.stop_reason == "aborted":
            return Generation(token_ids=token_ids, logprobs=None, finish_reason="abort")
        logprobs = None if output.log_probs is None else [float(v) for v in output.log_probs]
        if logprobs is not None and len(logprobs) != len(token_ids):
            raise LogprobsMismatchError(f"the server returned {len(logprobs)} logprobs for {len(token_ids)} tokens")
        # verl reports "completed" for both stop and length: a full turn without a stop token was cut off.
        stopped = bool(token_ids) and token_ids[-1] in stop_token_ids
        finish_reason = "length" if len(token_ids) >= max_tokens and not stopped else "stop"
        return Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason)


def problem_from_row(row: Mapping[str, Any]) -> Problem:
    """The raw problem of a verl dataset row: the last user message of `raw_prompt`, `reward_model.ground_truth`."""
    extra = row.get("extra_info") or {}
    question = extra.get("question")
    if question is None:
        question = next(m["content"] for m in reversed(list(row["raw_prompt"])) if m["role"] == "user")
    answer = (row.get("reward_model") or {}).get("ground_truth", extra.get("answer", ""))
    return Problem(question=str(question), answer=str(answer), id=str(extra.get("index", row.get("index", ""))))


def agent_loop_fields(traj: Trajectory, *, with_logprobs: bool) -> dict[str, Any]:
    """`AgentLoopOutput` fields of a finished episode (verl counts turns as 1 user + assistant + tool turns)."""
    tool_turns = sum(turn.env_end > turn.end for turn in traj.turns)
    return {
        "prompt_ids": list(traj.prompt_ids),
        "response_ids": list(traj.completion_ids),
        "response_mask": list(traj.env_mask),
        "response_logprobs": list(traj.logprobs) if with_logprobs else None,
        "reward_score": traj.reward,
        "num_turns": 1 + traj.num_turns + tool_turns,
        "extra_fields": {"correct": traj.correct, "num_tool_calls": traj.num_tool_calls,
                         "finish_reason": traj.finish_reason, "aborted": False},
    }


def aborted_fields(prompt_ids: Sequence[int], reason: str, *, with_logprobs: bool) -> dict[str, Any]:
    """verl's shape of an aborted sample: the prompt and an empty response, so nothing enters the loss."""
    return {"prompt_ids": list(prompt_ids), "response_ids": [], "response_mask": [],
            "response_logprobs": [] if with_logprobs else None, "reward_score": 0.0, "num_turns": 0,
            "extra_fields": {"correct": None, "num_tool_calls": 0, "finish_reason": f"aborted: {reason}",
                             "aborted": True}}


try:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
except ImportError:  # verl is optional: the generator and field helpers above work without it
    pass
else:
    __all__ += ["ReToolAgentLoop"]

    @register(AGENT_NAME)
    class ReToolAgentLoop(AgentLoopBase):
        """One ReTool-Env episode per sample. `env_kwargs` go to `ToolEnvironment` (tool_format, prompt, sandbox,
        reward, max_tool_calls, ...); `backend` is the rollout engine ("vllm" or "sglang")."""

        def __init__(self, *args: Any, env_kwargs: Mapping[str, Any] | None = None, backend: str | None = None,
                     **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            env_kwargs = {"max_completion_tokens": int(self.config.actor_rollout_ref.rollout.response_length),
                          **dict(env_kwargs or {})}
            if env_kwargs.get("sample_mode", "episode") != "episode":  # AgentLoopOutput holds one sequence
                raise ValueError("verl's agent loop returns one sequence per sample: keep sample_mode='episode' (a "
                                 "template that rewrites history is swapped for TRL's training version)")
            self.env_kwargs = training_env_kwargs(self.tokenizer, env_kwargs)
            self.backend = backend or str(self.config.actor_rollout_ref.rollout.get("name", "vllm"))

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
            problem = problem_from_row(kwargs)
            env = ToolEnvironment(self.tokenizer, [problem], **self.env_kwargs)
            with_logprobs = bool(sampling_params.get("logprobs"))
            base = {k: v for k, v in sampling_params.items() if k not in ("temperature", "top_p", "top_k")}
            generator = VerlServerGenerator(self.server_manager, base_params=base,
                                            backend="sglang" if self.backend == "sglang" else "vllm")
            sampling = SamplingParams(temperature=float(sampling_params.get("temperature", 1.0)),
                                      top_p=float(sampling_params.get("top_p", 1.0)),
                                      top_k=int(sampling_params.get("top_k", -1)))
            start = time.perf_counter()
            try:
                traj = await run_episode(env, generator, problem=problem, sampling=sampling,
                                         require_logprobs=with_logprobs)
                fields = agent_loop_fields(traj, with_logprobs=with_logprobs)
            except (EpisodeAborted, LogprobsMismatchError) as exc:
                fields = aborted_fields(env.trajectory.prompt_ids, str(exc), with_logprobs=with_logprobs)
                traj = None
            finally:
                env.close()
            prompt_length = int(self.config.actor_rollout_ref.rollout.prompt_length)
            if len(fields["prompt_ids"]) > prompt_length:  # verl pads prompts to this length and cannot cut ours
                raise ValueError(f"the environment's prompt has {len(fields['prompt_ids'])} tokens, more than "
                                 f"rollout.prompt_length={prompt_length}; raise rollout.prompt_length")
            tool_seconds = sum(call.duration for call in traj.tool_calls) if traj else 0.0
            metrics = AgentLoopMetrics(generate_sequences=time.perf_counter() - start - tool_seconds,
                                       tool_calls=tool_seconds)
            return AgentLoopOutput(**fields, metrics=metrics)
