"""verifiers v1 (what prime-rl runs environments through): a Taskset of the project's problems, graded with the
project's grader and reward scheme, and an in-process harness whose `execute_python` tool runs in the project's
sandbox.

verifiers 0.4.0 ships only `verifiers/v1`: an environment is a `Taskset` (tasks in, `@vf.reward`s out) played by a
`Harness` (the program that talks to the model). Its built-in harnesses run a program in a runtime (the `null` chat
loop is a PEP 723 script that `uv` builds); `ReToolHarness` instead runs its loop in the rollout's own process, as
`Harness.launch` allows, with every model call through verifiers' interception `endpoint`, so verifiers records
each turn in the trace. Each rollout gets its own sandbox session (variables persist between its calls, never
across rollouts) and the harness counts the calls it really ran, which the ReTool reward's shaping reads
(`min(-0.6, -1 + 0.1 * k)` when wrong). Only the model's last reply is graded, never tool
output: code that prints `\\boxed{...}` earns nothing.

The environment's settings are `EnvConfig`'s, set once under the taskset's `env` (`--env.taskset.env.max-tool-calls
8`); each task carries them to the harness, whose calls `ToolRunner` budgets, runs and shows as in `ToolEnvironment`.

verifiers imports a taskset id as a top-level module, so the plugin is `retool_verifiers`, which re-exports this
module (one `Taskset` and one `Harness`: the harness is the taskset's default). The harness runs nothing in
verifiers' runtime, so pick the local one::

    vf-eval retool_verifiers --env.taskset.dataset arith --env.agent.runtime.type subprocess \\
        --model Qwen/Qwen3-4B --client.base-url http://localhost:8000/v1 --num-rollouts 4
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Iterator
from typing import Any

try:
    import verifiers.v1 as vf
    from openai import AsyncOpenAI
    from pydantic import Field, field_validator, model_validator
    from verifiers.v1.runtimes import ProgramResult
    from verifiers.v1.types import content_text
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(f"retool_adapters.verifiers needs verifiers: pip install verifiers (missing {exc.name})",
                              name=exc.name) from exc

from retool_env.config import EnvConfig
from retool_env.data import load_dataset_problems
from retool_env.formats import ToolCall
from retool_env.grading import agrade
from retool_env.offline import qwen_tokenizer
from retool_env.prompts import get_prompt
from retool_env.rewards import EpisodeStats, count_tool_rounds, get_reward_fn
from retool_env.tokens import Tokenizer, load_tokenizer
from retool_env.tool_runner import ToolRunner
from retool_env.trajectory import ToolCallRecord

__all__ = ["EXECUTE_PYTHON_TOOL", "ReToolData", "ReToolHarness", "ReToolHarnessConfig", "ReToolTask",
           "ReToolTaskset", "ReToolTasksetConfig"]

# The chat-completions function tool the harness offers the model.
EXECUTE_PYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "execute_python",
        "description": "Run Python code in a stateful interpreter and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "Python code"}},
                       "required": ["code"], "additionalProperties": False},
    },
}
TOOL_CALLS_KEY = "retool_num_tool_calls"  # trace.info: the calls the sandbox ran, written by the harness only
STATS_KEY = "retool_episode_stats"  # trace.info: the episode's EpisodeStats, written by the harness only
# The adapter's defaults where they differ from EnvConfig's: native tool calling asks for \boxed{} (prompt "plain"),
# the tool promises a stateful interpreter, and a chat round trip waits longer on a call.
ENV_DEFAULTS: dict[str, Any] = {"prompt": "plain", "stateful": True, "tool_timeout": 10.0}
ENV_FIELDS = frozenset(f.name for f in dataclasses.fields(EnvConfig))


def env_config(env: dict[str, Any]) -> EnvConfig:
    """The EnvConfig of a taskset's `env` (EnvConfig's keyword arguments over the adapter's defaults)."""
    return EnvConfig(**{**ENV_DEFAULTS, **env})


class ReToolTasksetConfig(vf.TasksetConfig):
    dataset: str = "arith"  # a name or file `retool_env.data.load_problems` reads
    split: str | None = None
    env: dict[str, Any] = Field(default_factory=dict)  # EnvConfig's keyword arguments: prompt, reward, sandbox, ...

    @model_validator(mode="before")
    @classmethod
    def _move_environment_keys(cls, data: Any) -> Any:
        """Old configs set `prompt` and `reward` beside `env`: moved into it, with a deprecation warning."""
        if not isinstance(data, dict) or not ENV_FIELDS & set(data):
            return data
        moved = {key: data[key] for key in data if key in ENV_FIELDS}
        warnings.warn(f"ReToolTasksetConfig: set {sorted(moved)} under env (--env.taskset.env.<field>)",
                      DeprecationWarning, stacklevel=2)
        rest = {key: value for key, value in data.items() if key not in moved}
        return {**rest, "env": {**moved, **dict(rest.get("env") or {})}}

    @field_validator("env")
    @classmethod
    def _env_is_an_env_config(cls, env: dict[str, Any]) -> dict[str, Any]:
        try:
            env_config(env)
        except TypeError as exc:
            raise ValueError(f"env takes EnvConfig's fields: {exc}") from exc
        if env.get("on_timeout", "feedback") != "feedback":
            raise ValueError("verifiers' harness runs each call as its own tool turn and cannot end an episode at a "
                             "tool timeout; keep on_timeout='feedback'")
        return env


