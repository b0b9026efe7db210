"""NeMo-Gym adapter against the real `nemo-gym` package (0.4.0, installed with --no-deps --ignore-requires-python:
it declares Python >= 3.12, and its server code imports and runs on 3.11).

Three servers under uvicorn on 127.0.0.1: the adapter's resources server (NeMo-Gym's own `SimpleResourcesServer`
app: session middleware and cookie, `/seed_session`, `/verify`, `/aggregate_metrics`), NeMo-Gym's own
`simple_agent` (`/run`), and a scripted stand-in for the model server (`/v1/responses`; no policy runs here). The
agent is wired as NeMo-Gym's launcher wires its child servers (the NEMO_GYM_CONFIG_DICT variable). Other tests post
to the resources server directly, as simple_agent does, with NeMo-Gym's own pydantic models as bodies.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

pytest.importorskip("nemo_gym.base_resources_server", reason="nemo-gym is not installed here; "
                                                             "run scripts/test_frameworks.sh")
uvicorn = pytest.importorskip("uvicorn")

import httpx  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi import Request as FastAPIRequest  # noqa: E402
from nemo_gym.openai_utils import (  # noqa: E402
    NeMoGymFunctionCallOutput,
    NeMoGymResponse,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputText,
)
from omegaconf import OmegaConf  # noqa: E402

from retool_adapters.nemo_gym import (  # noqa: E402
    EXECUTE_PYTHON_TOOL,
    ReToolResourcesServer,
    ReToolResourcesServerConfig,
    ReToolVerifyResponse,
)

QUESTION, ANSWER = "What is 123 * 456?", "56088"


def serve(app, port: int = 0):
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    return server, thread, server.servers[0].sockets[0].getsockname()[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# What the scripted policy answers, by question: a dict is an execute_python call's arguments, a str the answer.
POLICY = {"right": [{"code": "print(123 * 456)"}, "So it is \\boxed{56088}."],
          "wrong": [{"code": "print(2 + 2)"}, "It is \\boxed{4}."]}


def scripted_model_app():
    """A stand-in for NeMo-Gym's vLLM model server (`/v1/responses`): no policy runs here. It answers the script of
    the question, turn by turn (turn = function call outputs so far), and records each input it got."""
    app, seen = FastAPI(), []

    @app.post("/v1/responses")
    async def responses(request: FastAPIRequest) -> dict:
        body = await request.json()
        seen.append(body["input"])
        question = body["input"][0]["content"]
        turn = POLICY[question][sum(item.get("type") == "function_call_output" for item in body["input"])]
        n = len(body["input"])
        item = (NeMoGymResponseFunctionToolCall(arguments=json.dumps(turn), call_id=f"call_{n}", name="execute_python",
                                                id=f"fc_{n}", status="completed")
                if isinstance(turn, dict) else message(turn, n))
        return NeMoGymResponse(id=f"resp_{n}", created_at=0.0, model="policy", object="response", output=[item],
                               parallel_tool_calls=False, tool_choice="auto", tools=[]).model_dump()

    return app, seen


@pytest.fixture(scope="module")
def stack():
    """The resources server, the scripted model server, and NeMo-Gym's own simple_agent, wired by a global config
    as NeMo-Gym's launcher passes it to its child servers (the NEMO_GYM_CONFIG_DICT variable)."""
    from nemo_gym.global_config import NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME
    from nemo_gym.server_utils import BaseServerConfig, ServerClient
    from responses_api_agents.simple_agent.app import SimpleAgent, SimpleAgentConfig

    config = ReToolResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="retool",
                                         env={"max_tool_calls": 3, "max_observation_tokens": 64,
                                              "error_format": "last_line"})
    head = BaseServerConfig(host="127.0.0.1", port=free_port())  # never started: nothing here asks the head server
    resources = ReToolResourcesServer(config=config, server_client=ServerClient(
        head_server_config=head, global_config_dict=OmegaConf.create({})))
    running = [serve(resources.setup_webserver())]
    model_app, seen = scripted_model_app()
    running.append(serve(model_app))
    agent_port = free_port()
    global_config = {
        "retool": {"resources_servers": {"retool": {"host": "127.0.0.1", "port": running[0][2]}}},
        "policy_model": {"responses_api_models": {"scripted": {"host": "127.0.0.1", "port": running[1][2]}}},
        "retool_simple_agent": {"responses_api_agents": {"simple_agent": {"host": "127.0.0.1", "port": agent_port}}},
    }
    os.environ[NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME] = OmegaConf.to_yaml(OmegaConf.create(global_config))
    agent_config = SimpleAgentConfig(host="127.0.0.1", port=agent_port, entrypoint="app.py",
                                     name="retool_simple_agent", max_steps=8,
                                     resources_server={"type": "resources_servers", "name": "retool"},
                                     model_server={"type": "responses_api_models", "name": "policy_model"})
    agent = SimpleAgent(config=agent_config, server_client=ServerClient(
        head_server_config=head, global_config_dict=OmegaConf.create(global_config)))
    running.append(serve(agent.setup_webserver(), agent_port))
    yield {"resources": f"http://127.0.0.1:{running[0][2]}", "agent": f"http://127.0.0.1:{agent_port}",
           "model_inputs": seen}
    os.environ.pop(NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME, None)
    for server, thread, _ in running:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def server_url(stack):
    return stack["resources"]


