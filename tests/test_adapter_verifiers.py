"""verifiers v1 adapter against the real `verifiers` package: a right and a wrong episode through `vf-eval` (verifiers'
own entry point, in a subprocess), its interception server and trace store, with the model scripted by an
OpenAI-compatible server on 127.0.0.1 that records every request it gets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

pytest.importorskip("verifiers.v1", reason="verifiers is not installed here; run scripts/test_frameworks.sh")

from pydantic import ValidationError

from retool_adapters.verifiers import ReToolHarnessConfig, ReToolTaskset, ReToolTasksetConfig


def call(code: str, call_id: str) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": "execute_python", "arguments": json.dumps({"code": code})}}


# The model's replies per problem. Right: two calls sharing the session's variables, then the answer (+1).
# Wrong: a malformed call (an error, never run), a real call whose output prints a right-looking \boxed{56}, then
# a wrong answer: only the model's own text is graded, and one call ran: min(-0.6, -1 + 0.1 * 1) = -0.9.
# Shown: one turn of two calls, a long output (clipped to the env's max_observation_tokens) and a failing one (its
# last line, error_format last_line), then the right answer (+1).
SCRIPTS: dict[str, list[dict]] = {
    "What is 123 * 456?": [
        {"role": "assistant", "content": None, "tool_calls": [call("x = 123 * 456", "c1")]},
        {"role": "assistant", "content": None, "tool_calls": [call("print(x)", "c2")]},
        {"role": "assistant", "content": "So the answer is \\boxed{56088}."},
    ],
    "What is 7 * 8?": [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "execute_python", "arguments": "{not json}"}}]},
        {"role": "assistant", "content": None, "tool_calls": [call("print('\\\\boxed{56}', x if 'x' in dir() "
                                                                     "else 2 + 2)", "c2")]},
        {"role": "assistant", "content": "It is \\boxed{4}."},
    ],
    "What is 2 + 2?": [
        {"role": "assistant", "content": None, "tool_calls": [call("print(' '.join(str(i) for i in range(3000)))",
                                                                   "c1"), call("1 / 0", "c2")]},
        {"role": "assistant", "content": "So \\boxed{4}."},
    ],
}


class ScriptedModel(BaseHTTPRequestHandler):
    """`POST /v1/chat/completions`: the next scripted reply for the conversation's problem."""

    requests: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(body)
        question = next(q for q in SCRIPTS if q in body["messages"][0]["content"])
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        message = SCRIPTS[question][turn]
        self._send({"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 0,
                    "model": body["model"], "choices": [{"index": 0, "message": message,
                                                         "finish_reason": "tool_calls" if message.get("tool_calls")
                                                         else "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})

    def do_GET(self) -> None:
        self._send({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    def _send(self, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted_model():
    ScriptedModel.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedModel)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", ScriptedModel.requests
    server.shutdown()
    server.server_close()


@pytest.fixture
def problems(tmp_path: Path) -> Path:
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in [
        {"question": "What is 123 * 456?", "answer": "56088", "id": "right"},
        {"question": "What is 7 * 8?", "answer": "56", "id": "wrong"},
        {"question": "What is 2 + 2?", "answer": "4", "id": "shown"}]))
    return path


def test_taskset_yields_the_projects_problems(problems):
    tasks = list(ReToolTaskset(ReToolTasksetConfig(id="retool_verifiers", dataset=str(problems))))
    assert [t.data.id for t in tasks] == ["right", "wrong", "shown"]
    assert [t.data.answer for t in tasks] == ["56088", "56", "4"]
    assert tasks[0].data.prompt.startswith("What is 123 * 456?") and "\\boxed{}" in tasks[0].data.prompt


def test_the_environment_settings_are_env_config_fields(problems):
    config = ReToolTasksetConfig(id="retool_verifiers", dataset=str(problems), env={"reward": "binary"})
    assert next(iter(ReToolTaskset(config))).data.env == {"reward": "binary"}  # carried to the harness and the reward
    with pytest.raises(ValidationError, match="max_tool_call"):
        ReToolTasksetConfig(id="retool_verifiers", env={"max_tool_call": 2})
    with pytest.raises(ValidationError, match="cannot end an episode at a tool timeout"):  # refused, never ignored
        ReToolTasksetConfig(id="retool_verifiers", env={"on_timeout": "abort"})
    with pytest.warns(DeprecationWarning, match="under env"):  # the old keys still work
        old = ReToolTasksetConfig(id="retool_verifiers", prompt="retool", reward="binary", env={"max_tool_calls": 2})
    assert old.env == {"prompt": "retool", "reward": "binary", "max_tool_calls": 2}
    with pytest.raises(ValidationError, match=r"--env\.taskset\.env\.max-tool-calls"):
        ReToolHarnessConfig(id="retool_verifiers", max_tool_calls=8)


def vf_eval(base_url: str, problems: Path, out: Path, *flags: str) -> dict[str, dict]:
    """Run verifiers' `vf-eval` on the plugin; the traces it stored, by problem id."""
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("vf-eval")), "retool_verifiers", "--env.taskset.dataset", str(problems),
         "--env.agent.runtime.type", "subprocess", "--model", "scripted", "--client.base-url", base_url,
         "--client.api-key-var", "SCRIPTED_API_KEY", "--num-rollouts", "1", "--push", "false",
         "--output-dir", str(out), *flags],
        env={**os.environ, "SCRIPTED_API_KEY": "scripted"}, cwd=out.parent, capture_output=True, text=True,
        timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (traces_file,) = out.glob("*/traces.jsonl")
    episodes = [json.loads(line) for line in traces_file.read_text().splitlines()]
    return {e["task"]["data"]["id"]: trace for e in episodes for trace in e["traces"]}


def total_reward(trace: dict) -> float:
    return sum(r["score"] * r["weight"] for r in trace["rewards"].values())


def test_vf_eval_plays_a_right_and_a_wrong_episode(scripted_model, problems, tmp_path):
    base_url, requests = scripted_model
    traces = vf_eval(base_url, problems, tmp_path / "out", "--env.taskset.env.max-observation-tokens", "64",
                     "--env.taskset.env.error-format", "last_line")
    assert set(traces) == {"right", "wrong", "shown"}
    for trace in traces.values():
        assert not trace.get("errors"), trace.get("errors")
    rewards = {k: total_reward(t) for k, t in traces.items()}
    assert rewards == {"right": 1.0, "wrong": pytest.approx(-0.9), "shown": 1.0}
    assert traces["right"]["info"]["retool_num_tool_calls"] == 2 and traces["right"]["info"]["correct"] is True
    assert traces["wrong"]["info"]["retool_num_tool_calls"] == 1 and traces["wrong"]["info"]["pred"] == "4"

    def tool_messages(question: str, turn: int) -> list[str]:
        (body,) = [b for b in requests if question in b["messages"][0]["content"]
                   and sum(m["role"] == "assistant" for m in b["messages"]) == turn]
        return [m["content"] for m in body["messages"] if m["role"] == "tool"]

    assert len(requests) == 8 and all(b["tools"][0]["function"]["name"] == "execute_python" for b in requests)
    # tool output in the next model input; the right episode's `x` lives in its own session only
    assert tool_messages("123 * 456", 2) == ["(no output)", "56088\n"]
    wrong_outputs = tool_messages("7 * 8", 2)
    assert wrong_outputs[0].startswith("Error: the arguments must be a JSON object")
    assert wrong_outputs[1] == "\\boxed{56} 4\n"
    # as ToolEnvironment shows them (ToolRunner): clipped by tokens, head and tail kept; a failure's last line
    long, failed = tool_messages("2 + 2", 1)
    head, _, tail = long.partition("tokens omitted")
    assert head.startswith("0 1 2 3") and tail.rstrip().endswith("2998 2999") and len(long) < 400
    assert failed == "ZeroDivisionError: division by zero"


def test_a_turn_cap_ends_the_episode_unanswered(scripted_model, problems, tmp_path):
    """verifiers refuses the turn past `max_turns`: the harness ends the rollout cleanly, graded on what it said."""
    base_url, requests = scripted_model
    traces = vf_eval(base_url, problems, tmp_path / "out", "--env.agent.max-turns", "1", "--select.limit", "1")
    (trace,) = traces.values()
    assert not trace.get("errors"), trace.get("errors")
    assert total_reward(trace) == pytest.approx(-0.9) and trace["info"]["correct"] is False
    assert trace["info"]["retool_num_tool_calls"] == 1 and len(requests) == 1
