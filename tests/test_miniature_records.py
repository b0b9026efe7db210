"""A miniature run with records on (training/miniature.py --smoke --records, the tool arm only): every RL episode is
recorded, and `retool-env regrade` with the same grader reproduces the logged rewards exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from retool_env.records import read_records, regrade

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_a_smoke_run_records_every_rl_episode_and_regrade_reproduces_its_rewards(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "training/miniature.py", "--smoke", "--records", "--arms", "tool", "--out",
                    str(out)], cwd=ROOT, env=env, check=True, timeout=900)
    path = out / "seed0" / "tool" / "records.jsonl"
    records = list(read_records(path))

    # --smoke: 2 GRPO steps of 2 problems x 4 episodes, one generation batch per step; evaluation is not recorded.
    steps, prompts, generations = 2, 2, 4
    assert len(records) == steps * prompts * generations and {r["mode"] for r in records} == {"train"}
    assert sorted(r["policy_version"] for r in records) == [0] * 8 + [1] * 8
    for step in range(steps):
        batch = [r for r in records if r["policy_version"] == step]
        groups = {}
        for r in batch:
            groups.setdefault(r["group"], set()).add(r["problem_id"])
        assert len(groups) == prompts and all(len(ids) == 1 for ids in groups.values())
        assert len({r["seed"] for r in batch}) == len(batch)  # each episode under its own seed
    for r in records:
        assert len(r["env_mask"]) == len(r["completion_ids"]) and r["reward_scheme"] == "retool"

    # The same grader reproduces every reward exactly, in process and through the command line.
    report = regrade(records, "default")
    done = [r for r in records if not r["aborted"]]
    assert (report.regraded, report.verdict_changes, report.reward_mismatches,
            report.rewards_not_recomputable) == (len(done), 0, 0, 0)
    result = subprocess.run([sys.executable, "-m", "retool_env.cli", "regrade", str(path), "--json",
                             "--fail-on-disagreement"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["reward_mismatches"] == 0

    # The rewards recorded are the ones GRPO was given: TRL's logged mean reward of each step.
    history = json.loads((out / "seed0" / "tool" / "grpo" / "trainer_state.json").read_text())["log_history"]
    logged = {h["step"]: h["reward"] for h in history if "reward" in h}
    for step in range(steps):
        trained = [r["trained_reward"] for r in records if r["policy_version"] == step
                   and r["trained_reward"] is not None]
        assert logged[step + 1] == pytest.approx(sum(trained) / len(trained), abs=1e-6)
