"""OpenRLHF: the environment as an `AgentInstanceBase` for OpenRLHF's `MultiTurnAgentExecutor`.

OpenRLHF's executor owns the tokens: it tokenizes the text `reset` returns as the prompt, generates from token ids,
appends the engine's `token_ids` to the context, hands `step` only the turn's text (`action_text`), and tokenizes
the `environment_feedback` text `step` returns *alone* (`hf_tokenizer(feedback, add_special_tokens=False)`),
appending it to the context. It trains on that concatenation with the action mask set on the engine's action ranges
only. `ReToolAgentInstance` runs a `ToolEnvironment` underneath, stepped with the engine's own output (token ids,
finish reason, logprobs), which `ReToolAgentExecutor` records on its way to OpenRLHF; parsing, sandbox, budgets,
grading and reward are the environment's, and the feedback is its observation ids decoded with their special tokens.

What OpenRLHF trains on compared with the environment's trajectory (checked in tests/test_adapter_openrlhf.py, Qwen2.5
tokenizer, under an engine shaped as vLLM v1, whose `token_ids` end with the stop token `<|im_end|>` while its `text`
does not):
- The prompt and the hermes feedback (`\\n<|im_start|>user\\n<tool_response>...`) re-tokenize to the
  environment's ids exactly, clipped tool outputs included: the environment clips an output's text before the chat
  template encodes it, and each observation starts after a special token (`<|im_end|>`), so no BPE merge crosses
  the seam. Each step still compares them (`extra_logs["feedback_retokenized_mismatch"]`, 1.0 when they differ,
  e.g. under a chat template whose tool turn does not start at a special token).
- The action is the engine's ids in both: stepped with its text, the environment would re-encode a non-canonical
  sampling differently and, under vLLM v1, see a turn without its `<|im_end|>` and close it a second time.
- The inline `retool` format needs generation to stop at `</code>`, and OpenRLHF's sampling parameters have no
  stop strings: use `tool_format="hermes"` (the default here), which stops at the chat template's `<|im_end|>`.

OpenRLHF stops an episode whose context reaches `--data.max_len` without a last `step` (no reward from the
environment, OpenRLHF's 0): keep the environment's `max_completion_tokens` below `max_len` minus the prompt so the
environment ends it first, graded (`extra_logs["env_truncated"]`).

Plug in: an agent file, with OpenRLHF's dataset giving the raw problem (no `--data.apply_chat_template`; the
environment renders the prompt) and the answer as the label::

    # retool_agent.py, passed as --train.agent_func_path retool_agent.py
    from retool_adapters.openrlhf import agent_executor
    AgentExecutor = agent_executor(tool_format="hermes", max_tool_calls=8)
"""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Any

try:
    import torch
    from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(f"retool_adapters.openrlhf needs OpenRLHF: pip install openrlhf (missing {exc.name})",
                              name=exc.name) from exc

from retool_env.data import Problem
from retool_env.env import ToolEnvironment

__all__ = ["ReToolAgentExecutor", "ReToolAgentInstance", "agent_executor", "engine_action"]


@dataclasses.dataclass
class _Episode:
    """What one `execute` shares with its instance: OpenRLHF builds each AgentInstance with no arguments and hands
    `step` no token ids, so the executor passes the tokenizer, the engine's outputs and the instances (to close what
    an episode cut short by OpenRLHF's `max_length` left open) this way."""

    tokenizer: Any
    env_kwargs: dict[str, Any]
    instances: list[ReToolAgentInstance] = dataclasses.field(default_factory=list)
    generations: list[Any] = dataclasses.field(default_factory=list)  # the engine's `outputs[0]`, one per turn


_current: contextvars.ContextVar[_Episode] = contextvars.ContextVar("retool_openrlhf_agent")


