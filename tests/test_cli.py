"""`retool-env eval` hands every argument after `eval` to training/eval.py."""

import subprocess
import sys


def test_eval_subcommand_reaches_training_eval():
    out = subprocess.run([sys.executable, "-m", "retool_env.cli", "eval", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--model" in out.stdout and "--backend" in out.stdout


def test_top_level_help_lists_the_commands():
    out = subprocess.run([sys.executable, "-m", "retool_env.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and all(cmd in out.stdout for cmd in ("sandbox", "doctor", "eval"))
