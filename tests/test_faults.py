"""Injected transient faults (`EnvConfig.fault_rate`, `retool_env.faults`): the rate, the seeding, what the model
sees, how the call is counted, and that a refused call never reaches the sandbox. The real environment, the real
local sandbox and `RecordedSandbox` (the project's replay sandbox, whose queue shows which calls reached it)."""

from __future__ import annotations

import asyncio
import re

import pytest

from retool_env.coldstart import RecordedSandbox
from retool_env.data import Problem
from retool_env.env import ToolEnvironment
from retool_env.faults import FAULT_MESSAGE, FaultInjectingSandbox, episode_fault_key
from retool_env.rollout import Generation, SamplingParams, run_episodes
from retool_env.sandbox import LocalSandbox

PROBLEM = Problem(question="What is 6 times 7?", answer="42", id="six-sevens")


def call(code: str) -> str:
    return '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "' + code + '"}}\n</tool_call>'


def step(env, tok, text):
    return env.step(tok.encode(text, add_special_tokens=False) + [env.format.end_token_ids[0]])


def run_all(sandbox, n: int) -> list:
    async def go():
        return [await sandbox.run("print(1)") for _ in range(n)]
    return asyncio.run(go())


def test_the_rate_is_the_share_refused_and_refused_calls_never_reach_the_sandbox():
    inner = RecordedSandbox(["1\n"] * 2000)
    sandbox = FaultInjectingSandbox(inner, 0.3, seed=5)
    results = run_all(sandbox, 2000)
    refused = [r for r in results if r.status == "sandbox_error"]
    assert 0.26 < len(refused) / 2000 < 0.34  # 0.3 +- 4 standard errors
    assert sandbox.injected == len(refused) and all(r.output == FAULT_MESSAGE for r in refused)
    assert len(inner.outputs) == len(refused)  # only the calls that were let through took a recorded output
    assert all(r.status == "ok" and r.output == "1\n" for r in results if r.status != "sandbox_error")
    assert all(r.status == "ok" for r in run_all(FaultInjectingSandbox(RecordedSandbox(["1"] * 50), 0.0), 50))
    assert all(r.status == "sandbox_error" for r in run_all(FaultInjectingSandbox(RecordedSandbox(), 1.0), 50))


def test_a_refused_call_does_not_run_in_the_real_sandbox():
    async def go():
        async with LocalSandbox(timeout=10) as inner:
            refusing = FaultInjectingSandbox(inner, 1.0)
            refused = await refusing.run("total = 40", session="episode-1")
            after = await inner.run("print(total)", session="episode-1")
            await inner.close_session("episode-1")
            passing = await FaultInjectingSandbox(inner, 0.0).run("print(6 * 7)")
            return refused, after, passing

    refused, after, passing = asyncio.run(go())
    assert refused.status == "sandbox_error" and refused.output == FAULT_MESSAGE
    assert after.status == "error" and "NameError" in after.output  # `total = 40` never ran
    assert passing.status == "ok" and passing.output == "42\n"


def test_faults_are_seeded():
    def pattern(seed: int) -> list[str]:
        return [r.status for r in run_all(FaultInjectingSandbox(RecordedSandbox(["1"] * 200), 0.5, seed=seed), 200)]

    assert pattern(1) == pattern(1) and pattern(1) != pattern(2)
    a, b = FaultInjectingSandbox(RecordedSandbox(), 0.5, seed=3), FaultInjectingSandbox(RecordedSandbox(), 0.5, seed=3)
    keys = [episode_fault_key("p", None, [1, 2, i], 0) for i in range(300)]
    assert [a.refuses(k) for k in keys] == [b.refuses(k) for k in keys]  # a keyed call: a function of seed and key
    assert 100 < sum(a.refuses(k) for k in keys) < 200
    assert episode_fault_key("p", None, [1, 2], 0) != episode_fault_key("p", None, [1, 2], 1)  # the call's place
    assert episode_fault_key("p", None, [1, 2], 0) != episode_fault_key("p", 7, [1, 2], 0)  # the episode's seed
    assert episode_fault_key("p", None, [1, 2], 0) != episode_fault_key("q", None, [1, 2], 0)  # the problem


def test_a_bad_rate_is_refused(tiny_tok):
    for bad in (-0.1, 1.5, float("nan"), True, "0.2"):
        with pytest.raises(ValueError, match="fault_rate"):
            FaultInjectingSandbox(RecordedSandbox(), bad)
    with pytest.raises(ValueError, match="fault_rate"):
        ToolEnvironment(tiny_tok, [PROBLEM], fault_rate=2.0)
    with pytest.raises(ValueError, match="stateful"):
        ToolEnvironment(tiny_tok, [PROBLEM], fault_rate=0.1, stateful=True)
    env = ToolEnvironment(tiny_tok, [PROBLEM])
    assert not isinstance(env.sandbox, FaultInjectingSandbox)  # off by default: the sandbox itself
    env.close()