class _RecordingEngine:
    """OpenRLHF's `llm_engine`, each output kept for the instance's `step`."""

    def __init__(self, engine: Any, episode: _Episode) -> None:
        self.engine, self.episode = engine, episode

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        request_output = await self.engine.generate(*args, **kwargs)
        self.episode.generations.append(request_output.outputs[0])
        return request_output

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def engine_action(output: Any) -> dict[str, Any]:
    """The environment's action from an engine output: its token ids exactly as generated (a stop token included),
    its finish reason, and its logprobs where it has them."""
    token_ids = [int(t) for t in output.token_ids]
    logprobs = getattr(output, "logprobs", None)
    reason = getattr(output, "finish_reason", None)
    return {"token_ids": token_ids, "finish_reason": reason if reason in ("stop", "length") else None,
            "logprobs": None if not logprobs or len(logprobs) != len(token_ids)
            else [float(step[t].logprob) for step, t in zip(logprobs, token_ids, strict=True)]}


class ReToolAgentInstance(AgentInstanceBase):
    """One ReTool-Env episode per instance (OpenRLHF binds one instance to each sample)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            self.episode = _current.get()
        except LookupError:
            raise RuntimeError("ReToolAgentInstance runs under ReToolAgentExecutor (see agent_executor)") from None
        self.tokenizer, self.env_kwargs = self.episode.tokenizer, self.episode.env_kwargs
        self.env: ToolEnvironment | None = None
        self.episode.instances.append(self)

    async def reset(self, states: dict, **kwargs: Any) -> dict:
        """Start the episode on the dataset's raw problem (`observation`) and answer (`label`)."""
        problem = Problem(question=str(states["observation"]), answer=str(states["label"]))
        self.env = ToolEnvironment(self.tokenizer, [problem], **{"tool_format": "hermes", **self.env_kwargs})
        prompt_ids, _ = self.env.reset(options={"problem": problem})
        return {**states, "observation": self.tokenizer.decode(prompt_ids.tolist(), skip_special_tokens=False)}

    async def step(self, state_dict: dict, **kwargs: Any) -> dict:
        """Run the turn's tool calls, or grade its final answer; the reward comes on the last step. The action is the
        engine's output OpenRLHF just appended (`state_dict["action_text"]` is only its text)."""
        if self.env is None:
            raise RuntimeError("call reset() before step()")
        if not self.episode.generations:
            raise RuntimeError("step() before the engine generated: ReToolAgentExecutor records its outputs")
        obs_ids, reward, terminated, truncated, info = await self.env.astep(engine_action(self.episode.generations[-1]))
        done = terminated or truncated
        feedback = "" if done else self.tokenizer.decode(obs_ids.tolist(), skip_special_tokens=False)
        retokenized = self.tokenizer(text=feedback, add_special_tokens=False)["input_ids"]
        traj = self.env.trajectory
        assert traj is not None
        extra_logs = {"num_tool_calls": float(traj.num_tool_calls),
                      "feedback_retokenized_mismatch": float(retokenized != obs_ids.tolist())}
        if done:
            extra_logs.update(correct=float(bool(traj.correct)), env_truncated=float(traj.truncated))
            self.env.close()
        reward_t = torch.tensor(float(reward), dtype=torch.float64)  # float32 would turn -0.9 into -0.8999999762
        return {"rewards": reward_t, "scores": reward_t,
                "environment_feedback": feedback, "done": done, "extra_logs": extra_logs}


class ReToolAgentExecutor(MultiTurnAgentExecutor):
    """OpenRLHF's multi-turn executor over `ReToolAgentInstance`, with the policy's tokenizer for the environment."""

    env_kwargs: dict[str, Any] = {}  # noqa: RUF012 (set per subclass by agent_executor)

    def __init__(self) -> None:
        super().__init__(ReToolAgentInstance)

    async def execute(self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None):
        episode = _Episode(hf_tokenizer, dict(self.env_kwargs))
        token = _current.set(episode)
        try:
            return await super().execute(prompt, label, sampling_params, max_length, hf_tokenizer,
                                         _RecordingEngine(llm_engine, episode), images)
        finally:
            _current.reset(token)
            for instance in episode.instances:  # OpenRLHF stops at max_length without telling the instance
                if instance.env is not None:
                    instance.env.close()


def agent_executor(**env_kwargs: Any) -> type[ReToolAgentExecutor]:
    """An `AgentExecutor` class for OpenRLHF's agent file, its environments built with these `ToolEnvironment`
    arguments (the tokenizer is OpenRLHF's)."""
    return type("AgentExecutor", (ReToolAgentExecutor,), {"env_kwargs": dict(env_kwargs)})
