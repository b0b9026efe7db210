"""`error_format` and `on_timeout`: what the model is shown of a failed call, and whether a timeout ends the
episode. The real environment, sandbox and grader, with the tiny tokenizer."""

from __future__ import annotations

import pytest

from retool_env.data import Problem
from retool_env.env import ToolEnvironment
from retool_env.tool_runner import format_error, parse_error_format

PROBLEM = Problem(question="What is 6 times 7?", answer="42", id="six-sevens")


def call(code: str) -> str:
    return '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "' + code + '"}}\n</tool_call>'


def step(env, tok, text):
    return env.step(tok.encode(text, add_special_tokens=False) + [env.format.end_token_ids[0]])


def first_output(tok, code: str, **config) -> str:
    env = ToolEnvironment(tok, [PROBLEM], **config)
    env.reset(options={"problem": PROBLEM})
    step(env, tok, call(code))
    output = env.trajectory.tool_calls[0].output
    env.close()
    return output


def test_error_format_cuts_what_a_failed_call_shows(tiny_tok):
    full = first_output(tiny_tok, "print(1)\\n1 / 0")
    assert "Traceback" in full and full.rstrip().endswith("ZeroDivisionError: division by zero")
    assert first_output(tiny_tok, "print(1)\\n1 / 0", error_format="last_line") == "ZeroDivisionError: division by zero"
    long = first_output(tiny_tok, "raise ValueError('x' * 2000)", error_format="last_line",
                        max_observation_tokens=4096)
    assert long.startswith("ValueError: xxx") and len(long) == 400  # the ReTool evaluation's cut
    head_tail = first_output(tiny_tok, "print('a' * 500)\\n1 / 0", error_format="head_tail:60",
                             max_observation_tokens=4096)
    assert head_tail.startswith("a" * 30) and head_tail.endswith("division by zero"[-30:]) and "\n...\n" in head_tail
    assert len(head_tail) == 60 + len("\n...\n")
    assert first_output(tiny_tok, "print(6 * 7)", error_format="last_line") == "42\n"  # a clean call is untouched


def test_error_format_is_validated():
    assert parse_error_format("full") == ("full", 0) and parse_error_format("head_tail:8") == ("head_tail", 8)
    for bad in ("last", "head_tail", "head_tail:x", "head_tail:1", "full:3"):
        with pytest.raises(ValueError, match="error_format"):
            parse_error_format(bad)
    assert format_error("", ("last_line", 400)) == "" and format_error("short", ("head_tail", 10)) == "short"


def test_on_timeout_abort_ends_the_episode_and_feedback_goes_on(tiny_tok):
    slow = "while True: pass"
    env = ToolEnvironment(tiny_tok, [PROBLEM], tool_timeout=0.5, on_timeout="abort")
    env.reset(options={"problem": PROBLEM})
    _, reward, terminated, truncated, info = step(env, tiny_tok, call(slow))
    traj = env.trajectory
    assert truncated and not terminated and traj.finish_reason == "tool_timeout" and traj.truncated
    assert [c.status for c in traj.tool_calls] == ["timeout"] and reward == -0.9  # wrong, one tool round
    assert traj.graded_text == "" and traj.pred is None
    env.close()
    env = ToolEnvironment(tiny_tok, [PROBLEM], tool_timeout=0.5)
    env.reset(options={"problem": PROBLEM})
    _, _, terminated, truncated, _ = step(env, tiny_tok, call(slow))
    assert not terminated and not truncated and "imeout" in env.trajectory.tool_calls[0].output
    _, reward, terminated, _, _ = step(env, tiny_tok, "\\boxed{42}")
    assert terminated and reward == 1.0
    env.close()
    with pytest.raises(ValueError, match="on_timeout"):
        ToolEnvironment(tiny_tok, [PROBLEM], on_timeout="retry")
