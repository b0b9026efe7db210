"""The rollout driver with scripted generators: concurrency without lockstep, failure isolation, abort paths."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest

from retool_env import Problem, ToolEnvironment
from retool_env.rollout import Generation, SamplingParams, run_episode, run_episodes, turn_seed
from retool_env.sandbox import ExecResult, LocalSandbox


class Solver:
    """A scripted policy: computes the product with the interpreter, then boxes what the interpreter printed.

    `slow` problems sleep in the sandbox first; `fail` problems make the generator raise.
    """

    def __init__(self, tok, slow=(), fail=(), logprobs=True, delay=0.0):
        self.tok, self.slow, self.fail, self.logprobs, self.delay = tok, set(slow), set(fail), logprobs, delay
        self.finished_at: dict[str, float] = {}
        self.calls = 0

    async def generate(self, prompt_ids, *, max_tokens, stop_token_ids=(), stop=(), sampling=None):
        self.calls += 1
        await asyncio.sleep(self.delay)
        text = self.tok.decode(prompt_ids)
        a, b = re.findall(r"What is (\d+) \* (\d+)\?", text)[-1]
        if a in self.fail:
            raise RuntimeError(f"generator failed on {a}")
        results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.DOTALL)
        if results:
            self.finished_at[a] = time.monotonic()
            reply = f"The product is \\boxed{{{results[-1].strip()}}}.<|im_end|>"
        else:
            sleep = "import time; time.sleep(1.5)\n" if a in self.slow else ""
            code = f"{sleep}print({a} * {b})"
            reply = "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}})
            reply += "\n</tool_call><|im_end|>"
        ids = self.tok.encode(reply, add_special_tokens=False)
        return Generation(ids, [-0.25] * len(ids) if self.logprobs else None, "stop")


PROBLEMS = [Problem(f"What is {a} * {b}?", str(a * b), id=f"p{a}") for a, b in
            [(12, 34), (56, 78), (91, 23), (45, 67), (89, 10), (11, 12)]]


def factory(tok, **kw):
    return lambda: ToolEnvironment(tok, PROBLEMS, tool_timeout=5.0, **kw)


def test_run_episode_plays_to_the_end(tiny_tok):
    traj = asyncio.run(run_episode(factory(tiny_tok)(), Solver(tiny_tok), problem=PROBLEMS[0]))
    assert traj.correct and traj.reward == 1.0 and traj.num_tool_calls == 1 and traj.num_turns == 2
    assert traj.logprobs.count(-0.25) == traj.num_model_tokens


def test_run_episodes_in_order_and_grouped(tiny_tok):
    trajs = asyncio.run(run_episodes(PROBLEMS, factory(tiny_tok), Solver(tiny_tok), n_per_problem=2,
                                     concurrency=4, progress=False))
    assert [t.problem_id for t in trajs] == [p.id for p in PROBLEMS for _ in range(2)]
    assert all(t.correct and t.reward == 1.0 and not t.aborted for t in trajs)


class GatedSandbox(LocalSandbox):
    """Holds the slow problem's tool call until every other episode has finished (30 s at most).

    Under batch lockstep the other episodes could not finish while a tool call of their round is pending, so the
    gate would never open and the slow episode would come back aborted by its timeout.
    """

    def __init__(self, others_done, **kwargs):
        super().__init__(**kwargs)
        self.others_done = others_done

    async def run(self, code, **kwargs):
        if "12 * 34" in code:
            await asyncio.wait_for(self.others_done(), 30)
        return await super().run(code, **kwargs)


def test_no_lockstep_a_slow_tool_call_holds_back_only_its_episode(tiny_tok):
    solver = Solver(tiny_tok)

    async def others_done():
        while len(solver.finished_at) < len(PROBLEMS) - 1:
            await asyncio.sleep(0.01)

    sandbox = GatedSandbox(others_done)
    try:
        trajs = asyncio.run(run_episodes(PROBLEMS, lambda: ToolEnvironment(tiny_tok, PROBLEMS, sandbox=sandbox),
                                         solver, concurrency=len(PROBLEMS), episode_timeout=60, progress=False))
    finally:
        sandbox.close()
    assert all(t.correct and not t.aborted for t in trajs)
    assert max(solver.finished_at, key=solver.finished_at.get) == "12"  # the held episode finished last


def test_a_failing_episode_is_aborted_not_fatal(tiny_tok):
    trajs = asyncio.run(run_episodes(PROBLEMS, factory(tiny_tok), Solver(tiny_tok, fail={"56"}), concurrency=3,
                                     progress=False))
    aborted = [t for t in trajs if t.aborted]
    assert [t.problem_id for t in aborted] == ["p56"] and "generator failed" in aborted[0].finish_reason
    assert aborted[0].reward is None and aborted[0].completion_ids == []
    assert tiny_tok.decode(aborted[0].prompt_ids).count("What is 56 * 78?") == 1  # the prompt it failed on
    assert sum(bool(t.correct) for t in trajs) == len(PROBLEMS) - 1


def test_missing_logprobs_abort_when_required(tiny_tok):
    solver = Solver(tiny_tok, logprobs=False)
    trajs = asyncio.run(run_episodes(PROBLEMS[:2], factory(tiny_tok), solver, require_logprobs=True,
                                     progress=False))
    assert all(t.aborted and "logprobs" in t.finish_reason for t in trajs)
    kept = asyncio.run(run_episodes(PROBLEMS[:2], factory(tiny_tok), solver, progress=False))
    assert all(t.correct and not t.has_logprobs for t in kept)


def test_episode_timeout_aborts(tiny_tok):
    trajs = asyncio.run(run_episodes(PROBLEMS[:2], factory(tiny_tok), Solver(tiny_tok, slow={"12"}),
                                     episode_timeout=0.8, progress=False))
    assert trajs[0].aborted and "timeout" in trajs[0].finish_reason
    assert trajs[1].correct


def test_cancellation_propagates_and_the_sandbox_keeps_serving(tiny_tok):
    async def cancel_midway():
        task = asyncio.create_task(run_episodes(PROBLEMS, factory(tiny_tok), Solver(tiny_tok, slow={"12"}),
                                                progress=False))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    traj = asyncio.run(run_episode(factory(tiny_tok)(), Solver(tiny_tok), problem=PROBLEMS[1]))
    assert traj.correct


class FailingSandbox(LocalSandbox):
    """The executor fails on every call (a lost server or node), as `sandbox_error`."""

    async def run(self, code, **kwargs):
        return ExecResult.failure("sandbox_error", "SandboxError: the node went away")


def test_a_sandbox_error_aborts_a_stateful_episode_only(tiny_tok):
    sandbox = FailingSandbox()
    make = lambda stateful: lambda: ToolEnvironment(tiny_tok, PROBLEMS, sandbox=sandbox, stateful=stateful)  # noqa: E731
    stateful = asyncio.run(run_episodes(PROBLEMS[:2], make(True), Solver(tiny_tok), progress=False))
    assert all(t.aborted and "session state is lost" in t.finish_reason for t in stateful)
    stateless = asyncio.run(run_episodes(PROBLEMS[:2], make(False), Solver(tiny_tok), progress=False))
    assert not any(t.aborted for t in stateless)  # the model saw the error; no state was at stake


class SeedRecorder(Solver):
    """The scripted solver, recording the sampling seed each of its requests carried, by problem and turn."""

    def __init__(self, tok):
        super().__init__(tok)
        self.seeds: dict[str, list[int | None]] = {}

    async def generate(self, prompt_ids, *, sampling=None, **kwargs):
        a = re.findall(r"What is (\d+) \*", self.tok.decode(prompt_ids))[-1]
        self.seeds.setdefault(a, []).append(sampling.seed)
        return await super().generate(prompt_ids, sampling=sampling, **kwargs)


def test_each_turn_samples_under_its_own_seed_derived_from_the_episodes(tiny_tok):
    """Engines seed a fresh generator per request: one seed for every turn would replay turn 1's draws."""
    runs = []
    for _ in range(2):
        recorder = SeedRecorder(tiny_tok)
        asyncio.run(run_episodes(PROBLEMS[:3], factory(tiny_tok), recorder, concurrency=3, progress=False,
                                 sampling=SamplingParams(seed=100)))
        runs.append(recorder.seeds)
    seeds = runs[0]
    assert runs[0] == runs[1]  # deterministic: a rerun sends the same seed for every turn
    assert [seeds[a][0] for a in ("12", "56", "91")] == [100, 101, 102]  # turn 0: the episode's seed
    assert all(len(s) == 2 and s[1] == turn_seed(s[0], 1) for s in seeds.values())
    every = [seed for s in seeds.values() for seed in s]
    assert len(set(every)) == len(every)  # no seed reused by another turn or another episode
    assert turn_seed(100, 1) != turn_seed(100, 2) and turn_seed(100, 1) != turn_seed(101, 1)
    assert all(0 <= turn_seed(2**62 - 1, k) < 2**63 for k in range(4))


