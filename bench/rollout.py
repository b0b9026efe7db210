"""Episodes per second: the async rollout driver versus batch-lockstep rounds, side by side in one run.

The generator is simulated (a per-token latency model with realistic turn lengths); tool calls run for real in the
local sandbox, with long-tailed latencies (most calls take milliseconds, a few sleep up to seconds, as real
model-written code does). Lockstep is how TRL's built-in tool loop runs a batch: every episode generates, then
every episode's tool call runs, and each round waits for its slowest member. The async driver lets each episode
continue as soon as its own tool call returns.

    python bench/rollout.py [--episodes 256 --concurrency 64]   # driver vs lockstep
    python bench/rollout.py --hf --episodes 64 --concurrency 16  # the same with a real HF generator, tiny model
    python bench/rollout.py --soak 10000                         # memory, open files, processes over a long run
    python bench/rollout.py --training                           # GRPO samples/s: async worker vs synchronous

`--training` adds a simulated trainer step: the synchronous `rollout_func` path plays a batch, then trains; the
asynchronous path (`ReToolRolloutWorker`, as AsyncGRPOTrainer drives it) generates while the trainer trains, bumping
the policy version after each step and dropping samples more than `max_staleness` versions old.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import resource
import time
from pathlib import Path

from retool_env import Problem, ToolEnvironment
from retool_env.offline import tiny_tokenizer
from retool_env.rollout import Generation, SamplingParams, run_episodes
from retool_env.sandbox import LocalSandbox


class SimulatedGenerator:
    """Latency model of a serving engine: time to first token plus a fixed time per output token.

    Each episode makes 1-3 tool calls (reasoning turns of 100-400 tokens) and then answers (50-150 tokens). Tool
    latency is long-tailed: 80% of calls print at once, 15% sleep 0.1-0.5 s, 5% sleep 1-2 s.
    """

    def __init__(self, tok, *, ttft: float = 0.02, per_token: float = 0.0002, slow_tools: bool = True,
                 seed: int = 0) -> None:
        self.tok, self.ttft, self.per_token, self.slow_tools = tok, ttft, per_token, slow_tools
        self.rng = random.Random(seed)
        self.end = tok.convert_tokens_to_ids("<|im_end|>")
        self.filler = tok.encode("Let me think. ", add_special_tokens=False)

    def _text_turn(self, n: int, tail: str) -> list[int]:
        body = (self.filler * (n // len(self.filler) + 1))[:n]
        return body + self.tok.encode(tail, add_special_tokens=False) + [self.end]

    async def generate(self, prompt_ids, *, max_tokens, stop_token_ids=(), stop=(), sampling=None) -> Generation:
        text = self.tok.decode(prompt_ids)
        planned = 1 + int(re.search(r"\(#(\d+)\)", text).group(1)) % 3
        if text.count("<tool_response>") < planned:
            r = self.rng.random() if self.slow_tools else 0.0
            sleep = 0.0 if r < 0.8 else self.rng.uniform(0.1, 0.5) if r < 0.95 else self.rng.uniform(1.0, 2.0)
            code = f"import time; time.sleep({sleep:.3f}); print(6 * 7)"
            tail = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "' + code + '"}}\n</tool_call>'
            ids = self._text_turn(self.rng.randint(100, 400), tail)
        else:
            ids = self._text_turn(self.rng.randint(50, 150), "\\boxed{42}")
        ids = ids[:max_tokens]
        await asyncio.sleep(self.ttft + self.per_token * len(ids))
        return Generation(ids, [-0.5] * len(ids), "stop")


async def run_lockstep(problems, make_env, generator, batch_size: int) -> list:
    """TRL's built-in tool loop: batches of episodes advance in rounds; each round waits for its slowest member."""
    trajectories = []
    for start in range(0, len(problems), batch_size):
        envs = [make_env() for _ in problems[start:start + batch_size]]
        infos = [env.reset(options={"problem": p})[1] for env, p in zip(envs, problems[start:start + batch_size],
                                                                         strict=True)]
        active = list(range(len(envs)))
        while active:
            gens = await asyncio.gather(*(generator.generate(
                envs[i].trajectory.prompt_ids + envs[i].trajectory.completion_ids,
                max_tokens=infos[i]["max_new_tokens"], sampling=SamplingParams()) for i in active))
            steps = await asyncio.gather(*(envs[i].astep({"token_ids": g.token_ids, "logprobs": g.logprobs})
                                           for i, g in zip(active, gens, strict=True)))
            still = []
            for i, (_, _, terminated, truncated, info) in zip(active, steps, strict=True):
                infos[i] = info
                if not (terminated or truncated):
                    still.append(i)
            active = still
        trajectories += [env.trajectory for env in envs]
    return trajectories


