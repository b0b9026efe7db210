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
`tools`, `EXECUTE_PYTHON_TOOL` below).
"""

from __future__ import annotations

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
    from pydantic import AliasChoices, BaseModel, Field, PrivateAttr
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(f"retool_adapters.nemo_gym needs NeMo-Gym: pip install nemo-gym (missing {exc.name})",
                              name=exc.name) from exc

from retool_env.grading import agrade
from retool_env.rewards import EpisodeStats, get_reward_fn
from retool_env.sandbox.base import ToolStatus
from retool_env.tool_runner import EMPTY_OUTPUT, shared_sandbox

__all__ = ["EXECUTE_PYTHON_TOOL", "ExecutePythonRequest", "ExecutePythonResponse", "ReToolResourcesServer",
           "ReToolResourcesServerConfig", "ReToolVerifyRequest", "ReToolVerifyResponse"]

# The Responses API function tool the agent offers the model (put it in responses_create_params.tools).
EXECUTE_PYTHON_TOOL: dict[str, Any] = {
    "type": "function", "name": "execute_python", "strict": True,
    "description": "Run Python code in a stateful interpreter and return what it prints.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "Python code"}},
                   "required": ["code"], "additionalProperties": False},
}


class ReToolResourcesServerConfig(BaseResourcesServerConfig):
    sandbox: str = "local"  # "local", "ray" or a SandboxFusion URL, as ToolEnvironment's
    tool_timeout: float = 10.0
    max_tool_calls: int = 8
    reward: str = "retool"
    max_output_chars: int = 4000


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


class ReToolResourcesServer(SimpleResourcesServer):
    """`/execute_python` runs code in the project's sandbox; `/verify` grades the final answer."""

    config: ReToolResourcesServerConfig
    _calls: dict[str, int] = PrivateAttr(default_factory=dict)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/execute_python")(self.execute_python)
        return app

    @property
    def sandbox(self) -> Any:
        return shared_sandbox(self.config.sandbox)

    async def seed_session(self, request: Request, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        self._calls[request.session[SESSION_ID_KEY]] = 0
        return BaseSeedSessionResponse()

    async def execute_python(self, request: Request, body: ExecutePythonRequest) -> ExecutePythonResponse:
        session = request.session[SESSION_ID_KEY]
        calls = self._calls.get(session, 0)
        if calls >= self.config.max_tool_calls:
            return ExecutePythonResponse(output=f"Error: the limit of {self.config.max_tool_calls} tool calls is "
                                                "reached; give the final answer.", status=ToolStatus.INVALID.value)
        result = await self.sandbox.run(body.code, timeout=self.config.tool_timeout, session=session)
        self._calls[session] = calls + 1
        output = result.output or EMPTY_OUTPUT
        if len(output) > self.config.max_output_chars:
            half = self.config.max_output_chars // 2
            output = f"{output[:half]}\n... [{len(output) - 2 * half} characters omitted] ...\n{output[-half:]}"
        return ExecutePythonResponse(output=output, status=str(result.status))

    async def verify(self, request: Request, body: ReToolVerifyRequest) -> ReToolVerifyResponse:
        session = request.session[SESSION_ID_KEY]
        text = "\n".join(content.text for item in body.response.output
                         if item.type == "message" and item.role == "assistant"
                         for content in item.content if content.type == "output_text")
        grade = await agrade(text, body.expected_answer)
        calls = self._calls.pop(session, 0)
        reward = get_reward_fn(self.config.reward)(grade, EpisodeStats(num_tool_calls=calls))
        await self.sandbox.close_session(session)
        return ReToolVerifyResponse(**body.model_dump(), reward=float(reward), correct=grade.correct, pred=grade.pred,
                                    num_tool_calls=calls)
