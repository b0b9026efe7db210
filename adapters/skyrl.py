"""SkyRL-gym: the environment as a `BaseTextEnv`, registered in skyrl-gym's registry as "retool_env".

SkyRL's generator owns the tokens: it templates the prompt, generates, hands the environment the turn's text, and
tokenizes the observation messages the environment returns. `ReToolTextEnv` runs a `ToolEnvironment` underneath (the
action re-encoded to ids; parsing, sandbox, budgets, grading and reward are the environment's) and returns
observations that SkyRL tokenizes to the environment's own observation tokens:

- `tool_format="hermes"` (default): one `{"role": "tool"}` message per tool call, for SkyRL's chat-template path
  (`generator.use_conversation_multi_turn=true`, the default). Pass the tool schema to the prompt's template with
  `generator.chat_template_kwargs={tools: ...}` (`CHAT_TEMPLATE_KWARGS` below) so the prompt is the environment's.
- `tool_format="retool"`: the inline `<interpreter>` text as one message whose content SkyRL encodes as is
  (`generator.use_conversation_multi_turn=false`).

Keep `generator.max_env_workers > 0` (the default): `step` is synchronous and runs the sandbox.

Plug in (SkyRL config and dataset)::

    import retool_adapters.skyrl          # registers "retool_env" with skyrl_gym
    environment.env_class=retool_env
    environment.skyrl_gym.retool_env.tokenizer=Qwen/Qwen2.5-7B-Instruct   # plus any ToolEnvironment argument
    # each dataset row: {"prompt": [{"role": "user", "content": <raw problem>}], "env_class": "retool_env",
    #                    "reward_spec": {"method": "rule", "ground_truth": <answer>}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

try:
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType
    from skyrl_gym.envs.registration import register, registry
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(f"retool_adapters.skyrl needs SkyRL-gym: pip install skyrl-gym (missing {exc.name})",
                              name=exc.name) from exc

from retool_env.data import Problem
from retool_env.env import ToolEnvironment
from retool_env.formats import CODE_INTERPRETER_TOOL
from retool_env.tokens import load_tokenizer

__all__ = ["CHAT_TEMPLATE_KWARGS", "ENV_ID", "ReToolTextEnv"]

ENV_ID = "retool_env"
# What SkyRL's generator.chat_template_kwargs needs for the hermes format's prompt.
CHAT_TEMPLATE_KWARGS: dict[str, Any] = {"tools": [CODE_INTERPRETER_TOOL]}
_tokenizers: dict[str, Any] = {}


class ReToolTextEnv(BaseTextEnv):
    """One ReTool-Env episode per instance, text in and chat messages out (skyrl-gym's contract).

    `env_config` (SkyRL's `environment.skyrl_gym.retool_env`): `tokenizer` (object, name or path; required) and any
    `ToolEnvironment` keyword argument. `extras` (the dataset row): `reward_spec.ground_truth`, and `max_turns` from
    SkyRL's generator, which caps tool calls at `max_turns - 1` unless `env_config` sets `max_tool_calls`.
    """

    def __init__(self, env_config: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        config, extras = dict(env_config or {}), dict(extras or {})
        if "tokenizer" not in config:
            raise ValueError("ReToolTextEnv needs env_config['tokenizer'] (the policy's tokenizer name or path)")
        tokenizer = config.pop("tokenizer")
        if isinstance(tokenizer, str):
            tokenizer = _tokenizers.setdefault(tokenizer, load_tokenizer(tokenizer))
        if "max_turns" in extras:
            self.max_turns = int(extras["max_turns"])
            config.setdefault("max_tool_calls", max(0, self.max_turns - 1))
        self.ground_truth = str((extras.get("reward_spec") or {}).get("ground_truth", ""))
        self.env = ToolEnvironment(tokenizer, [Problem("", self.ground_truth)], **config)

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """Start the episode on the prompt's last user message (the raw problem); return the environment's prompt."""
        question = next(m["content"] for m in reversed(prompt) if m["role"] == "user")
        problem = Problem(question=question, answer=self.ground_truth)
        self.env.reset(options={"problem": problem})
        return self.env.prompt.messages(question), {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Run the turn's tool calls, or grade its final answer."""
        self.turns += 1
        ids = self.env.format.encode(action)
        obs_ids, reward, terminated, truncated, info = self.env.step({"token_ids": ids, "finish_reason": "stop"})
        done = terminated or truncated
        if done:
            observations: ConversationType = []
        elif self.env.format.tool_turns:  # results are tool turns the chat template renders (hermes, the dialects)
            observations = self.env.format.tool_messages([r["output"] for r in info["tool_results"]])
        else:
            observations = [{"role": "user", "content": self.env.tokenizer.decode(obs_ids.tolist())}]
        return BaseTextEnvStepOutput(observations=observations, reward=float(reward), done=done,
                                     metadata={"tool_results": info["tool_results"], **self._finish_info(info)})

    @staticmethod
    def _finish_info(info: Mapping[str, Any]) -> dict[str, Any]:
        return {key: info[key] for key in ("correct", "pred", "finish_reason") if key in info}

    def get_metrics(self) -> dict[str, Any]:
        traj = self.env.trajectory
        if traj is None:
            return {}
        return {"num_tool_calls": traj.num_tool_calls, "num_turns": traj.num_turns,
                "correct": float(bool(traj.correct)), "truncated": float(traj.truncated)}

    def close(self) -> None:
        self.env.close()


if ENV_ID not in registry:
    register(id=ENV_ID, entry_point=f"{__name__}:ReToolTextEnv")