def compare_hf(episodes: int, concurrency: int) -> dict:
    """The same comparison with a real Hugging Face generator: a tiny Qwen2 taught to call the interpreter once."""
    import tempfile

    import torch

    from retool_adapters.generators import HFGenerator
    from retool_adapters.trl.testing import build_tool_calling_qwen

    torch.set_num_threads(1)
    problems = [Problem("What is 6 * 7?", "42", id=str(i)) for i in range(episodes)]
    model_dir = build_tool_calling_qwen(tempfile.mkdtemp(prefix="bench-rollout-"), problems[:1])
    tokenizer = HFGenerator.from_pretrained(model_dir).tokenizer

    def make_env():
        return ToolEnvironment(tokenizer, problems[:1], max_completion_tokens=256)

    results = race(problems, make_env, lambda: HFGenerator.from_pretrained(model_dir), concurrency)
    for name in ("async driver", "lockstep"):
        trajs = results[name].pop("trajectories")
        results[name]["accuracy"] = round(sum(bool(t.correct) for t in trajs) / episodes, 3)
    return results


def race(problems, make_env, make_generator, concurrency: int) -> dict:
    """Play `problems` with the async driver, then in lockstep, each with a fresh generator: per mode its time,
    throughput, tool calls and trajectories, and the driver's speedup."""
    results: dict = {}
    for name in ("async driver", "lockstep"):
        generator = make_generator()
        start = time.perf_counter()
        if name == "lockstep":
            trajs = asyncio.run(run_lockstep(problems, make_env, generator, concurrency))
        else:
            trajs = asyncio.run(run_episodes(problems, make_env, generator, concurrency=concurrency, progress=False))
        elapsed = time.perf_counter() - start
        results[name] = {"seconds": round(elapsed, 2), "episodes_per_s": round(len(problems) / elapsed, 2),
                         "tool_calls": sum(t.num_tool_calls for t in trajs), "trajectories": trajs}
    results["speedup"] = round(results["async driver"]["episodes_per_s"] / results["lockstep"]["episodes_per_s"], 2)
    return results


