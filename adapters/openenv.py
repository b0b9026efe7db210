"""OpenEnv: the environment served over OpenEnv's HTTP/WebSocket interface, and a client that behaves like a local one.

Server side, `ReToolOpenEnv` is an OpenEnv `Environment` around a `ToolEnvironment` (token ids in, token ids out) and
`create_app` builds OpenEnv's FastAPI app with it: `/ws` (one environment per WebSocket session, what `EnvClient`
uses), and `/reset`, `/step`, `/state`, `/schema`, `/health`. OpenEnv's HTTP `/reset` and `/step` build a fresh
environment per request, so an episode (several steps) needs the WebSocket.

Client side, `RemoteToolEnvironment` makes a served environment look like a local `ToolEnvironment`: `reset`,
`step`, `astep` and `trajectory` (kept in step with the server's, and replaced by the server's own record when the
episode ends), so `retool_env.rollout.run_episode` and trainers' rollout workers run unchanged on other machines.

Serve::

    python -m retool_adapters.openenv --tokenizer Qwen/Qwen2.5-7B-Instruct --dataset arith --port 8000

Use from a rollout worker::

    from retool_adapters.openenv import RemoteToolEnvironment
    env = RemoteToolEnvironment("http://env-host:8000")
    traj = await run_episode(env, generator, problem=problem)   # or env.reset() / env.step(ids) by hand
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import numpy as np

try:
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
    from pydantic import Field
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(f"retool_adapters.openenv needs OpenEnv: pip install openenv-core (missing {exc.name})",
                              name=exc.name) from exc

from retool_env.config import EnvConfig
from retool_env.data import Problem
from retool_env.env import ToolEnvironment
from retool_env.trajectory import ToolCallRecord, Trajectory, Turn

__all__ = ["ReToolAction", "ReToolEnvClient", "ReToolObservation", "ReToolOpenEnv", "RemoteToolEnvironment",
           "create_app", "trajectory_from_dict"]


class ReToolAction(Action):
    """One turn of the policy: its token ids, exactly as generated, and optionally their logprobs."""

    token_ids: list[int]
    logprobs: list[float] | None = None
    finish_reason: str | None = None


class ReToolObservation(Observation):
    """The tokens the environment appends (the prompt after reset), the step's info, and at the end the trajectory."""

    token_ids: list[int] = Field(default_factory=list)
    info: dict[str, Any] = Field(default_factory=dict)
    truncated: bool = False
    trajectory: dict[str, Any] | None = None


class ReToolOpenEnv(Environment[ReToolAction, ReToolObservation, State]):
    """A `ToolEnvironment` behind OpenEnv's `Environment` interface; one per WebSocket session."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # sessions share only the sandbox, which is built for concurrency

    def __init__(self, env: ToolEnvironment) -> None:
        super().__init__()
        self.env = env
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, index: int | None = None,
              problem: Mapping[str, Any] | None = None, **kwargs: Any) -> ReToolObservation:
        """Start an episode: a seeded draw, `index` into the dataset, or a `problem` dict (question, answer)."""
        options = {"problem": dict(problem)} if problem is not None else {"index": index} if index is not None else None
        prompt_ids, info = self.env.reset(seed=seed, options=options)
        self._state = State(episode_id=episode_id or info["problem_id"], step_count=0)
        return ReToolObservation(token_ids=prompt_ids.tolist(), info=info)

    def step(self, action: ReToolAction, timeout_s: float | None = None, **kwargs: Any) -> ReToolObservation:
        return self._observation(*self.env.step(action.model_dump(include={"token_ids", "logprobs", "finish_reason"})))

    async def step_async(self, action: ReToolAction, timeout_s: float | None = None,
                         **kwargs: Any) -> ReToolObservation:
        """The WebSocket server awaits this, so sessions' tool calls overlap in one event loop."""
        step = await self.env.astep(action.model_dump(include={"token_ids", "logprobs", "finish_reason"}))
        return self._observation(*step)

    def _observation(self, obs_ids: np.ndarray, reward: float, terminated: bool, truncated: bool,
                     info: dict[str, Any]) -> ReToolObservation:
        self._state.step_count += 1
        done = terminated or truncated
        return ReToolObservation(token_ids=obs_ids.tolist(), info=info, done=done, reward=reward, truncated=truncated,
                                 trajectory=self.env.trajectory.to_dict() if done and self.env.trajectory else None)

    @property
    def state(self) -> State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name="retool_env", version="0.1.0",
                                   description="Token-level math environment with a Python interpreter (ReTool)")

    def close(self) -> None:
        self.env.close()


def create_app(make_env: Callable[[], ToolEnvironment], *, max_concurrent_envs: int = 64) -> Any:
    """OpenEnv's FastAPI app serving one `ToolEnvironment` from `make_env` per WebSocket session."""
    return create_fastapi_app(lambda: ReToolOpenEnv(make_env()), ReToolAction, ReToolObservation,
                              max_concurrent_envs=max_concurrent_envs)


