"""`ToolEnvironment.step` without the event loop's round trip (`retool_env.internals.asyncio_loop.run_task`).

A step runs `astep` as a task whose first step is taken at once: a step that awaits nothing still pending (a final
answer, a sandbox that answers at once) ends there, and one that awaits (a real sandbox call) is finished by the loop.
Either way the coroutine runs as asyncio runs a task: `current_task()`, `asyncio.timeout`, context variables, and
callbacks it schedules all behave as under `run_until_complete`. The sandboxes here are small in-process ones, as the
point is how the step drives them (the real sandbox is tested in test_sandbox*.py and test_env.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import json

import pytest

from retool_env import Problem, ToolEnvironment
from retool_env.formats import ParsedAction, ToolCall
from retool_env.internals.asyncio_loop import run_task
from retool_env.sandbox import ExecResult, Sandbox
from retool_env.tokens import encode

PROBLEMS = [Problem("What is 6 * 7?", "42", id="p1")]
VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


class AnsweringSandbox(Sandbox):
    """Answers `print(6 * 7)` with 42 and anything else with a syntax error, `wait` seconds later (0: at once, with
    no await); records what it saw of asyncio while it ran."""

    def __init__(self, wait: float = 0.0, use_timeout: bool = False) -> None:
        self.wait, self.use_timeout, self.seen = wait, use_timeout, []

    async def _run(self, code, *, timeout, session, stdin, memory_mb) -> ExecResult:
        task = asyncio.current_task()
        self.seen.append((task is not None, asyncio.get_running_loop().is_closed()))
        VAR.set("set by the sandbox")
        asyncio.get_running_loop().call_soon(self.seen.append, "callback")
        if self.use_timeout:
            async with asyncio.timeout(5):  # needs a current task, as under run_until_complete
                if self.wait:
                    await asyncio.sleep(self.wait)
        elif self.wait:
            await asyncio.sleep(self.wait)
        if code == "print(6 * 7)":
            return ExecResult(status="ok", stdout="42\n", exit_code=0)
        return ExecResult(status="error", stderr="SyntaxError: invalid syntax", exit_code=1)


def ids(tok, text: str) -> list[int]:
    return encode(tok, text) + [tok.convert_tokens_to_ids("<|im_end|>")]


def call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


@pytest.mark.parametrize("wait", [0.0, 0.01])
@pytest.mark.parametrize("use_timeout", [False, True])
def test_a_step_runs_as_a_task_whether_or_not_it_awaits(qwen_tok, wait, use_timeout):
    sandbox = AnsweringSandbox(wait, use_timeout)
    env = ToolEnvironment(qwen_tok, PROBLEMS, sandbox=sandbox)
    for _ in range(3):
        env.reset(options={"index": 0})
        obs, reward, terminated, truncated, info = env.step(ids(qwen_tok, call("print(6 * 7)")))
        assert info["tool_results"][0]["output"] == "42\n" and not terminated and not truncated
        assert "42" in qwen_tok.decode(obs.tolist())
        obs, reward, terminated, *_ = env.step(ids(qwen_tok, "The answer is \\boxed{42}."))
        assert reward == 1.0 and terminated
    assert [s for s in sandbox.seen if s != "callback"] == [(True, False)] * 3  # always inside a task
    assert VAR.get() == "unset"  # the task's context, not the caller's
    assert sandbox.seen.count("callback") >= 2  # what the sandbox scheduled ran, by the next step at the latest
    env.close()


def test_the_result_matches_run_until_complete(qwen_tok):
    """Two environments, one stepping through `run_task`, one through `run_until_complete`: the same episode."""
    envs = [ToolEnvironment(qwen_tok, PROBLEMS, sandbox=AnsweringSandbox()) for _ in range(2)]
    envs[1]._run_blocking = lambda coro: envs[1]._loop.run_until_complete(coro)  # the code before
    envs[1]._loop = asyncio.new_event_loop()
    actions = [call("print(6 * 7)"), call("print(1 +)"), "Hmm " + call(""), "The answer is \\boxed{42}."]
    runs = []
    for env in envs:
        env.reset(options={"index": 0})
        steps = [env.step(ids(qwen_tok, a)) for a in actions]
        runs.append(([(o.tolist(), r, te, tr, i) for o, r, te, tr, i in steps], env.trajectory.to_dict()))
        env.close()
    assert runs[0] == runs[1]


def test_a_step_that_raises_raises_as_before(qwen_tok):
    class Raising(AnsweringSandbox):
        async def _run(self, code, **kwargs) -> ExecResult:
            raise KeyError("the sandbox's bug")

    env = ToolEnvironment(qwen_tok, PROBLEMS, sandbox=Raising())
    env.reset(options={"index": 0})
    with pytest.raises(KeyError, match="the sandbox's bug"):
        env.step(ids(qwen_tok, call("print(1)")))
    env.close()


def test_inside_a_running_loop_step_refuses_and_astep_works(qwen_tok):
    env = ToolEnvironment(qwen_tok, PROBLEMS, sandbox=AnsweringSandbox())

    async def main():
        env.reset(options={"index": 0})
        with pytest.raises(RuntimeError, match="inside a running event loop"):
            env.step(ids(qwen_tok, "The answer is \\boxed{42}."))
        return await env.astep(ids(qwen_tok, "The answer is \\boxed{42}."))

    assert asyncio.run(main())[1] == 1.0
    env.close()


def testrun_task_leaves_other_work_to_the_loop():
    """With callbacks ready, a timer due, or the loop in debug mode, `run_task` is `run_until_complete`."""
    loop = asyncio.new_event_loop()
    order = []

    async def work():
        order.append("work")
        return 7

    loop.call_soon(order.append, "earlier")
    assert run_task(loop, work()) == 7 and order == ["earlier", "work"]  # in the order the loop runs them
    assert run_task(loop, work()) == 7 and order[-1] == "work"
    loop.call_later(0, order.append, "due")  # a timer that is due runs in the same step, as in the loop
    loop.call_later(3600, order.append, "later")  # one that is not does not hold the step up
    assert run_task(loop, work()) == 7 and order[-2:] == ["work", "due"]
    assert run_task(loop, work()) == 7 and "later" not in order
    loop.set_debug(True)
    assert run_task(loop, work()) == 7
    loop.close()


def test_parsed_action_replace_is_dataclasses_replace():
    parsed = ParsedAction((ToolCall("x"), ToolCall(None, "bad")), closing_ids=(1, 2), complete=False, in_call=True,
                          tool_message={"role": "assistant"})
    for changes in ({}, {"text": "t", "content": "c", "end_text": "e"}, {"closing_ids": (3,)}):
        assert parsed.replace(**changes) == dataclasses.replace(parsed, **changes)
        assert type(parsed.replace(**changes)) is ParsedAction
    with pytest.raises(TypeError):
        parsed.replace(nonsense=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.replace(text="t").text = "u"  # still frozen
