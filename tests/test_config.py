"""`EnvConfig` is the one declaration of the environment's settings: scripts take its fields, never re-declare them."""

from __future__ import annotations

import argparse
import ast
from dataclasses import fields
from pathlib import Path

import pytest

from retool_env.config import EnvConfig

ROOT = Path(__file__).resolve().parent.parent
ENV_FIELDS = {f.name for f in fields(EnvConfig)}


def declared_settings(path: Path) -> set[str]:
    """Names a script declares itself: fields of its dataclasses and argparse flags."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            names |= {item.target.id for item in node.body
                      if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            names |= {arg.value.lstrip("-").replace("-", "_") for arg in node.args
                      if isinstance(arg, ast.Constant) and isinstance(arg.value, str)}
    return names


SCRIPTS = sorted([*ROOT.glob("training/*.py"), *ROOT.glob("adapters/**/*.py")])


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_script_redeclares_an_environment_field(path):
    assert not declared_settings(path) & ENV_FIELDS, f"{path.name} re-declares EnvConfig fields: take EnvConfig's"


def test_the_check_finds_a_redeclared_field(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("class Args:\n    max_tool_calls: int = 3\nparser.add_argument('--tool-timeout')\n")
    assert declared_settings(script) & ENV_FIELDS == {"max_tool_calls", "tool_timeout"}


def test_with_defaults_changes_defaults_not_declarations():
    sft = EnvConfig.with_defaults(max_completion_tokens=16384, taken_elsewhere=["chat_template_kwargs"])
    config = sft(max_tool_calls=2)
    assert (config.max_completion_tokens, config.max_tool_calls) == (16384, 2) and isinstance(config, EnvConfig)
    assert {f.name: f.metadata for f in fields(sft)} == {f.name: f.metadata for f in fields(EnvConfig)}  # same help
    with pytest.raises(TypeError):
        sft(chat_template_kwargs={"enable_thinking": False})  # another dataclass of the script declares it
    with pytest.raises(TypeError, match="no field"):
        EnvConfig.with_defaults(max_tool_call=2)


def test_with_defaults_and_flags_after_a_parser_resolved_the_annotations():
    """TRL's parser replaces each Field's `type` by the type object, on the Field objects subclasses share: a script
    imported after another one built its parser must still get its variant and its flags."""
    from typing import get_type_hints

    from trl import TrlParser

    before = {f.name: f.type for f in fields(EnvConfig)}
    try:
        TrlParser((EnvConfig.with_defaults(max_completion_tokens=64),))
        assert fields(EnvConfig)[0].type is not before[fields(EnvConfig)[0].name]  # what the parser does
        later = EnvConfig.with_defaults(max_completion_tokens=16384, max_model_len=None)
        assert get_type_hints(later)["max_completion_tokens"] is int
        parser = argparse.ArgumentParser()
        EnvConfig.add_arguments(parser)
        assert parser.parse_args(["--max-tool-calls", "3"]).max_tool_calls == 3
    finally:
        for f in fields(EnvConfig):
            f.type = before[f.name]


def test_argparse_flags_read_back_as_the_config():
    parser = argparse.ArgumentParser()
    EnvConfig.add_arguments(parser, tool_format="hermes")
    args = parser.parse_args(["--max-completion-tokens", "128", "--stateful", "true", "--reward-kwargs",
                              '{"tool_call_cost": 0.05}', "--max-model-len", "300"])
    config = EnvConfig.from_settings(args)
    assert config == EnvConfig(tool_format="hermes", max_completion_tokens=128, stateful=True, max_model_len=300,
                               reward_kwargs={"tool_call_cost": 0.05})
    assert EnvConfig.from_settings(parser.parse_args([])) == EnvConfig(tool_format="hermes")


LOWER_LAYER_FORBIDS = ("retool_adapters", "adapters", "training", "torch", "trl", "vllm")


def test_retool_env_imports_no_higher_layer():
    """The environment package is the bottom layer: no import (lazy ones included) of the adapters, the training
    scripts, or torch, TRL and vLLM, which live above it."""
    found = []
    for path in sorted((ROOT / "retool_env").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in names
                      if name.split(".")[0] in LOWER_LAYER_FORBIDS]
    assert not found, found
