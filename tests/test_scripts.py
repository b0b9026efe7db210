"""The scripts' command lines (`retool_adapters.scripts`): flags apply on top of the CPU smoke config, `--config`
replaces it, `--help` is short, mistakes end in one line."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retool_adapters import eval_cli
from retool_env.rollout import progress_bar
from training import grpo_trl, sft_trl

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "training" / "configs"


# A Hub that does not answer (a closed local port), whether or not this machine has a network.
NO_HUB = {**{k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")},
          "HF_ENDPOINT": "http://127.0.0.1:9"}


def run_script(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=NO_HUB)


def test_flags_apply_on_top_of_the_cpu_smoke_config():
    env_args, training_args, model_args = grpo_trl.make_parser().parse_args_and_config(["--max_steps", "2"])
    assert training_args.max_steps == 2 and training_args.use_cpu and not training_args.bf16
    assert env_args.dataset == "arith" and training_args.num_generations == 4  # the rest from grpo_tiny_cpu.yaml
    data_args, training_args, _ = sft_trl.make_parser().parse_args_and_config(["--max_steps", "1"])
    assert training_args.max_steps == 1 and training_args.use_cpu and data_args.dataset == "arith"
    model_args, data_args, env_args, output_args = eval_cli.parse_args(["--limit", "2"])
    assert (data_args.dataset, data_args.limit, data_args.n_samples, model_args.backend) == ("arith", 2, 2, "hf")


def test_config_replaces_the_default_instead_of_merging(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("dataset: aime24\nn_samples: 4\n")
    _, data_args, env_args, _ = eval_cli.parse_args(["--config", str(recipe)])
    assert (data_args.dataset, data_args.n_samples, data_args.limit) == ("aime24", 4, None)  # no limit: 10 of tiny
    assert env_args.max_completion_tokens == 4096  # EnvConfig's default, not the tiny config's 64


def test_one_tool_format_across_sft_grpo_and_eval():
    formats = {path.name: yaml.safe_load(path.read_text()).get("tool_format", "hermes")
               for path in CONFIGS.glob("*.yaml")}
    assert set(formats.values()) == {"hermes"}, formats


@pytest.mark.parametrize("script", ["training/grpo_trl.py", "training/sft_trl.py", "training/eval.py"])
def test_help_is_short_and_names_the_config(script):
    out = run_script(script, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:") and "--config FILE" in out.stdout and "tiny_cpu.yaml" in out.stdout
    assert "--help-all" in out.stdout and "--tool_format" in out.stdout and "--max_tool_calls" in out.stdout
    assert len(out.stdout.splitlines()) < 160
    if "eval" not in script:  # the trainer's fields: the most used in --help, every one in --help-all
        assert "--model_name_or_path" in out.stdout and "--max_steps" in out.stdout
        assert "--lr_scheduler_kwargs" not in out.stdout
        full = run_script(script, "--help-all")
        assert full.returncode == 0 and "--lr_scheduler_kwargs" in full.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--config", "missing.yaml"], "--config missing.yaml: no such file"),
    (["--max_stepz", "3"], "['--max_stepz', '3']"),
    (["--n_samples", "many"], "invalid int value: 'many'"),
    (["--backend", "openai", "--model", "m", "--dataset", "arith"], "--backend openai needs --base_url"),
    (["--model", "Qwen/Qwen3-4B", "--dataset", "arith"], "hf download Qwen/Qwen3-4B"),
    (["--dataset", "no/such-file.parquet"], "no/such-file.parquet"),
])
def test_command_line_mistakes_are_one_line(args, message, tmp_path):
    out = run_script("training/eval.py", *args, "--out", str(tmp_path))
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if "Warning" not in line and not line.startswith("  ")]
    assert len(lines) == 1 and lines[0].startswith("retool-env eval: error: ") and message in lines[0], out.stderr


def test_an_unreachable_hub_fails_at_once_naming_the_argument(tmp_path):
    code = ("import time, gymnasium as gym, retool_env\nfrom retool_env.offline import tiny_tokenizer\n"
            "start = time.perf_counter()\n"
            "try:\n    gym.make('ReTool-Math-v0', tokenizer=tiny_tokenizer())\n"
            "except retool_env.data.DatasetUnavailableError as exc:\n    print(exc)\n"
            "print(f'{time.perf_counter() - start:.1f} s')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**NO_HUB, "HF_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    message, seconds = out.stdout.strip().splitlines()
    assert "dataset='path/to/dapo-math-17k.parquet'" in message and float(seconds.split()[0]) < 10


def test_progress_in_a_log_file_is_short_lines():
    log = io.StringIO()
    sys_stderr, sys.stderr = sys.stderr, log  # not a terminal
    try:
        bar = progress_bar(1000, "episodes")
        for _ in range(1000):
            bar.update(1)
        bar.close()
    finally:
        sys.stderr = sys_stderr
    lines = log.getvalue().splitlines()
    assert 1 <= len(lines) <= 5 and "\r" not in log.getvalue() and lines[-1].startswith("episodes: 100%")
    assert max(map(len, lines)) <= 100


SETUP_SCRIPTS = sorted((ROOT / "scripts").glob("setup*.sh"))


def bootstrap(venv: Path) -> subprocess.CompletedProcess:
    """`venv_bootstrap` of scripts/install.sh on `venv`, with the real uv linked in (so no index is needed)."""
    (venv / "bin" / "uv").symlink_to(Path(sys.executable).with_name("uv"))
    return subprocess.run(["bash", "-euc", 'source scripts/install.sh; venv_bootstrap "$1"', "_", str(venv)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_setup_repairs_a_venv_that_an_interrupted_venv_creation_left_without_pip(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True)  # Ctrl-C before ensurepip
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "installed_before.py").write_text("")
    out = bootstrap(venv)
    assert out.returncode == 0, out.stderr
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import pip, installed_before"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr  # pip back, and what was installed kept


@pytest.mark.parametrize("script", SETUP_SCRIPTS, ids=lambda p: p.name)
def test_every_setup_script_bootstraps_its_venv_before_installing(script):
    lines = [line.split("#")[0] for line in script.read_text().splitlines()]
    uses = [i for i, line in enumerate(lines) if "venv_install" in line or "pip install" in line]
    bootstraps = [i for i, line in enumerate(lines) if "venv_bootstrap" in line]
    assert "source scripts/install.sh" in lines and bootstraps and uses and bootstraps[0] < uses[0]
    assert not any("python3 -m venv" in line for line in lines)  # venv_bootstrap creates and repairs it