def resources() -> dict:
    """This process's peak memory, open files and live child processes (the sandbox's included)."""
    children = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().split()
            except OSError:
                continue
            children += int(stat[3]) == os.getpid()
    return {"max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "open_fds": len(os.listdir("/proc/self/fd")), "children": children}


def compare(episodes: int, concurrency: int, seed: int) -> dict:
    tok = tiny_tokenizer()
    problems = [Problem(f"What is 6 * 7? (#{i})", "42", id=str(i)) for i in range(episodes)]
    # The slow tool calls sleep, which costs no CPU: give the sandbox a slot per episode, so that its queue (sized
    # for CPU-bound code by default) does not stand in for the scheduling being measured.
    sandbox = LocalSandbox(max_concurrency=concurrency)

    def make_env():
        return ToolEnvironment(tok, problems[:1], sandbox=sandbox, tool_timeout=5.0, max_completion_tokens=8192)

    results = race(problems, make_env, lambda: SimulatedGenerator(tok, seed=seed), concurrency)
    for name in ("async driver", "lockstep"):
        trajs = results[name].pop("trajectories")
        assert len(trajs) == episodes and all(t.correct for t in trajs), name
    sandbox.close()
    return results


def compare_training(steps: int, groups_per_step: int, num_generations: int, step_s: float, max_staleness: int,
                     seed: int) -> dict:
    """Samples per second of GRPO training with a simulated generator and trainer step: synchronous (generate a
    batch, then train on it, as GRPOTrainer with `rollout_func` does) against asynchronous (the ReTool worker keeps
    generating while the trainer trains), over the same number of steps and samples."""
    from retool_adapters.trl.async_worker import ReToolRolloutWorker

    tok = tiny_tokenizer()
    problems = [Problem(f"What is 6 * 7? (#{i})", "42", id=str(i)) for i in range(steps * groups_per_step)]
    batch = groups_per_step * num_generations
    sandbox = LocalSandbox(max_concurrency=2 * batch)
    env_kwargs = {"sandbox": sandbox, "tool_timeout": 5.0, "max_completion_tokens": 8192}
    results: dict = {}

    start = time.perf_counter()
    for step in range(steps):
        group = problems[step * groups_per_step:(step + 1) * groups_per_step]
        asyncio.run(run_episodes(group, lambda: ToolEnvironment(tok, problems[:1], **env_kwargs),
                                 SimulatedGenerator(tok, seed=seed + step), n_per_problem=num_generations,
                                 concurrency=batch, progress=False))
        time.sleep(step_s)  # the trainer's step, generation idle
    elapsed = time.perf_counter() - start
    results["synchronous"] = {"seconds": round(elapsed, 2), "samples_per_s": round(steps * batch / elapsed, 2)}

    worker = ReToolRolloutWorker(problems, tok, SimulatedGenerator(tok, seed=seed), num_generations=num_generations,
                                 max_inflight_groups=groups_per_step, max_staleness=max_staleness, seed=seed,
                                 queue_maxsize=batch,  # back-pressure: a step's worth of samples waits, no more
                                 **env_kwargs)
    start, dropped, staleness = time.perf_counter(), 0, []
    worker.start()
    for step in range(steps):
        taken = 0
        while taken < batch:
            sample = worker.rollout_buffer.get(timeout=120)
            if step - sample.model_version > max_staleness:  # the trainer's own filter
                dropped += 1
                continue
            staleness.append(step - sample.model_version)
            taken += 1
        time.sleep(step_s)  # the trainer's step, generation running on
        worker.update_model_version(step + 1)  # after the weight sync
    elapsed = time.perf_counter() - start
    worker.stop()
    sandbox.close()
    results["asynchronous"] = {"seconds": round(elapsed, 2), "samples_per_s": round(steps * batch / elapsed, 2),
                               "dropped_stale": dropped, "mean_staleness": round(sum(staleness) / len(staleness), 2)}
    results["speedup"] = round(results["asynchronous"]["samples_per_s"] / results["synchronous"]["samples_per_s"], 2)
    return results


def soak(episodes: int, concurrency: int) -> dict:
    tok = tiny_tokenizer()
    problems = [Problem(f"What is 6 * 7? (#{i})", "42", id=str(i)) for i in range(episodes)]
    generator = SimulatedGenerator(tok, ttft=0.0, per_token=0.0, slow_tools=False)

    def make_env():
        return ToolEnvironment(tok, problems[:1], tool_timeout=5.0, max_completion_tokens=8192)

    samples = []
    chunk = max(1, episodes // 10)
    for start in range(0, episodes, chunk):
        trajs = asyncio.run(run_episodes(problems[start:start + chunk], make_env, generator,
                                         concurrency=concurrency, progress=False))
        assert all(t.correct for t in trajs)
        samples.append({"episodes": start + len(trajs), **resources()})
        print(samples[-1], flush=True)
    return {"samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--soak", type=int, default=0, help="run this many episodes and sample resources")
    parser.add_argument("--hf", action="store_true", help="a real Hugging Face generator on a tiny model")
    parser.add_argument("--training", action="store_true", help="samples/s of async vs synchronous GRPO training")
    parser.add_argument("--steps", type=int, default=8, help="--training: trainer steps")
    parser.add_argument("--step-seconds", type=float, default=1.0, help="--training: simulated trainer step")
    parser.add_argument("--out", default="bench/results/rollout.json")
    args = parser.parse_args()
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(), "args": vars(args)}
    if args.soak:
        result = soak(args.soak, args.concurrency)
        args.out = args.out.replace(".json", "_soak.json")
    elif args.training:
        result = compare_training(args.steps, groups_per_step=8, num_generations=4, step_s=args.step_seconds,
                                  max_staleness=2, seed=args.seed)
        args.out = args.out.replace(".json", "_training.json")
        for name in ("synchronous", "asynchronous"):
            print(f"{name:<13} {result[name]['seconds']:>8.2f} s  {result[name]['samples_per_s']:>7.2f} samples/s")
        print(f"speedup: {result['speedup']}x")
    else:
        if args.hf:
            result = compare_hf(args.episodes, args.concurrency)
            args.out = args.out.replace(".json", "_hf.json")
        else:
            result = compare(args.episodes, args.concurrency, args.seed)
        for name in ("async driver", "lockstep"):
            r = result[name]
            print(f"{name:<13} {r['seconds']:>8.2f} s  {r['episodes_per_s']:>7.2f} episodes/s  "
                  f"{r['tool_calls']} tool calls")
        print(f"speedup: {result['speedup']}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({**meta, **result}, indent=2))


if __name__ == "__main__":
    main()