class ReToolData(vf.TaskData):
    answer: str
    env: dict[str, Any] = Field(default_factory=dict)  # the taskset's env, for the harness and the reward


class ReToolTask(vf.Task[ReToolData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def retool(self, trace: vf.Trace) -> float:
        """The scheme's reward for the model's last reply; the tool count is the harness's, not the transcript's."""
        replies = trace.assistant_messages
        text = content_text(replies[-1].content) if replies and replies[-1].content else ""
        grade = await agrade(text, self.data.answer)
        stats = EpisodeStats(**trace.info.get(STATS_KEY, {}))
        trace.info.update(correct=grade.correct, pred=grade.pred)
        config = env_config(self.data.env)
        return float(get_reward_fn(config.reward, **config.reward_options)(grade, stats))


class ReToolTaskset(vf.Taskset[ReToolTask, ReToolTasksetConfig]):
    def load(self) -> Iterator[ReToolTask]:
        template = get_prompt(env_config(self.config.env).prompt or "plain")
        for i, problem in enumerate(load_dataset_problems(self.config.dataset, split=self.config.split)):
            yield ReToolTask(ReToolData(id=problem.id or str(i), prompt=template.user.replace("{problem}",
                                                                                              problem.question),
                                        system_prompt=template.system, answer=problem.answer,
                                        env=self.config.env), self.config.task)


class ReToolHarnessConfig(vf.HarnessConfig):
    max_turns: int = 16
    tokenizer: str | None = None  # what measures max_observation_tokens; default: the offline Qwen tokenizer

    @model_validator(mode="before")
    @classmethod
    def _environment_keys_moved(cls, data: Any) -> Any:
        """The environment's settings moved to the taskset's env: say where, rather than "extra field"."""
        moved = sorted(ENV_FIELDS & set(data)) if isinstance(data, dict) else []
        if moved:
            flags = ", ".join(f"--env.taskset.env.{name.replace('_', '-')}" for name in moved)
            raise ValueError(f"{moved} moved to the taskset's env (EnvConfig's fields): set {flags}")
        return data


class ReToolHarness(vf.Harness[ReToolHarnessConfig]):
    """A chat-completions loop in the rollout's process: each `execute_python` call runs in the rollout's sandbox
    session; the loop ends at the first reply without tool calls (the answer) or at `max_turns`."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = False  # each launch owns its sandbox session; a relaunch would start a fresh one
    EXECUTES_CODE = False  # code runs in the project's sandbox, never in verifiers' runtime
    NEEDS_CONTAINER = False

    def __init__(self, config: ReToolHarnessConfig) -> None:
        super().__init__(config)
        self._runners: dict[str, ToolRunner] = {}
        self._tokenizer: Tokenizer | None = None

    async def launch(self, ctx: vf.ModelContext, trace: vf.Trace, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: vf.TaskData) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [m.model_dump(exclude_none=True) for m in prompt or []]
        tools = self._tool_runner(getattr(data, "env", {}))
        session = f"verifiers-{trace.id}"
        records: list[ToolCallRecord] = []
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            for turn in range(self.config.max_turns):
                # past a verifiers cap (max_turns, tokens) the call fails; verifiers ends the rollout as stopped
                completion = await client.chat.completions.create(model=ctx.model, messages=messages,
                                                                  tools=[EXECUTE_PYTHON_TOOL])
                message = completion.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    break
                for call in message.tool_calls:
                    record = await self._execute(tools, records, session, turn, call.function.name,
                                                 call.function.arguments)
                    records.append(record)
                    stats = EpisodeStats.of_calls(records, num_turns=turn + 1, truncated=False, finish_reason="",
                                                  num_tool_rounds=count_tool_rounds(records))
                    trace.info.update({TOOL_CALLS_KEY: stats.num_tool_calls, STATS_KEY: dataclasses.asdict(stats)})
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": record.output})
        finally:
            await client.close()
            await tools.sandbox.close_session(session)
        return ProgramResult(exit_code=0, stdout="", stderr="")

    def _tool_runner(self, env: dict[str, Any]) -> ToolRunner:
        """The episode rules of the task's env (one runner per distinct env, sharing one tokenizer)."""
        key = json.dumps(env, sort_keys=True, default=str)
        if key not in self._runners:
            if self._tokenizer is None:
                self._tokenizer = qwen_tokenizer() if self.config.tokenizer is None \
                    else load_tokenizer(self.config.tokenizer)
            self._runners[key] = ToolRunner(env_config(env), self._tokenizer)
        return self._runners[key]

    @staticmethod
    async def _execute(tools: ToolRunner, records: list[ToolCallRecord], session: str, turn: int, name: str,
                       arguments: str | None) -> ToolCallRecord:
        """One call as `ToolRunner` runs and shows it: the interpreter's output, or an error the model can act on."""
        if name != "execute_python":
            return await tools.run(ToolCall(None, f"unknown tool {name!r}; the only tool is execute_python."),
                                   turn=turn)
        try:
            code = json.loads(arguments or "{}").get("code")
        except (json.JSONDecodeError, AttributeError):
            code = None
        if not isinstance(code, str):
            return await tools.run(ToolCall(None, 'the arguments must be a JSON object {"code": "<python code>"}.'),
                                   turn=turn)
        if tools.calls_left(records) <= 0:
            return tools.refused(code, turn=turn)
        return await tools.run(ToolCall(code), session=session if tools.config.stateful else None, turn=turn)