def test_unseeded_sampling_sends_no_seed(tiny_tok):
    recorder = SeedRecorder(tiny_tok)
    asyncio.run(run_episodes(PROBLEMS[:1], factory(tiny_tok), recorder, progress=False))
    assert recorder.seeds == {"12": [None, None]}


class SlowToCloseSandbox(LocalSandbox):
    """The real sandbox, slow to close a session, so that an episode's timeout falls inside `close_session`."""

    async def close_session(self, session):
        await asyncio.sleep(0.5)
        await super().close_session(session)


def test_an_episode_cancelled_while_closing_its_session_leaks_no_session(tiny_tok):
    sandbox = SlowToCloseSandbox()

    async def main():
        trajs = await run_episodes(PROBLEMS[:2], lambda: ToolEnvironment(tiny_tok, PROBLEMS, sandbox=sandbox,
                                                                          stateful=True),
                                   Solver(tiny_tok), episode_timeout=120.0, progress=False)
        opened = (await sandbox.info())["sessions"]
        # Now a timeout inside the close: the episode is aborted, its session still closed.
        env = ToolEnvironment(tiny_tok, PROBLEMS, sandbox=sandbox, stateful=True)
        with pytest.raises(asyncio.TimeoutError):
            started = time.monotonic()
            task = asyncio.ensure_future(run_episode(env, Solver(tiny_tok), problem=PROBLEMS[0]))
            while (await sandbox.info())["sessions"] == opened and time.monotonic() - started < 30:
                await asyncio.sleep(0.05)  # the episode's session exists once its tool call runs
            while not env.trajectory.turns or env.trajectory.reward is None:
                await asyncio.sleep(0.01)  # graded: the close has begun
            await asyncio.wait_for(task, 0.1)
        await asyncio.sleep(1.0)
        return trajs, opened, (await sandbox.info())["sessions"]

    try:
        trajs, opened, after = asyncio.run(main())
    finally:
        sandbox.close()
    assert all(t.correct for t in trajs) and opened == 0 and after == 0
