"""The miniature main job (training/miniature.py --smoke): every stage runs end to end and writes a sane run folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("before_sft", "after_sft", "after_rl")


@pytest.mark.slow
def test_miniature_smoke_writes_run_folder(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "training/miniature.py", "--smoke", "--out", str(out)], cwd=ROOT, env=env,
                   check=True, timeout=600)

    for name in ("metrics.jsonl", "report.md", "summary.json", "accuracy.png", "code_use.png", "rl_curves.png"):
        assert (out / name).stat().st_size > 0, name

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["event"] == "eval"]
    assert {(r["arm"], r["stage"]) for r in evals} == {(arm, s) for arm in ("tool", "text") for s in STAGES}
    for record in evals:
        levels = record["levels"]
        assert {"easy", "multiply", "modpow", "digitsum", "compose", "all", "hard"} <= set(levels)
        for row in levels.values():
            assert 0.0 <= row["accuracy"] <= 1.0
            assert row["code_use"] is None or 0.0 <= row["code_use"] <= 1.0
        if record["arm"] == "text":  # no interpreter: no episode of the text arm ever runs code
            assert not levels["all"]["code_use"]
    steps = [r for r in records if r["event"] == "rl_step"]
    assert {r["arm"] for r in steps} == {"tool", "text"}
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["turns"] >= 1 for r in steps)
    assert records[-1]["event"] == "done"

    # The cold start of the tool arm holds all three kinds of solution; the text arm's only tool-free ones.
    kinds = {r["arm"]: r["kinds"] for r in records if r["event"] == "coldstart"}
    assert set(kinds["tool"]) == {"text", "code", "self_correct"} and set(kinds["text"]) == {"text"}
    rows = [json.loads(line) for line in (out / "seed0" / "tool" / "coldstart.jsonl").read_text().splitlines()]
    fixed = [r["messages"][1]["content"] for r in rows if "Fix the typo." in r["messages"][1]["content"]]
    assert fixed and all("Error" in text for text in fixed)  # the interpreter's real error precedes every fix

    report = (out / "report.md").read_text()
    assert "## Arm `tool`" in report and "## Arm `text`" in report and "## Targets" in report
    for arm in ("tool", "text"):
        assert (out / "seed0" / arm / "grpo" / "trainer_state.json").exists()
