"""Rollout driver: runs episodes of the environment against a generation backend.

The environment never generates. A `Generator` turns prompt token ids into the policy's next action; the driver
below runs many episodes concurrently, each continuing as soon as its own tool call returns (no batch lockstep).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from tqdm.auto import tqdm

from retool_env.data import Problem
from retool_env.trajectory import ToolStatus, Trajectory


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings every backend understands (vLLM conventions: top_k=-1 means off)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    """One turn of generated tokens, exactly as the backend produced them.

    `logprobs` has one float per token (the sampled token's log-probability) or is None when the backend cannot give
    them; a trainer that needs them must abort the episode rather than invent values. When a stop string or stop
    token ended the turn, its tokens are included (vLLM's `include_stop_str_in_output=True`).
    """

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str  # "stop" (EOS, stop token or stop string), "length" (max_tokens), or "abort"
    policy_version: int | None = None  # the weights that wrote the tokens, where the backend knows (async training)

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"{len(self.logprobs)} logprobs for {len(self.token_ids)} tokens")


@runtime_checkable
class Generator(Protocol):
    """A generation backend: Hugging Face `generate`, a vLLM engine, an OpenAI-compatible server, TRL's client."""

    async def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        stop_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        sampling: SamplingParams = SamplingParams(),
    ) -> Generation: ...


class EpisodeAborted(RuntimeError):
    """An episode that cannot yield honest training data (generator failure, missing logprobs, timeout)."""


async def run_episode(
    env: Any,
    generator: Generator,
    *,
    problem: Problem | None = None,
    sampling: SamplingParams = SamplingParams(),
    require_logprobs: bool = False,
    partial_rollout: bool = True,
    options: Mapping[str, Any] | None = None,
) -> Trajectory:
    """Play one episode: generate a turn, step the environment, repeat until it ends.

    `options` go to `env.reset` with the problem (per-episode settings, e.g. `max_completion_tokens`).

    The next prompt is always `prompt_ids + completion_ids` of the trajectory, the exact tokens the model produced
    and the environment appended: nothing is decoded and re-tokenized between turns. Each turn keeps the generator's
    `policy_version`; an episode that a weight update crosses is finished on the new policy (`partial_rollout`), or
    aborted, so that it is dropped.

    A seeded `sampling` seeds each turn apart (`turn_seed`): engines seed a fresh generator per request, so one seed
    for every turn would replay turn 1's random draws in each later turn, which then are no samples of the policy.
    """
    env = getattr(env, "unwrapped", env)
    options = {**(options or {}), **({"problem": problem} if problem is not None else {})}
    # the episode's own seed: it keys its injected faults (EnvConfig.fault_rate)
    _, info = env.reset(seed=sampling.seed, options=options or None)
    traj = env.trajectory
    while True:
        turn = len(traj.turns)
        generation = await generator.generate(
            traj.prompt_ids + traj.completion_ids,
            max_tokens=info["max_new_tokens"],
            stop_token_ids=info["stop_token_ids"],
            stop=info["stop"],
            sampling=sampling if sampling.seed is None else
            dataclasses.replace(sampling, seed=turn_seed(sampling.seed, turn)),
        )
        if generation.finish_reason == "abort":
            raise EpisodeAborted("the generator aborted the request")
        if require_logprobs and generation.logprobs is None:
            raise EpisodeAborted("the generator returned no logprobs")
        versions = {turn.policy_version for turn in traj.turns} | {generation.policy_version}
        known = {v for v in versions if v is not None}
        if not partial_rollout and len(known) > 1:
            raise EpisodeAborted(f"the policy changed mid-episode (versions {sorted(known)}) and "
                                 f"partial_rollout is off")
        action = {"token_ids": generation.token_ids, "logprobs": generation.logprobs,
                  "finish_reason": generation.finish_reason}
        _, _, terminated, truncated, info = await env.astep(action)
        traj.turns[turn].policy_version = generation.policy_version
        if getattr(getattr(env, "config", None), "stateful", False) and any(
                r["status"] == ToolStatus.SANDBOX_ERROR for r in info["tool_results"]):
            # The executor failed mid-episode: the session's variables may be gone, so later cells would run on a
            # state the model never built. Such an episode is not honest training data.
            raise EpisodeAborted("the sandbox failed in a stateful episode (its session state is lost)")
        if terminated or truncated:
            return traj


def sandbox_postfix(env: Any) -> dict[str, Any]:
    """Queue depth and latency for the progress bar, from a sandbox that keeps them (`RaySandbox.stats()`)."""
    stats = getattr(getattr(getattr(env, "unwrapped", env), "sandbox", None), "stats", None)
    if stats is None:
        return {}
    s = stats()
    return {"in_flight": s["in_flight"], "queued": s["queued"], "p99": f"{s['p99'] or 0:.2f}s"}


def aborted_trajectory(problem: Problem, reason: str, prompt_ids: Sequence[int] = ()) -> Trajectory:
    """A placeholder for a failed episode: its prompt if it got that far, no completion, no reward, and why."""
    return Trajectory(prompt_ids=list(prompt_ids), problem_id=problem.id, gold=problem.answer, has_logprobs=False,
                      finish_reason=f"aborted: {reason}")


class _Lines:
    """A stream that turns tqdm's in-place updates (carriage returns) into lines: fit for log files and pipes."""

    def __init__(self, stream: Any):
        self.stream, self.last = stream, ""

    def write(self, text: str) -> None:
        text = text.replace("\r", "").strip()
        if text and text != self.last:
            self.stream.write(text + "\n")
            self.last = text

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(total: int, desc: str, *, enabled: bool = True) -> tqdm:
    """A bar that updates in place on a terminal; elsewhere (a log file, a pipe) a short line every 30 s."""
    if not enabled or sys.stderr.isatty():
        return tqdm(total=total, desc=desc, disable=not enabled, dynamic_ncols=True)
    return tqdm(total=total, desc=desc, file=_Lines(sys.stderr), mininterval=30, ncols=100, ascii=True)


def derive_seed(*parts: int | str) -> int:
    """A seed that is a stable function of `parts` (a run's seed, a process, a step, ...): unrelated for distinct
    parts, and below 2**62, so that episode i of a batch may sample under seed + i."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 2


def turn_seed(episode_seed: int, turn: int) -> int:
    """The sampling seed of turn `turn` (0-based) of an episode seeded `episode_seed`: the episode's own seed for the
    first turn (so single-turn results keep their seeds), an unrelated seed derived from both for every later one."""
    return episode_seed if turn == 0 else derive_seed(episode_seed, "turn", turn)


async def run_episodes(
    problems: Sequence[Problem],
    make_env: Callable[[], Any],
    generator: Generator,
    *,
    n_per_problem: int = 1,
    concurrency: int = 64,
    sampling: SamplingParams = SamplingParams(),
    episode_timeout: float | None = None,
    require_logprobs: bool = False,
    partial_rollout: bool = True,
    progress: bool = True,
) -> list[Trajectory]:
    """Run `n_per_problem` episodes of every problem, `concurrency` at a time, without batch lockstep.

    Each worker owns one environment and starts its next episode as soon as its last one ends, so a slow tool
    call holds back only its own episode. Results come back in order (problem-major, as GRPO groups them). An
    episode that fails is returned as an aborted trajectory (`finish_reason` starts with "aborted") and never
    stops the batch; trainers must drop or mask aborted episodes, never train on them.
    """
    jobs = [(i * n_per_problem + j, problem, j) for i, problem in enumerate(problems) for j in range(n_per_problem)]
    results: list[Trajectory | None] = [None] * len(jobs)
    queue: asyncio.Queue = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    bar = progress_bar(len(jobs), "episodes", enabled=progress)
    stats = {"correct": 0, "done": 0, "aborted": 0}

    async def worker() -> None:
        env = make_env()
        try:
            while not queue.empty():
                index, problem, sample = queue.get_nowait()
                episode_sampling = (sampling if sampling.seed is None else
                                    dataclasses.replace(sampling, seed=sampling.seed + index))
                try:
                    episode = run_episode(env, generator, problem=problem, sampling=episode_sampling,
                                          require_logprobs=require_logprobs, partial_rollout=partial_rollout)
                    traj = await asyncio.wait_for(episode, episode_timeout)
                    results[index] = traj
                    stats["correct"] += bool(traj.correct)
                except Exception as exc:  # one bad episode never kills the batch
                    reason = (f"timeout after {episode_timeout} s" if isinstance(exc, asyncio.TimeoutError)
                              else repr(exc))
                    started = getattr(env, "unwrapped", env)
                    prompt_ids = started.trajectory.prompt_ids if started.problem is problem else ()
                    results[index] = aborted_trajectory(problem, reason, prompt_ids)
                    stats["aborted"] += 1
                stats["done"] += 1
                bar.update(1)
                bar.set_postfix(acc=f"{stats['correct'] / stats['done']:.2f}", aborted=stats["aborted"], refresh=False,
                                **(sandbox_postfix(env) if progress else {}))
        finally:
            env.close()

    try:
        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(jobs))))))
    finally:
        bar.close()
    return [traj for traj in results if traj is not None]
