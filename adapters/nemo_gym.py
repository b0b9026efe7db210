"""NeMo-Gym: a resources server over the project's sandbox, grader and reward scheme.

NeMo-Gym's agent (e.g. its `simple_agent`) owns the conversation: it calls `/seed_session`, runs the model through
the Responses API, sends each `execute_python` function call to this server's `/execute_python` route, then posts
the whole response to `/verify`, whose `reward` trains the policy, and `/aggregate_metrics` sums a run. The server
keeps the episode's state under NeMo-Gym's session cookie: one sandbox session per rollout (variables persist
between its calls, never across rollouts) and the count of calls it really ran, which the ReTool reward's shaping
reads (`min(-0.6, -1 + 0.1 * k)` when wrong): a response cannot claim calls it did not make. Only the assistant's
own `output_text` is graded; tool output that prints `\\boxed{...}` earns nothing (NeMo-Gym's `math_with_code`
server falls back to grading tool stdout).

Serve it as NeMo-Gym serves its resources servers (an `app.py` in a server folder, plus a config)::

    # resources_servers/retool/app.py
    from retool_adapters.nemo_gym import ReToolResourcesServer
    if __name__ == "__main__":
        ReToolResourcesServer.run_webserver()

Each dataset row carries `expected_answer` beside `responses_create_params` (with the `execute_python` tool in
`tools`, `EXECUTE_PYTHON_TOOL` below). The environment's settings are `EnvConfig`'s, under the server config's `env`
key (`env: {max_tool_calls: 8, reward: retool}`), and a call is budgeted, run and shown by `ToolRunner`, as in
`ToolEnvironment`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

try:
    from fastapi import FastAPI, Request
    from nemo_gym.base_resources_server import (
        BaseResourcesServerConfig,
        BaseRunRequest,
        BaseSeedSessionRequest,
        BaseSeedSessionResponse,
        BaseVerifyRequest,
        BaseVerifyResponse,
        SimpleResourcesServer,
    )
    from nemo_gym.server_utils import SESSION_ID_KEY
    from pydantic import AliasChoices, BaseModel, Field, PrivateAttr, field_validator, model_validator
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(f"retool_adapters.nemo_gym needs NeMo-Gym: pip install nemo-gym (missing {exc.name})",
                              name=exc.name) from exc

from retool_env.config import EnvConfig
from retool_env.formats import ToolCall
from retool_env.grading import agrade
from retool_env.offline import qwen_tokenizer
from retool_env.rewards import EpisodeStats, RewardFn, get_reward_fn
from retool_env.tokens import Tokenizer, load_tokenizer
from retool_env.tool_runner import ToolRunner
from retool_env.trajectory import ToolCallRecord

__all__ = ["EXECUTE_PYTHON_TOOL", "ExecutePythonRequest", "ExecutePythonResponse", "ReToolResourcesServer",
           "ReToolResourcesServerConfig", "ReToolVerifyRequest", "ReToolVerifyResponse"]

# The Responses API function tool the agent offers the model (put it in responses_create_params.tools).
EXECUTE_PYTHON_TOOL: dict[str, Any] = {
    "type": "function", "name": "execute_python", "strict": True,
    "description": "Run Python code in a stateful interpreter and return what it prints.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "Python code"}},
                   "required": ["code"], "additionalProperties": False},
}


# The server's defaults where they differ from EnvConfig's: the tool promises a stateful interpreter, and NeMo-Gym's
# agents wait longer on a call than the token-level environment does.
ENV_DEFAULTS: dict[str, Any] = {"stateful": True, "tool_timeout": 10.0}
ENV_FIELDS = frozenset(f.name for f in fields(EnvConfig))


class ReToolResourcesServerConfig(BaseResourcesServerConfig):
    env: dict[str, Any] = Field(default_factory=dict)  # EnvConfig's keyword arguments: sandbox, max_tool_calls, ...
    tokenizer: str | None = None  # what measures max_observation_tokens; default: the offline Qwen tokenizer

    @model_validator(mode="before")
    @classmethod
    def _move_environment_keys(cls, data: Any) -> Any:
        """Old configs set EnvConfig fields beside `env`: moved into it, with a deprecation warning."""
        if not isinstance(data, dict):
            return data
        moved = {key: data[key] for key in data if key in ENV_FIELDS}
        dropped = "max_output_chars" in data
        if not moved and not dropped:
            return data
        warnings.warn(f"ReToolResourcesServerConfig: put {sorted(moved)} under `env:` (EnvConfig's fields)"
                      + ("; max_output_chars is gone: env.max_observation_tokens clips by tokens" if dropped else ""),
                      DeprecationWarning, stacklevel=2)
        rest = {key: value for key, value in data.items() if key not in moved and key != "max_output_chars"}
        return {**rest, "env": {**moved, **dict(rest.get("env") or {})}}

    @field_validator("env")
    @classmethod
    def _env_is_an_env_config(cls, env: dict[str, Any]) -> dict[str, Any]:
        try:
            EnvConfig(**{**ENV_DEFAULTS, **env})
        except TypeError as exc:
            raise ValueError(f"env takes EnvConfig's fields: {exc}") from exc
        if env.get("on_timeout", "feedback") != "feedback":
            raise ValueError("NeMo-Gym's agent runs the tool loop and cannot end an episode at a tool timeout; "
                             "keep on_timeout='feedback'")
        return env

    @property
    def env_config(self) -> EnvConfig:
        return EnvConfig(**{**ENV_DEFAULTS, **self.env})


class ExecutePythonRequest(BaseModel):
    code: str


class ExecutePythonResponse(BaseModel):
    output: str
    status: str


class ReToolRunRequest(BaseRunRequest):
    # NeMo-Gym's math_with_judge rows call it expected_answer, its math_with_code rows expected_result
    expected_answer: str = Field(validation_alias=AliasChoices("expected_answer", "expected_result"))


class ReToolVerifyRequest(ReToolRunRequest, BaseVerifyRequest):
    pass


class ReToolVerifyResponse(BaseVerifyResponse):
    correct: bool
    pred: str | None = None
    num_tool_calls: int = 0
    num_turns: int = 0  # the model's turns: what it generated between the tool results


def model_turns(output: Sequence[Any]) -> int:
    """The model's turns in a response's output items: each run of items between tool results (function call
    outputs) is one generation of the model, with its reasoning, text and calls."""
    turns, in_turn = 0, False
    for item in output:
        model_item = item.type != "function_call_output"
        turns += model_item and not in_turn
        in_turn = model_item
    return turns


class ReToolResourcesServer(SimpleResourcesServer):
    """`/execute_python` runs code in the project's sandbox; `/verify` grades the final answer."""

    config: ReToolResourcesServerConfig
    _records: dict[str, list[ToolCallRecord]] = PrivateAttr(default_factory=dict)
    _runner: ToolRunner | None = PrivateAttr(default=None)
    _reward_fn: RewardFn | None = PrivateAttr(default=None)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/execute_python")(self.execute_python)
        return app

    @property
    def tools(self) -> ToolRunner:
        """The episode rules of a call (budget, sandbox, observation text), as `ToolEnvironment`'s."""
        if self._runner is None:
            tokenizer: Tokenizer = qwen_tokenizer() if self.config.tokenizer is None \
                else load_tokenizer(self.config.tokenizer)
            self._runner = ToolRunner(self.config.env_config, tokenizer)
        return self._runner

    @property
    def reward_fn(self) -> RewardFn:
        if self._reward_fn is None:
            config = self.config.env_config
            self._reward_fn = get_reward_fn(config.reward, **config.reward_options)
        return self._reward_fn

    async def seed_session(self, request: Request, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        self._records[request.session[SESSION_ID_KEY]] = []
        return BaseSeedSessionResponse()

    async def execute_python(self, request: Request, body: ExecutePythonRequest) -> ExecutePythonResponse:
        session = request.session[SESSION_ID_KEY]
        records = self._records.setdefault(session, [])
        turn = len(records)  # each call is a turn of its own: the agent posts them one by one
        if self.tools.calls_left(records) <= 0:
            record = self.tools.refused(body.code, turn=turn)
        else:
            record = await self.tools.run(ToolCall(body.code), turn=turn,
                                          session=session if self.tools.config.stateful else None)
        records.append(record)
        return ExecutePythonResponse(output=record.output, status=str(record.status))

    async def verify(self, request: Request, body: ReToolVerifyRequest) -> ReToolVerifyResponse:
        session = request.session[SESSION_ID_KEY]
        text = "\n".join(content.text for item in body.response.output
                         if item.type == "message" and item.role == "assistant"
                         for content in item.content if content.type == "output_text")
        grade = await agrade(text, body.expected_answer)
        records = self._records.pop(session, [])
        stats = EpisodeStats.of_calls(records, num_turns=model_turns(body.response.output), num_tool_rounds=None,
                                      truncated=False, finish_reason="")
        reward = self.reward_fn(grade, stats)
        await self.tools.sandbox.close_session(session)
        return ReToolVerifyResponse(**body.model_dump(), reward=float(reward), correct=grade.correct, pred=grade.pred,
                                    num_tool_calls=stats.num_tool_calls, num_turns=stats.num_turns)
