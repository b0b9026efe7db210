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

verifiers imports a taskset id as a top-level module, so the plugin is `retool_verifiers`, which re-exports this
module (one `Taskset` and one `Harness`: the harness is the taskset's default). The harness runs nothing in
verifiers' runtime, so pick the local one::

    vf-eval retool_verifiers --env.taskset.dataset arith --env.agent.runtime.type subprocess \\
        --model Qwen/Qwen3-4B --client.base-url http://localhost:8000/v1 --num-rollouts 4
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

try:
    import verifiers.v1 as vf
    from openai import AsyncOpenAI
    from verifiers.v1.runtimes import ProgramResult
    from verifiers.v1.types import content_text
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(f"retool_adapters.verifiers needs verifiers: pip install verifiers (missing {exc.name})",
                              name=exc.name) from exc

from retool_env.data import load_dataset_problems
from retool_env.grading import agrade
from retool_env.prompts import get_prompt
from retool_env.rewards import EpisodeStats, get_reward_fn
from retool_env.tool_runner import EMPTY_OUTPUT, shared_sandbox

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


class ReToolTasksetConfig(vf.TasksetConfig):
    dataset: str = "arith"  # a name or file `retool_env.data.load_problems` reads
    split: str | None = None
    prompt: str = "plain"  # a retool_env.prompts name; "plain" asks for \boxed{} with native tool calling
    reward: str = "retool"  # a retool_env.rewards scheme


class ReToolData(vf.TaskData):
    answer: str
    reward_scheme: str = "retool"


class ReToolTask(vf.Task[ReToolData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def retool(self, trace: vf.Trace) -> float:
        """The scheme's reward for the model's last reply; the tool count is the harness's, not the transcript's."""
        replies = trace.assistant_messages
        text = content_text(replies[-1].content) if replies and replies[-1].content else ""
        grade = await agrade(text, self.data.answer)
        calls = int(trace.info.get(TOOL_CALLS_KEY, 0))
        trace.info.update(correct=grade.correct, pred=grade.pred)
        return float(get_reward_fn(self.data.reward_scheme)(grade, EpisodeStats(num_tool_calls=calls)))


class ReToolTaskset(vf.Taskset[ReToolTask, ReToolTasksetConfig]):
    def load(self) -> Iterator[ReToolTask]:
        template = get_prompt(self.config.prompt)
        for i, problem in enumerate(load_dataset_problems(self.config.dataset, split=self.config.split)):
            yield ReToolTask(ReToolData(id=problem.id or str(i), prompt=template.user.replace("{problem}",
                                                                                              problem.question),
                                        system_prompt=template.system, answer=problem.answer,
                                        reward_scheme=self.config.reward), self.config.task)


class ReToolHarnessConfig(vf.HarnessConfig):
    sandbox: str = "local"  # "local", "ray" or a SandboxFusion URL, as ToolEnvironment's
    tool_timeout: float = 10.0
    max_tool_calls: int = 8
    max_turns: int = 16
    max_output_chars: int = 4000


class ReToolHarness(vf.Harness[ReToolHarnessConfig]):
    """A chat-completions loop in the rollout's process: each `execute_python` call runs in the rollout's sandbox
    session; the loop ends at the first reply without tool calls (the answer) or at `max_turns`."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = False  # each launch owns its sandbox session; a relaunch would start a fresh one
    EXECUTES_CODE = False  # code runs in the project's sandbox, never in verifiers' runtime
    NEEDS_CONTAINER = False

    async def launch(self, ctx: vf.ModelContext, trace: vf.Trace, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: vf.TaskData) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [m.model_dump(exclude_none=True) for m in prompt or []]
        sandbox, session = shared_sandbox(self.config.sandbox), f"verifiers-{trace.id}"
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            for _ in range(self.config.max_turns):
                # past a verifiers cap (max_turns, tokens) the call fails; verifiers ends the rollout as stopped
                completion = await client.chat.completions.create(model=ctx.model, messages=messages,
                                                                  tools=[EXECUTE_PYTHON_TOOL])
                message = completion.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    break
                for call in message.tool_calls:
                    output = await self._execute(sandbox, session, trace, call.function.name,
                                                 call.function.arguments)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
        finally:
            await client.close()
            await sandbox.close_session(session)
        return ProgramResult(exit_code=0, stdout="", stderr="")

    async def _execute(self, sandbox: Any, session: str, trace: vf.Trace, name: str, arguments: str | None) -> str:
        """The tool message for one call: the interpreter's output, or an error the model can act on."""
        if name != "execute_python":
            return f"Error: unknown tool {name!r}; the only tool is execute_python."
        try:
            code = json.loads(arguments or "{}").get("code")
        except (json.JSONDecodeError, AttributeError):
            code = None
        if not isinstance(code, str):
            return 'Error: the arguments must be a JSON object {"code": "<python code>"}.'
        calls = int(trace.info.get(TOOL_CALLS_KEY, 0))
        if calls >= self.config.max_tool_calls:
            return f"Error: the limit of {self.config.max_tool_calls} tool calls is reached; give the final answer."
        result = await sandbox.run(code, timeout=self.config.tool_timeout, session=session)
        trace.info[TOOL_CALLS_KEY] = calls + 1
        output = result.output or EMPTY_OUTPUT
        if len(output) > self.config.max_output_chars:
            half = self.config.max_output_chars // 2
            output = f"{output[:half]}\n... [{len(output) - 2 * half} characters omitted] ...\n{output[-half:]}"
        return output