def test_the_model_sees_a_retryable_refusal_counted_as_a_failed_call(tiny_tok):
    env = ToolEnvironment(tiny_tok, [PROBLEM], fault_rate=1.0)
    env.reset(options={"problem": PROBLEM})
    obs, _, terminated, truncated, info = step(env, tiny_tok, call("print(6 * 7)"))
    assert not terminated and not truncated
    assert "refused this call before it ran" in tiny_tok.decode(obs) and "retry the call" in tiny_tok.decode(obs)
    assert info["tool_results"][0]["status"] == "sandbox_error"
    _, reward, terminated, _, _ = step(env, tiny_tok, "\\boxed{41}")
    stats = env.trajectory.tool_stats()
    assert terminated and stats.executed == 1 and stats.failed == 1 and env.episode_stats().num_tool_errors == 1
    assert reward == pytest.approx(-0.9)  # `retool`: wrong after one executed call
    env.close()
    env = ToolEnvironment(tiny_tok, [PROBLEM], fault_rate=1.0, max_tool_calls=1)  # a refused call uses the budget
    env.reset(options={"problem": PROBLEM})
    step(env, tiny_tok, call("print(6 * 7)"))
    _, _, _, truncated, _ = step(env, tiny_tok, call("print(6 * 7)"))
    assert truncated and env.trajectory.finish_reason == "max_tool_calls"
    env.close()


def test_the_environment_draws_faults_per_episode_reproducibly(tiny_tok):
    def first_status(env, seed=None, problem=PROBLEM, code="print(6 * 7)") -> str:
        env.reset(seed=seed, options={"problem": problem})
        _, _, _, _, info = step(env, tiny_tok, call(code))
        return info["tool_results"][0]["status"]

    problems = [Problem(f"What is {i} + 1?", str(i + 1), id=f"p{i}") for i in range(300)]
    envs = [ToolEnvironment(tiny_tok, problems, fault_rate=0.25, fault_seed=9, sandbox=RecordedSandbox(["1"] * 900))
            for _ in range(2)]
    statuses = [[first_status(env, problem=p) for p in problems] for env in envs]
    assert statuses[0] == statuses[1]  # the same episodes, the same faults, in another environment
    assert 45 < statuses[0].count("sandbox_error") < 105  # 75 expected of 300
    by_seed = [first_status(envs[0], seed=s) for s in range(200)]  # one episode text, seeded resets
    assert 25 < by_seed.count("sandbox_error") < 80  # 50 expected of 200
    other = ToolEnvironment(tiny_tok, problems, fault_rate=0.25, fault_seed=10, sandbox=RecordedSandbox(["1"] * 300))
    assert [first_status(other, problem=p) for p in problems] != statuses[0]
    for env in (*envs, other):
        env.close()


class Retrier:
    """A scripted policy: calls the interpreter, calls again while the sandbox refuses, then boxes what it printed."""

    def __init__(self, tok):
        self.tok = tok

    async def generate(self, prompt_ids, *, max_tokens, stop_token_ids=(), stop=(), sampling=None):
        results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", self.tok.decode(prompt_ids), re.DOTALL)
        if results and "refused" not in results[-1]:
            reply = f"\\boxed{{{results[-1].strip()}}}<|im_end|>"
        else:
            reply = call("print(6 * 7)") + "<|im_end|>"
        ids = self.tok.encode(reply, add_special_tokens=False)
        return Generation(ids, None, "stop")


def test_seeded_rollouts_draw_each_episode_apart_and_reproducibly(tiny_tok):
    """Episodes that write the same text still draw their own faults: `run_episode` resets with the episode's seed."""
    def play() -> list:
        make_env = lambda: ToolEnvironment(tiny_tok, [PROBLEM], fault_rate=0.3, max_tool_calls=3,  # noqa: E731
                                           sandbox=RecordedSandbox(["42\n"] * 400))
        return asyncio.run(run_episodes([PROBLEM], make_env, Retrier(tiny_tok), n_per_problem=200, concurrency=1,
                                        sampling=SamplingParams(seed=11), progress=False))

    first, again = play(), play()
    statuses = [[c.status for c in t.tool_calls] for t in first]
    assert statuses == [[c.status for c in t.tool_calls] for t in again]
    refused_first = sum(s[0] == "sandbox_error" for s in statuses)
    assert 30 < refused_first < 90  # 60 expected of 200: not all or none, as one text keyed alone would give
    recovered = [t for t, s in zip(first, statuses, strict=True) if s[0] == "sandbox_error" and t.correct]
    assert recovered and all(t.reward == pytest.approx(1.0) for t in recovered)  # `retool`: correct is +1