class ReToolEnvClient(EnvClient[ReToolAction, ReToolObservation, State]):
    """OpenEnv's async WebSocket client, typed for this environment."""

    def _step_payload(self, action: ReToolAction) -> dict[str, Any]:
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[ReToolObservation]:
        observation = ReToolObservation(**payload.get("observation", {}), reward=payload.get("reward"),
                                        done=payload.get("done", False))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)


def trajectory_from_dict(data: Mapping[str, Any]) -> Trajectory:
    """The inverse of `Trajectory.to_dict`."""
    names = {f.name for f in dataclasses.fields(Trajectory)}
    values = {k: v for k, v in data.items() if k in names}
    values["turns"] = [Turn(**t) for t in data.get("turns", [])]
    values["tool_calls"] = [ToolCallRecord(**c) for c in data.get("tool_calls", [])]
    if values.get("logprobs") is None:
        values["logprobs"] = [0.0] * len(values.get("completion_ids", []))
    return Trajectory(**values)


class RemoteToolEnvironment:
    """A served environment used like a local `ToolEnvironment` (reset, step, astep, trajectory, close).

    The WebSocket lives on a private event-loop thread, so the synchronous `reset`/`step` work anywhere and `astep`
    never blocks the caller's event loop. `trajectory` grows with each step exactly as the server's does.
    """

    def __init__(self, base_url: str, *, connect_timeout_s: float = 10.0, message_timeout_s: float = 600.0) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="retool-openenv-client", daemon=True)
        self._thread.start()
        self._client = ReToolEnvClient(base_url, connect_timeout_s=connect_timeout_s,
                                       message_timeout_s=message_timeout_s)
        self.trajectory: Trajectory | None = None

    @property
    def unwrapped(self) -> RemoteToolEnvironment:
        return self

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _arun(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        kwargs: dict[str, Any] = {"seed": seed}
        options = options or {}
        if "problem" in options:
            problem = options["problem"]
            kwargs["problem"] = problem.to_dict() if isinstance(problem, Problem) else dict(problem)
        elif "index" in options:
            kwargs["index"] = int(options["index"])
        observation = self._run(self._client.reset(**kwargs)).observation
        self.trajectory = Trajectory(prompt_ids=list(observation.token_ids), problem_id=observation.info["problem_id"])
        return np.asarray(observation.token_ids, dtype=np.int64), observation.info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = self._action(action)
        return self._record(action, self._run(self._client.step(action)).observation)

    async def astep(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = self._action(action)
        return self._record(action, (await self._arun(self._client.step(action))).observation)

    def _action(self, action: Any) -> ReToolAction:
        if self.trajectory is None:
            raise RuntimeError("call reset() before step()")
        if isinstance(action, Mapping):
            return ReToolAction(token_ids=np.asarray(action["token_ids"]).tolist(), logprobs=action.get("logprobs"),
                                finish_reason=action.get("finish_reason"))
        return ReToolAction(token_ids=np.asarray(action).tolist())

    def _record(self, action: ReToolAction, observation: ReToolObservation) -> tuple:
        traj = self.trajectory
        assert traj is not None, "reset() starts an episode"
        traj.append_model(action.token_ids, action.logprobs)
        traj.append_env(observation.token_ids)
        if observation.done and observation.trajectory is not None:  # the server's record is the authority
            final = trajectory_from_dict(observation.trajectory)
            if final.completion_ids != traj.completion_ids:
                raise RuntimeError("the served trajectory differs from the tokens this client sent and received")
            for field in dataclasses.fields(Trajectory):
                setattr(traj, field.name, getattr(final, field.name))
        reward = float(observation.reward or 0.0)
        terminated = observation.done and not observation.truncated
        return (np.asarray(observation.token_ids, dtype=np.int64), reward, terminated, observation.truncated,
                observation.info)

    def close(self) -> None:
        """Close the WebSocket session and stop the client's thread."""
        if self._loop.is_running():
            self._run(self._client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)


def main(argv: list[str] | None = None) -> None:
    """Serve the environment with uvicorn: `python -m retool_adapters.openenv --tokenizer PATH --dataset arith`."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", required=True, help="the policy's tokenizer, a name or local path")
    parser.add_argument("--dataset", default="arith", help="a dataset name or file retool_env.data reads")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-concurrent-envs", type=int, default=64)
    EnvConfig.add_arguments(parser, tool_format="hermes")  # --tool-format, --max-completion-tokens, ...
    args = parser.parse_args(argv)
    from retool_env.data import load_dataset_problems
    from retool_env.tokens import load_tokenizer

    tokenizer, problems = load_tokenizer(args.tokenizer), load_dataset_problems(args.dataset)
    config = EnvConfig.from_settings(args)
    app = create_app(lambda: ToolEnvironment(tokenizer, problems, **config),
                     max_concurrent_envs=args.max_concurrent_envs)
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
