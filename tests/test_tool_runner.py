"""`ToolRunner`: the episode rules of a tool call, as both environments apply them (budget, observation, records)."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from retool_env.config import EnvConfig
from retool_env.formats import ToolCall
from retool_env.tool_runner import EMPTY_OUTPUT, ToolRunner
from retool_env.trajectory import ToolStatus


def test_a_call_is_run_shown_and_recorded(tiny_tok):
    runner = ToolRunner(EnvConfig(max_tool_calls=2, error_format="last_line"), tiny_tok)
    ok, silent, failed, invalid = asyncio.run(runner.run_turn(
        [ToolCall("print(6 * 7)"), ToolCall("x = 1"), ToolCall("1 / 0"), ToolCall(None, "no code")], turn=3))
    assert (ok.output, ok.status, ok.turn) == ("42\n", ToolStatus.OK, 3)
    assert silent.output == EMPTY_OUTPUT
    assert failed.output == "ZeroDivisionError: division by zero"  # error_format applied to a failed call only
    assert (invalid.output, invalid.status) == ("Error: no code", ToolStatus.INVALID)
    assert runner.calls_left([ok, silent, failed, invalid]) == -1  # three ran; the invalid one never did
    assert runner.over_budget([ok], [ToolCall("1"), ToolCall(None, "bad")]) is False
    assert runner.over_budget([ok], [ToolCall("1"), ToolCall("2")]) is True
    assert runner.refused("print(1)").status == ToolStatus.SKIPPED


def test_bad_tool_settings_are_refused(tiny_tok):
    for bad, match in (({"max_tool_calls": -1}, "max_tool_calls"), ({"on_timeout": "retry"}, "on_timeout"),
                       ({"error_format": "tail"}, "error_format"), ({"max_observation_tokens": 0}, "at least 1")):
        with pytest.raises(ValueError, match=match):
            ToolRunner(EnvConfig(**bad), tiny_tok)


def test_a_runner_pickles_as_its_settings(tiny_tok):
    runner = ToolRunner(EnvConfig(), tiny_tok)
    again = pickle.loads(pickle.dumps(runner))
    assert again.sandbox is runner.sandbox and again.config == runner.config  # the process's shared sandbox
