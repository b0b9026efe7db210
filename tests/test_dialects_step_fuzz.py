"""No model text makes `env.step` raise, in any dialect or template: a malformed call is answered with an
observation (or the turn is read as cut off, or as the answer), never an exception a rollout would drop.

Each tool-capable template TRL ships (the family's tokenizer, see `tests.test_dialect_parity.family_tokenizer`) and
each dialect without one (on Qwen's template) steps a well-formed call truncated at every token, with and without
the end token after it, and calls to an unknown tool, with wrong argument names and types, nested and oversized
values, several calls with one bad, and no arguments.
"""

from __future__ import annotations

import pytest

from retool_env import ToolEnvironment
from retool_env.dialects import DIALECTS, FunctionCall, get_dialect
from retool_env.formats import encode
from retool_env.offline import qwen_tokenizer
from tests.test_chat_templates import PROBLEM
from tests.test_dialect_parity import NAMES, family_tokenizer

WITH_TEMPLATE = [n for n in NAMES if not n.endswith("_training")]  # a `_training` twin differs only in history
WITHOUT_TEMPLATE = ["deepseek_v31", "kimi_k2", "mistral", "pythonic"]  # dialects no TRL template writes
CODE = "print('a\"b')\nprint(2)"


def malformed_calls(dialect: str) -> dict[str, str]:
    write = get_dialect(dialect).call_text
    tool = "code_interpreter"
    return {
        "unknown tool": write([FunctionCall("nope", {"code": "print(1)"})]),
        "wrong argument name": write([FunctionCall(tool, {"cod": "print(1)"})]),
        "wrong argument type": write([FunctionCall(tool, {"code": 5})]),
        "nested value": write([FunctionCall(tool, {"code": [[{"a": [1, {"b": None}]}]] * 3})]),
        "oversized value": write([FunctionCall(tool, {"code": "x = 1\n" * 4000})]),
        "one good one bad": write([FunctionCall(tool, {"code": "print(1)"}), FunctionCall("nope", {"x": 1})]),
        "no arguments": write([FunctionCall(tool, {})]),
        "deep nesting": write([FunctionCall(tool, {"code": "[" * 200 + "]" * 200, "x": [[[[[[[[[[]]]]]]]]]]})]),
    }


def environment(name: str) -> ToolEnvironment:
    if name in DIALECTS:
        return ToolEnvironment(qwen_tokenizer(), [PROBLEM], tool_format=name)
    return ToolEnvironment(family_tokenizer(name), [PROBLEM])  # tool_format="auto": the template's dialect


def assert_steps(env: ToolEnvironment, label: str, action: list[int]) -> None:
    env.reset(options={"problem": PROBLEM})
    try:
        obs, reward, terminated, truncated, info = env.step(action)
    except Exception as exc:  # the point: name the case that raised
        raise AssertionError(f"{label}: env.step raised {type(exc).__name__}: {exc}") from exc
    traj = env.trajectory
    assert len(traj.completion_ids) == len(traj.env_mask), label
    assert (terminated or truncated) == (len(obs) == 0), label
    if not (terminated or truncated):
        assert info["tool_results"], f"{label}: the episode goes on without an answer to the call"


@pytest.mark.filterwarnings("ignore:the chat template rewrote", "ignore:the chat template changes tool results")
@pytest.mark.parametrize("name", [*WITH_TEMPLATE, *WITHOUT_TEMPLATE])
def test_no_model_text_makes_a_step_raise(name):
    env = environment(name)
    end = env.format.turn_end_id
    full = encode(env.tokenizer, env.format.call_text(CODE))
    for k in range(len(full) + 1):
        assert_steps(env, f"truncated at token {k}", full[:k])
        assert_steps(env, f"truncated at token {k}, then the end token", [*full[:k], end])
    for label, text in malformed_calls(env.format.name).items():
        ids = encode(env.tokenizer, text)
        assert_steps(env, label, [*ids, end])
        assert_steps(env, f"{label}, no end token", ids)


@pytest.mark.filterwarnings("ignore:the chat template rewrote")
@pytest.mark.parametrize("name", ["gptoss", "glm4moe"])
def test_a_call_that_was_not_read_is_answered_where_the_template_needs_calls(name):
    """gpt-oss's template raises on a tool result after a turn without `tool_calls`, and GLM's drops the turn's
    end there: a truncated call and an unknown tool are answered with the error, as the template renders a
    result."""
    if name not in NAMES:
        pytest.skip("needs TRL's chat templates")
    env = environment(name)
    good = env.format.call_text(CODE)
    cut = good[: good.index("print") + 8]
    for text in (cut, malformed_calls(env.format.name)["unknown tool"]):
        env.reset(options={"problem": PROBLEM})
        obs, reward, terminated, truncated, info = env.step([*encode(env.tokenizer, text), env.format.turn_end_id])
        assert not (terminated or truncated)
        (result,) = info["tool_results"]
        assert result["status"] == "invalid" and result["output"].startswith("Error:")
        assert result["output"].splitlines()[0] in env.tokenizer.decode(obs.tolist()).replace('\\"', '"')
