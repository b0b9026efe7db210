"""OpenEnv adapter against the real `openenv-core` package: a uvicorn server on 127.0.0.1 (HTTP and WebSocket) in a
server thread, and `RemoteToolEnvironment` (OpenEnv's `EnvClient` on its own thread) as a rollout worker would use it.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytest.importorskip("openenv.core", reason="openenv-core is not installed here; run scripts/test_frameworks.sh")
uvicorn = pytest.importorskip("uvicorn", reason="openenv-core brings uvicorn")

import httpx  # noqa: E402

from retool_adapters.openenv import RemoteToolEnvironment, create_app  # noqa: E402
from retool_env.rollout import run_episode  # noqa: E402

from .test_adapter_scripted import (  # noqa: E402
    LOGPROB,
    PROBLEM,
    SCRIPTS,
    Record,
    ScriptedEngine,
    action_ids,
    local_reference,
    make_env,
)


class Server:
    """OpenEnv's app under uvicorn on a free port, in a thread of its own."""

    def __init__(self, app) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def servers(qwen_tok):
    started = {fmt: Server(create_app(lambda fmt=fmt: make_env(qwen_tok, f"{fmt}_x"), max_concurrent_envs=8))
               for fmt in ("hermes", "retool")}
    yield {fmt: server.url for fmt, server in started.items()}
    for server in started.values():
        server.stop()


def record(traj) -> Record:
    return Record(traj.prompt_ids, traj.completion_ids, traj.env_mask, traj.logprobs, traj.reward)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_remote_episode_equals_the_local_env(qwen_tok, servers, script):
    env = RemoteToolEnvironment(servers[script.split("_")[0]])
    try:
        traj = asyncio.run(run_episode(env, ScriptedEngine(action_ids(qwen_tok, script)), problem=PROBLEM))
    finally:
        env.close()
    assert record(traj) == local_reference(qwen_tok, script)
    local = make_env(qwen_tok, script)
    local_traj = asyncio.run(run_episode(local, ScriptedEngine(action_ids(qwen_tok, script)), problem=PROBLEM))
    assert traj.to_dict() == {**local_traj.to_dict(), "tool_calls": traj.to_dict()["tool_calls"]}
    assert [(c.code, c.output, c.status) for c in traj.tool_calls] == [
        (c.code, c.output, c.status) for c in local_traj.tool_calls]


def test_synchronous_steps_and_info_like_a_local_env(qwen_tok, servers):
    env, local = RemoteToolEnvironment(servers["hermes"]), make_env(qwen_tok, "hermes_correct")
    try:
        obs, info = env.reset(options={"problem": PROBLEM})
        local_obs, local_info = local.reset(options={"problem": PROBLEM})
        assert obs.tolist() == local_obs.tolist() and obs.dtype == local_obs.dtype
        assert info["stop_token_ids"] == local_info["stop_token_ids"]
        assert info["max_new_tokens"] == local_info["max_new_tokens"]
        for ids in action_ids(qwen_tok, "hermes_correct"):
            action = {"token_ids": ids, "logprobs": [LOGPROB] * len(ids)}
            remote_step, local_step = env.step(action), local.step(action)
            assert remote_step[0].tolist() == local_step[0].tolist()
            assert remote_step[1:4] == local_step[1:4]
        assert env.trajectory.correct and env.trajectory.reward == 1.0
    finally:
        env.close()


def test_concurrent_sessions_over_one_websocket_server(qwen_tok, servers):
    async def play_all():
        envs = [RemoteToolEnvironment(servers["hermes"]) for _ in range(3)]
        scripts = ["hermes_correct", "hermes_wrong", "hermes_correct"]
        try:
            return await asyncio.gather(*(run_episode(env, ScriptedEngine(action_ids(qwen_tok, s)), problem=PROBLEM)
                                          for env, s in zip(envs, scripts, strict=True)))
        finally:
            for env in envs:
                env.close()

    trajs = asyncio.run(play_all())
    assert [t.reward for t in trajs] == [1.0, -0.9, 1.0]
    assert record(trajs[1]) == local_reference(qwen_tok, "hermes_wrong")


def test_http_endpoints(qwen_tok, servers):
    with httpx.Client(base_url=servers["hermes"], timeout=30) as http:
        assert http.get("/health").json()["status"] == "healthy"
        schema = http.get("/schema").json()
        assert "token_ids" in schema["action"]["properties"] and "token_ids" in schema["observation"]["properties"]
        reset = http.post("/reset", json={"problem": PROBLEM.to_dict()}).json()
        assert reset["observation"]["token_ids"] == local_reference(qwen_tok, "hermes_correct").prompt_ids
        assert reset["done"] is False and reset["observation"]["info"]["problem_id"] == PROBLEM.id


def test_misuse_raises_clear_errors(qwen_tok, servers):
    env = RemoteToolEnvironment(servers["hermes"])
    try:
        with pytest.raises(RuntimeError, match="reset"):
            env.step([1, 2, 3])
        env.reset(options={"problem": PROBLEM})
        with pytest.raises(RuntimeError, match="must lie in"):
            env.step([10**9])
        traj = asyncio.run(run_episode(env, ScriptedEngine(action_ids(qwen_tok, "hermes_correct")), problem=PROBLEM))
        assert traj.reward == 1.0  # the session survives a rejected action
    finally:
        env.close()


def test_served_from_another_process_by_the_command_line(qwen_tok, tmp_path):
    """`python -m retool_adapters.openenv` in a subprocess, played from this one."""
    import socket
    import subprocess
    import sys

    qwen_tok.save_pretrained(tmp_path / "tok")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "retool_adapters.openenv", "--tokenizer", str(tmp_path / "tok"),
                               "--dataset", "arith", "--port", str(port)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.5)
        env = RemoteToolEnvironment(f"http://127.0.0.1:{port}")
        try:
            traj = asyncio.run(run_episode(env, ScriptedEngine(action_ids(qwen_tok, "hermes_correct")),
                                           problem=PROBLEM))
            assert record(traj) == local_reference(qwen_tok, "hermes_correct")
        finally:
            env.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