@pytest.mark.parametrize("question", ["right", "wrong"])
def test_simple_agent_run_through_the_resources_server(stack, question):
    """NeMo-Gym's simple_agent `/run`: seed_session, model turns, execute_python over HTTP, verify."""
    stack["model_inputs"].clear()
    body = {"responses_create_params": {"input": [{"role": "user", "content": question}],
                                        "tools": [EXECUTE_PYTHON_TOOL]},
            "expected_answer": ANSWER}
    reply = httpx.post(f"{stack['agent']}/run", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    verified = reply.json()
    assert verified["reward"] == pytest.approx(1.0 if question == "right" else -0.9)
    assert verified["correct"] is (question == "right") and verified["num_tool_calls"] == 1
    # the tool output reached the model's next input, as a function_call_output
    outputs = [item for item in stack["model_inputs"][-1] if item.get("type") == "function_call_output"]
    assert json.loads(outputs[0]["output"]) == {"output": "56088\n" if question == "right" else "4\n",
                                                "status": "ok"}


def message(text: str, n: int) -> NeMoGymResponseOutputMessage:
    return NeMoGymResponseOutputMessage(id=f"msg_{n}", content=[NeMoGymResponseOutputText(annotations=[], text=text)])


def rollout(url: str, turns: list[str | dict], expected: str = ANSWER, key: str = "expected_answer"):
    """One rollout as simple_agent runs it; `turns` are the model's: a dict is an execute_python call's arguments."""
    params = {"input": [{"role": "user", "content": QUESTION}], "tools": [EXECUTE_PYTHON_TOOL]}
    output, tool_outputs = [], []
    with httpx.Client(base_url=url, timeout=60) as http:  # keeps NeMo-Gym's session cookie, as the agent does
        http.post("/seed_session", json={}).raise_for_status()
        for n, turn in enumerate(turns):
            if isinstance(turn, dict):
                call = NeMoGymResponseFunctionToolCall(arguments=json.dumps(turn), call_id=f"call_{n}",
                                                       name="execute_python")
                reply = http.post(f"/{call.name}", content=call.arguments, headers={"content-type": "application/json"})
                reply.raise_for_status()
                output += [call, NeMoGymFunctionCallOutput(call_id=call.call_id, output=reply.text)]
                tool_outputs.append(reply.json())
            else:
                output.append(message(turn, n))
        response = NeMoGymResponse(id="resp_0", created_at=0.0, model="policy", object="response", output=output,
                                   parallel_tool_calls=False, tool_choice="auto", tools=[])
        body = {"responses_create_params": params, "response": response.model_dump(), key: expected}
        verified = http.post("/verify", json=body)
        verified.raise_for_status()
    return ReToolVerifyResponse.model_validate(verified.json()), tool_outputs


def test_right_episode_reward_one(server_url):
    verified, outputs = rollout(server_url, [{"code": "print(123 * 456)"}, "So it is \\boxed{56088}."])
    assert outputs == [{"output": "56088\n", "status": "ok"}]  # the tool output the agent feeds back
    assert verified.reward == 1.0 and verified.correct and verified.num_tool_calls == 1 and verified.num_turns == 2


def test_wrong_episode_gets_the_shaped_penalty(server_url):
    verified, outputs = rollout(server_url, [{"code": "print(2 + 2)"}, "It is \\boxed{4}."])
    assert outputs[0]["output"] == "4\n"
    assert verified.reward == pytest.approx(-0.9) and not verified.correct and verified.num_tool_calls == 1


def test_math_with_code_rows_use_expected_result(server_url):
    verified, _ = rollout(server_url, ["\\boxed{56088}"], key="expected_result")
    assert verified.reward == 1.0 and verified.num_tool_calls == 0


def test_tool_output_that_prints_a_box_earns_nothing(server_url):
    verified, _ = rollout(server_url, [{"code": "print('\\\\boxed{56088}')"}, "I am done."])
    assert not verified.correct and verified.reward == pytest.approx(-0.9)


def test_sessions_keep_state_within_a_rollout_only(server_url):
    _, outputs = rollout(server_url, [{"code": "x = 41"}, {"code": "print(x + 1)"}, "\\boxed{42}"], expected="42")
    assert outputs[1]["output"] == "42\n"
    _, outputs = rollout(server_url, [{"code": "print(x)"}, "\\boxed{0}"])
    assert "NameError" in outputs[0]["output"]


def test_the_call_budget_is_counted_by_the_server(server_url):
    verified, outputs = rollout(server_url, [{"code": "print(1)"}] * 4 + ["\\boxed{1}"])
    assert [o["status"] for o in outputs] == ["ok", "ok", "ok", "skipped"]
    assert outputs[3]["output"] == "Error: the budget of 3 tool calls is spent; give the final answer now."
    assert verified.num_tool_calls == 3 and verified.reward == pytest.approx(-0.7) and verified.num_turns == 5


def test_outputs_are_shown_as_tool_environment_shows_them(server_url):
    """ToolRunner's observation: clipped to max_observation_tokens (head and tail kept), a failed call's output cut
    as error_format says (last_line: the exception), an empty one as "(no output)"."""
    _, outputs = rollout(server_url, [{"code": "print(' '.join(str(i) for i in range(3000)))"},
                                      {"code": "def f():\n    raise ValueError('bad')\nf()"}, {"code": "x = 1"},
                                      "\\boxed{1}"])
    head, _, tail = outputs[0]["output"].partition("tokens omitted")
    assert head.startswith("0 1 2 3") and tail.rstrip().endswith("2998 2999") and len(outputs[0]["output"]) < 400
    assert outputs[1] == {"output": "ValueError: bad", "status": "error"}
    assert outputs[2] == {"output": "(no output)", "status": "ok"}


def test_the_config_holds_env_config_fields_only():
    base = {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py", "name": "retool"}
    config = ReToolResourcesServerConfig(**base, env={"max_tool_calls": 2, "reward": "binary"})
    assert (config.env_config.max_tool_calls, config.env_config.reward) == (2, "binary")
    assert config.env_config.stateful and config.env_config.tool_timeout == 10.0  # the server's defaults
    with pytest.raises(ValueError, match="max_tool_call"):
        ReToolResourcesServerConfig(**base, env={"max_tool_call": 2})
    with pytest.raises(ValueError, match="cannot end an episode at a tool timeout"):  # refused, never ignored
        ReToolResourcesServerConfig(**base, env={"on_timeout": "abort"})


def test_old_yaml_keys_move_into_env_with_a_warning():
    base = {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py", "name": "retool"}
    with pytest.warns(DeprecationWarning, match="under `env:`"):
        config = ReToolResourcesServerConfig(**base, sandbox="local", max_tool_calls=5, max_output_chars=100,
                                             env={"reward": "binary"})
    assert config.env == {"sandbox": "local", "max_tool_calls": 5, "reward": "binary"}
    assert not hasattr(config, "max_tool_calls") and not hasattr(config, "max_output_chars")


def test_aggregate_metrics_over_a_group(server_url):
    """NeMo-Gym's own aggregation, over the verify responses tagged as its rollout collection tags them."""
    from nemo_gym.global_config import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

    rollouts = [rollout(server_url, turns)[0] for turns in (["\\boxed{56088}"], ["\\boxed{1}"])]
    assert [r.reward for r in rollouts] == [1.0, -1.0]
    body = {"verify_responses": [{**r.model_dump(), TASK_INDEX_KEY_NAME: 0, ROLLOUT_INDEX_KEY_NAME: i}
                                 for i, r in enumerate(rollouts)]}
    metrics = httpx.post(f"{server_url}/aggregate_metrics", json=body, timeout=60)
    assert metrics.status_code == 200, metrics.text
    agent = metrics.json()["agent_metrics"]
    assert agent["mean/reward"] == 0.0 and agent["mean/correct"] == 0.5 and agent["max/reward"] == 1.0
