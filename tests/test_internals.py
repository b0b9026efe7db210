"""Other libraries' internals that the step path uses (retool_env.internals): a Python, jinja2 or transformers release
that changes their shape fails here, by name, rather than slowing the step silently; and each fallback gives the same
result."""

from __future__ import annotations

import asyncio
import json
import sys

import jinja2
import jinja2.utils
import pytest
import transformers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers.utils import chat_template_utils

from retool_env.chat_render import ChatRenderer
from retool_env.internals import asyncio_loop, jinja_sandbox, transformers_chat

TEMPLATE = ("{% macro show(m) %}{{ m.role }}: {{ m.content.strip() }}{% endmacro %}"
            "{% for m in messages %}{{ show(m) }}|{{ '{}!'.format(loop.index0) }}\n{% endfor %}{{ tools | tojson }}")
MESSAGES = [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "4"}]
TOOLS = [{"name": "code_interpreter"}]


def test_the_installed_python_jinja2_and_transformers_are_the_ones_checked_and_have_the_shape_read():
    python = ".".join(map(str, sys.version_info[:2]))
    assert python == asyncio_loop.CHECKED_PYTHON, (
        f"Python {python}: check retool_env/internals/asyncio_loop.py against it, then update CHECKED_PYTHON")
    assert jinja2.__version__ == jinja_sandbox.CHECKED_JINJA2_VERSION, (
        f"jinja2 {jinja2.__version__}: check retool_env/internals/jinja_sandbox.py against it, then update "
        "CHECKED_JINJA2_VERSION")
    assert transformers.__version__ == transformers_chat.CHECKED_TRANSFORMERS_VERSION, (
        f"transformers {transformers.__version__}: check retool_env/internals/transformers_chat.py against it, then "
        "update CHECKED_TRANSFORMERS_VERSION")
    assert asyncio_loop.shape_changes() == []
    assert jinja_sandbox.shape_changes() == []
    assert transformers_chat.shape_changes() == []


def test_a_changed_library_is_named_by_what_changed(monkeypatch):
    monkeypatch.delattr(jinja2.utils, "_PassArg")
    changes = jinja_sandbox.shape_changes()
    assert len(changes) == 2 and all("_PassArg" in change or "Macro.__call__" in change for change in changes)
    monkeypatch.delattr(asyncio.Handle, "_run")
    assert [change.split(": ", 1)[1] for change in asyncio_loop.shape_changes()] == [
        "the ready queue holds asyncio.Handle objects with _run()"]


def test_a_changed_transformers_is_named_by_what_changed(monkeypatch):
    monkeypatch.delattr(chat_template_utils, "_alias_reasoning_fields")
    monkeypatch.setattr(chat_template_utils, "_plain_template_data", lambda value, depth: value)
    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "get_chat_template", lambda self, tools: "")
    assert [change.split(": ", 1)[1] for change in transformers_chat.shape_changes()] == [
        "chat_template_utils._plain_template_data exists and takes one argument",
        "chat_template_utils._alias_reasoning_fields exists and takes one argument",
        "PreTrainedTokenizerBase.get_chat_template takes (chat_template, tools)"]


def test_chat_rendering_without_the_helpers_is_apply_chat_template(monkeypatch, tiny_tok):
    messages = [{"role": "user", "content": "What is 6 * 7?"}]
    expected = tiny_tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert ChatRenderer(tiny_tok, TOOLS).fast_render(messages) == expected
    monkeypatch.setattr(transformers_chat, "_found", [])
    # a helper renamed in transformers (its own code, which calls the new name, still works)
    monkeypatch.setattr(transformers_chat, "HELPER_NAMES", (*transformers_chat.HELPER_NAMES[:3], "_renamed_helper"))
    assert transformers_chat.chat_template_helpers() is None
    renderer = ChatRenderer(tiny_tok, TOOLS)
    assert renderer.fast_render(messages) is None
    assert renderer.render(messages) == expected


def test_run_task_without_the_internals_is_run_until_complete(monkeypatch):
    async def work() -> int:
        await asyncio.sleep(0)
        return asyncio.current_task() is not None

    loop = asyncio.new_event_loop()
    try:
        assert asyncio_loop.run_task(loop, work()) is True
        monkeypatch.setattr(asyncio_loop, "_set_running_loop", None)
        assert asyncio_loop.run_task(loop, work()) is True
    finally:
        loop.close()


@pytest.mark.parametrize("pass_arg", [True, False])
def test_the_overlay_renders_as_the_sandbox_renders(monkeypatch, pass_arg):
    """With jinja's `_PassArg` or without it (macros then called through the sandbox): the sandbox's own text."""
    if not pass_arg:
        monkeypatch.delattr(jinja2.utils, "_PassArg")
    env = ImmutableSandboxedEnvironment()
    env.filters["tojson"] = json.dumps  # as transformers' template environment has it
    compiled = env.from_string(TEMPLATE)
    expected = compiled.render(messages=MESSAGES, tools=TOOLS)
    frozen_json: dict = {id(TOOLS): (TOOLS, {})}
    overlay = jinja_sandbox.remembering_overlay(TEMPLATE, compiled, frozen_json)
    assert overlay is not compiled
    assert [overlay.render(messages=MESSAGES, tools=TOOLS) for _ in range(2)] == [expected, expected]
    assert list(frozen_json[id(TOOLS)][1].values()) == [json.dumps(TOOLS)]  # the tools' JSON, written once
    assert expected.startswith("user: hi|0!\nassistant: 4|1!\n")
