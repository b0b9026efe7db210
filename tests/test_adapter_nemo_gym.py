"""NeMo-Gym adapter against the real `nemo-gym` package (0.4.0, installed with --no-deps --ignore-requires-python:
it declares Python >= 3.12, and its resources-server code imports and runs on 3.11).

The server is NeMo-Gym's own `SimpleResourcesServer` app (its session middleware and cookie, `/seed_session`,
`/verify`, `/aggregate_metrics`) under uvicorn on 127.0.0.1, built with a real `ServerClient`; the rollouts are
played over HTTP as NeMo-Gym's `simple_agent` plays them (seed the session, post each function call's arguments to
`/<name>` with the session cookie, then post the response to `/verify`), its bodies NeMo-Gym's own pydantic models.
The model is a script: no policy runs here.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("nemo_gym.base_resources_server", reason="nemo-gym is not installed here; "
                                                             "run scripts/test_frameworks.sh")
uvicorn = pytest.importorskip("uvicorn")

import httpx  # noqa: E402
from nemo_gym.openai_utils import (  # noqa: E402
    NeMoGymFunctionCallOutput,
    NeMoGymResponse,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputText,
)
from nemo_gym.server_utils import BaseServerConfig, ServerClient  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from retool_adapters.nemo_gym import (  # noqa: E402
    EXECUTE_PYTHON_TOOL,
    ReToolResourcesServer,
    ReToolResourcesServerConfig,
    ReToolVerifyResponse,
)

QUESTION, ANSWER = "What is 123 * 456?", "56088"


@pytest.fixture(scope="module")
def server_url():
    config = ReToolResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="retool",
                                         tool_timeout=10.0, max_tool_calls=3)
    client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
                          global_config_dict=OmegaConf.create({}))
    app = ReToolResourcesServer(config=config, server_client=client).setup_webserver()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=10)


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
    assert verified.reward == 1.0 and verified.correct and verified.num_tool_calls == 1


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
    assert [o["status"] for o in outputs] == ["ok", "ok", "ok", "invalid"] and "limit" in outputs[3]["output"]
    assert verified.num_tool_calls == 3 and verified.reward == pytest.approx(-0.7)


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
