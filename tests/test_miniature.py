"""The miniature main job (training/miniature.py --smoke): every stage runs end to end and writes a sane run folder,
and its episode records (--records) regrade to the logged rewards."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retool_env.faults import FAULT_MESSAGE
from retool_env.records import read_records, regrade

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("before_sft", "after_sft", "after_rl")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def smoke_command(out: Path, *flags: str) -> list[str]:
    """The smoke config (tiny: a few SFT and GRPO steps) of the defaults, injected faults and three calls
    included, so the recovery path runs."""
    return [sys.executable, "training/miniature.py", "--smoke", *flags, "--out", str(out)]


def run_smoke(out: Path, *flags: str) -> Path:
    """`smoke_command` with every RL episode recorded, run into `out`, where a checkpoint left by an earlier run must
    not be evaluated."""
    (out / "seed0" / "tool" / "grpo" / "checkpoint-0").mkdir(parents=True)
    subprocess.run(smoke_command(out, "--records", *flags), cwd=ROOT, env=ENV, check=True, timeout=600)
    return out


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    """One smoke run, arms side by side and evaluations in a process beside each arm's training, shared by the tests
    that read it."""
    return run_smoke(tmp_path_factory.mktemp("miniature") / "run", "--eval_processes", "1")


@pytest.mark.slow
@pytest.mark.timeout(600)  # the one smoke run the slow tests here share: about 70 s on 2 cores at load 3
def test_miniature_smoke_writes_run_folder(smoke_run):
    out, env = smoke_run, ENV

    for name in ("metrics.jsonl", "report.md", "summary.json", "accuracy.png", "code_use.png", "rl_curves.png",
                 "heldout.png", "self_correction.png"):
        assert (out / name).stat().st_size > 0, name

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["event"] == "eval"]
    # Smoke: 2 GRPO steps, a checkpoint every step; the one before the last step is evaluated on held-out problems.
    assert {(r["arm"], r["stage"]) for r in evals} == {(arm, s) for arm in ("tool", "text")
                                                       for s in (*STAGES, "rl_step1")}
    assert {(r["arm"], r["step"]) for r in evals if r["stage"] == "rl_step1"} == {("tool", 1), ("text", 1)}
    for record in evals:
        levels = record["levels"]
        assert {"easy", "multiply", "modpow", "digitsum", "compose", "all", "hard"} <= set(levels)
        for row in levels.values():
            assert 0.0 <= row["accuracy"] <= 1.0
            assert row["code_use"] is None or 0.0 <= row["code_use"] <= 1.0
            correction = row["self_correction"]  # every level, `hard` pooled from the hard levels' counts
            assert correction["responses_with_failure"] >= correction["recovered"] >= 0
        if record["arm"] == "text":  # no interpreter: no episode of the text arm ever runs code
            assert not levels["all"]["code_use"]
    steps = [r for r in records if r["event"] == "rl_step"]
    assert {r["arm"] for r in steps} == {"tool", "text"}
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["turns"] >= 1 for r in steps)
    assert records[-1]["event"] == "done"
    assert (out / "seed0.json").exists()  # the seed's summary, written as it finished

    # The cold start of the tool arm holds every kind of solution; the text arm's only tool-free ones.
    kinds = {r["arm"]: r["kinds"] for r in records if r["event"] == "coldstart"}
    assert set(kinds["tool"]) == {"text", "code", "self_correct", "retry", "retry_again", "give_up"}
    assert set(kinds["text"]) == {"text"}
    # The tool arm's copy drills are code solutions, some refused and retried as the task's are; never the text arm's.
    drilled = {r["arm"]: r["copy_drills"] for r in records if r["event"] == "coldstart"}
    assert drilled == {"tool": 24, "text": 0}
    rows = [json.loads(line) for line in (out / "seed0" / "tool" / "coldstart.jsonl").read_text().splitlines()]
    drill_rows = [r["messages"][1]["content"] for r in rows if r["id"].startswith("mini-drill-")]
    assert len(drill_rows) == 24 and all("<code>" in text for text in drill_rows)
    assert any(FAULT_MESSAGE in text for text in drill_rows)
    fixed = [r["messages"][1]["content"] for r in rows if "Fix the typo." in r["messages"][1]["content"]]
    assert fixed and all("Error" in text for text in fixed)  # the interpreter's real error precedes every fix
    retried = [r["messages"][1]["content"] for r in rows if "Retry." in r["messages"][1]["content"]]
    assert retried and all(text.index(FAULT_MESSAGE) < text.index("Retry.") for text in retried)  # refused, then
    for text in retried:  # the same call again, once or (refused again) twice: a copy of the block above
        blocks = re.findall(r"<code>(.*?)</code>", text, re.DOTALL)
        assert len(blocks) in (2, 3) and len(set(blocks)) == 1 and text.count(FAULT_MESSAGE) == len(blocks) - 1
    assert {text.count("<code>") for text in retried} == {2, 3}
    # Faults are injected in GRPO and evaluation, not in the replay of the cold start (its refusals are recorded).
    grpo_config = yaml.safe_load((out / "seed0" / "tool" / "grpo.yaml").read_text())
    assert (grpo_config["fault_rate"], grpo_config["max_tool_calls"]) == (0.2, 3)  # a retry refused again recovers
    assert yaml.safe_load((out / "seed0" / "tool" / "sft.yaml").read_text())["fault_rate"] == 0.0
    for record in evals:  # recovery from refused calls, per level (a smoke model rarely calls: counts may be 0)
        for row in record["levels"].values():
            faults = row["fault_recovery"]
            assert faults["responses_with_fault"] >= max(faults["recovered"], faults["retried"]) >= 0
    # The text arm's cold start is the tool arm's direct answers, trained for as many SFT steps.
    text_rows = [json.loads(line) for line in (out / "seed0" / "text" / "coldstart.jsonl").read_text().splitlines()]
    assert text_rows == [r for r in rows if "<code>" not in r["messages"][1]["content"]]
    sft_steps = {arm: yaml.safe_load((out / "seed0" / arm / "sft.yaml").read_text())["max_steps"]
                 for arm in ("tool", "text")}
    assert sft_steps["tool"] == sft_steps["text"] > 0
    # The stages run as configured: no gradient checkpointing in SFT, GRPO advantages scaled by the batch, and a
    # model whose query heads each have their own keys and values.
    assert yaml.safe_load((out / "seed0" / "tool" / "sft.yaml").read_text())["gradient_checkpointing"] is False
    assert yaml.safe_load((out / "seed0" / "tool" / "grpo.yaml").read_text())["scale_rewards"] == "batch"
    model_config = json.loads((out / "seed0" / "model-init" / "config.json").read_text())
    assert model_config["num_key_value_heads"] == model_config["num_attention_heads"] == 2

    summary = json.loads((out / "summary.json").read_text())
    for arm in ("tool", "text"):  # the held-out curve: after SFT (step 0), the checkpoint, after RL
        assert [p["step"] for p in summary["results"][0]["heldout"][arm]] == [0, 1, 2]

    report = (out / "report.md").read_text()
    assert "## Arm `tool`" in report and "## Arm `text`" in report and "## Targets" in report
    assert "## Held-out evaluation during RL" in report
    assert "## Self-correction\n" in report and "Over seeds" in report
    assert "recovered rate after an injected fault" in report
    assert "On recoverable failures" in report and "On every failed call" in report
    # Each gain with its standard error beside it, judged against twice that error.
    assert re.search(r"\| all: accuracy RL - SFT > 2 SE \| [+-]\d\.\d\d ± \d\.\d\d (met|not met) \|", report)
    assert "| hard: recovered after an injected fault, RL - SFT > 2 SE |" in report
    for arm in ("tool", "text"):
        assert (out / "seed0" / arm / "grpo" / "trainer_state.json").exists()
    records_reproduce_the_logged_rewards(out, env)


def records_reproduce_the_logged_rewards(out, env):
    """--records: every RL episode of the tool arm is recorded, and `retool-env regrade` with the same grader
    reproduces the logged rewards exactly, in process and through the command line."""
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


def comparable(path: Path) -> list[dict]:
    """A run's metrics.jsonl without what may differ between two runs of one command: times and the run folder."""
    records = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        record.pop("time_s")
        for key in ("eval_seconds", "train_seconds", "out", "parallel_arms", "eval_processes", "wall_seconds"):
            record.pop(key, None)
        records.append(record)
    return records


@pytest.mark.slow
@pytest.mark.timeout(600)  # one arm of the smoke config again, one process: about 35 s at load 3
def test_an_arm_beside_another_and_its_evaluations_gives_the_metrics_of_the_arm_alone(smoke_run, tmp_path):
    """Determinism: the tool arm run alone, its evaluations in its own process one after the other, writes every
    record the shared run wrote for it (arms side by side, evaluations beside the training), in the same order."""
    alone = run_smoke(tmp_path / "run", "--arms", "tool", "--no_parallel_arms", "--eval_processes", "0")
    side, one = ([r for r in comparable(run / "metrics.jsonl") if r.get("arm") == "tool"] for run in (smoke_run, alone))
    assert [r["event"] for r in side].count("eval") == 4  # before and after SFT, the checkpoint, after RL
    assert side == one
    records = [json.loads(line) for line in (smoke_run / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["parallel_arms"] is True
    text_starts = next(r["time_s"] for r in records if r.get("arm") == "text")  # its cold start
    tool_ends = next(r["time_s"] for r in records if r.get("arm") == "tool" and r.get("stage") == "after_rl")
    assert text_starts < tool_ends  # side by side, each record keeping the time it was made at


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_seed_list_reuses_finished_seeds_and_writes_one_combined_report(smoke_run, tmp_path):
    """`--seed_list` over seeds whose summaries (`seed<k>.json`) a run with the same settings left in `--out` trains
    nothing and builds the combined report from those files. The files are the smoke run's seed 0, relabelled."""
    out = tmp_path / "run"
    out.mkdir()
    finished = json.loads((smoke_run / "seed0.json").read_text())
    assert (smoke_run / "seed0.json").stat().st_size < 100_000  # a small file to keep
    for seed in (3, 1):
        relabelled = {**finished, "seed": seed, "result": {**finished["result"], "seed": seed}}
        (out / f"seed{seed}.json").write_text(json.dumps(relabelled))
    subprocess.run(smoke_command(out, "--seed_list", "3", "1"), cwd=ROOT, env=ENV, check=True, timeout=300)
    events = [json.loads(line)["event"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert events == ["config", "done"]  # nothing trained or evaluated
    config = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert config["seed_list"] == [3, 1] and not (out / "seed3").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert [r["seed"] for r in summary["results"]] == [3, 1] and len(summary["criteria"]) == 2
    assert summary["wall_seconds"] == 2 * finished["wall_seconds"]  # the seeds' own times
    report = (out / "report.md").read_text()
    assert "| target | seed 3 | seed 1 |" in report  # the targets per seed, side by side
    assert "| target | mean | sd | worst seed | seeds met |" in report  # and over the seeds


def miniature_script():
    from training import miniature_report

    return miniature_report


def heldout(points):
    return [{"step": step, "levels": {"all": {"accuracy": acc}}} for step, acc in points]


def test_stability_is_the_final_shortfall_from_the_best_of_the_last_30_steps():
    drop_over_last = miniature_script().drop_over_last
    # The dip at step 40 recovers; the best of steps 30..60 is 0.9 and the run ends at 0.87.
    assert drop_over_last(heldout([(0, 0.5), (30, 0.9), (40, 0.7), (50, 0.88), (60, 0.87)])) == pytest.approx(0.03)
    # A peak before the window does not count; a run ending at its best drops nothing.
    assert drop_over_last(heldout([(0, 0.99), (20, 0.6), (40, 0.8), (60, 0.8)])) == pytest.approx(0.0)
    assert drop_over_last(heldout([(0, 0.5), (10, 0.6), (20, 0.7)])) is None  # shorter than the window


def test_criteria_judge_one_seed_against_the_issue_targets():
    criteria = miniature_script().criteria

    def rows(acc, code, with_tool, hard_acc, hard_code, easy_acc, easy_code, recovered=None, stderr=0.02):
        return {"all": {"accuracy": acc, "accuracy_stderr": stderr, "accuracy_with_tool": with_tool,
                        "accuracy_with_tool_stderr": stderr},
                "hard": {"accuracy": hard_acc, "code_use": hard_code, "fault_recovery": recovered,
                         "self_correction": correction(10, 0)},  # every failed call: not the target
                "easy": {"accuracy": easy_acc, "code_use": easy_code}}

    result = {"tool": {"after_sft": rows(0.5, 0.6, 0.7, 0.4, 0.6, 0.9, 0.3, faults(40, 10)),
                       "after_rl": rows(0.93, 0.8, 0.92, 0.92, 0.99, 0.97, 0.05, faults(100, 80))},
              "text": {"after_sft": rows(0.05, 0.0, None, 0.0, 0.0, 0.2, 0.0),
                       "after_rl": rows(0.06, 0.0, None, 0.01, 0.0, 0.25, 0.0)},
              "heldout": {"tool": heldout([(0, 0.5), (30, 0.9), (60, 0.93)])}}
    verdicts = {name: (value, met, stderr) for name, value, met, stderr in criteria(result)}
    assert all(met for _, met, _ in verdicts.values()), verdicts
    assert verdicts[ALL][0] == pytest.approx(0.43) and verdicts[ALL][2] == pytest.approx(math.hypot(0.02, 0.02))
    assert verdicts[RECOVERY][0] == pytest.approx(0.8 - 0.25)
    assert verdicts[RECOVERY][2] == pytest.approx(math.hypot(math.sqrt(0.25 * 0.75 / 40), math.sqrt(0.8 * 0.2 / 100)))
    assert verdicts["hard: accuracy after RL >= 0.90"][2] is None  # an absolute target has no error to print

    result["tool"]["after_rl"]["easy"]["code_use"] = 0.9  # "always call": not strategic
    result["text"]["after_rl"]["easy"]["accuracy"] = 0.0
    failed = {name for name, _, met, _ in criteria(result) if not met}
    assert failed == {"easy: code use after RL <= 0.30", "easy: text RL accuracy > 0"}

    # A gain is met when above two standard errors (here 2 x hypot(0.02, 0.02) = 0.057), however strong the cold start.
    result["tool"]["after_rl"]["all"]["accuracy"] = result["tool"]["after_sft"]["all"]["accuracy"] + 0.05
    assert {name: met for name, _, met, _ in criteria(result)}[ALL] is False  # 0.05 < 2 x 0.028
    result["tool"]["after_rl"]["all"]["accuracy"] += 0.01
    assert {name: met for name, _, met, _ in criteria(result)}[ALL] is True  # 0.06 > 2 x 0.028

    result["tool"]["after_sft"]["hard"]["fault_recovery"] = faults(0, 0)  # no fault after SFT (fault_rate 0): unknown
    assert (RECOVERY, None, None, None) in criteria(result)


ALL = "all: accuracy RL - SFT > 2 SE"
RECOVERY = "hard: recovered after an injected fault, RL - SFT > 2 SE"


def faults(faulted, recovered, retried=None):
    """`fault_recovery` of an evaluation with these counts."""
    return miniature_script().fault_rates({"responses_with_fault": faulted, "recovered": recovered,
                                           "retried": faulted if retried is None else retried})


def correction(failing, recovered, followed=0, fixed=0):
    """`self_correction` of an evaluation with these counts."""
    from retool_env.evaluation import correction_rates

    return correction_rates({"responses_with_failure": failing, "recovered": recovered, "failures_followed": followed,
                             "fixed": fixed, "failed_calls": failing + followed, "wrong_output_calls": 0})


def test_hard_row_pools_levels_by_problem_count_with_its_standard_error():
    level_rows = miniature_script().level_rows

    def summary(acc, stderr, problems, code=1.0, failing=(0, 0)):
        return {"mean@4": acc, "mean@4_stderr": stderr, "num_problems": problems, "mean_completion_tokens": 30.0,
                "tools": {"code_ratio": code, "accuracy_with_tool": acc}, "self_correction": correction(*failing)}

    metrics = {"n_samples": 4, **summary(0.7, 0.03, 60, 0.8),
               "by_level": {"easy": summary(1.0, 0.0, 20, 0.0), "multiply": summary(0.9, 0.04, 10),
                            "digitsum": summary(0.5, 0.06, 30)}}
    rows = level_rows(metrics)
    assert rows["hard"]["accuracy"] == pytest.approx((0.9 * 10 + 0.5 * 30) / 40)
    assert rows["hard"]["accuracy_stderr"] == pytest.approx(((10 / 40 * 0.04) ** 2 + (30 / 40 * 0.06) ** 2) ** 0.5)
    assert rows["hard"]["code_use"] == 1.0 and rows["all"]["accuracy_stderr"] == 0.03
    metrics["by_level"]["multiply"]["mean@4_stderr"] = None  # one problem: its spread is unknown, so is the pool's
    assert level_rows(metrics)["hard"]["accuracy_stderr"] is None


def test_hard_row_pools_self_correction_counts_not_rates():
    level_rows = miniature_script().level_rows

    def summary(failing, recovered, followed, fixed):
        return {"mean@4": 0.5, "mean@4_stderr": 0.1, "num_problems": 10, "mean_completion_tokens": 30.0,
                "tools": {"code_ratio": 1.0, "accuracy_with_tool": 0.5},
                "self_correction": correction(failing, recovered, followed, fixed)}

    # multiply: 1 of 2 failing responses recovered; digitsum: 7 of 8. Averaging rates would give 0.69.
    metrics = {"n_samples": 4, **summary(10, 8, 6, 3),
               "by_level": {"easy": summary(0, 0, 0, 0), "multiply": summary(2, 1, 2, 0),
                            "digitsum": summary(8, 7, 4, 3)}}
    hard = level_rows(metrics)["hard"]["self_correction"]
    assert hard["responses_with_failure"] == 10 and hard["recovered_rate"] == pytest.approx(0.8)
    assert hard["recovered_rate_stderr"] == pytest.approx(math.sqrt(0.8 * 0.2 / 10))
    assert hard["fixed_rate"] == pytest.approx(3 / 6)
    del metrics["by_level"]["multiply"]["self_correction"]  # metrics from before self-correction was measured
    assert level_rows(metrics)["hard"]["self_correction"] is None


def test_seed_summary_gives_mean_spread_worst_seed_and_seeds_met():
    report = miniature_script()

    def result(seed, hard_code, easy_code, sft_recovered):
        rows = {"all": {"accuracy": 0.9, "accuracy_with_tool": 0.9},
                "hard": {"accuracy": 0.95, "code_use": hard_code, "fault_recovery": faults(10, 9)},
                "easy": {"accuracy": 0.95, "code_use": easy_code}}
        sft = {**rows, "all": {"accuracy": 0.1, "accuracy_with_tool": 0.1},
               "hard": {**rows["hard"], "fault_recovery": faults(*sft_recovered)}}
        return {"seed": seed, "tool": {"after_sft": sft, "after_rl": rows}, "heldout": {}}

    results = [result(3, 0.99, 0.1, (10, 5)), result(4, 0.90, 0.4, (10, 9)), result(5, 0.97, 0.2, (0, 0))]
    summary = {t["target"]: t for t in report.seed_summary(results)}
    code = summary["hard: code use after RL >= 0.95"]
    assert code["mean"] == pytest.approx((0.99 + 0.90 + 0.97) / 3)
    assert code["sd"] == pytest.approx(statistics.stdev([0.99, 0.90, 0.97]))
    assert (code["worst_seed"], code["worst_value"], code["met"], code["seeds"]) == (4, 0.90, 2, 3)
    easy = summary["easy: code use after RL <= 0.30"]  # lower is better: the worst seed has the most code use
    assert (easy["worst_seed"], easy["worst_value"], easy["met"]) == (4, 0.4, 2)
    gain = summary[RECOVERY]  # seed 5 had no fault after SFT: left out, not met
    assert gain["mean"] == pytest.approx((0.4 + 0.0) / 2) and gain["worst_seed"] == 4 and gain["met"] == 1
    assert summary["tool RL: held-out accuracy drop over the last 30 steps <= 0.05"]["worst_seed"] is None


def test_report_reads_jsonl_whose_text_holds_unicode_line_separators(tmp_path):
    """Model text kept unescaped in JSON may hold U+2028 or U+0085: one record per line all the same."""
    from training.miniature_report import _jsonl

    path = tmp_path / "per_problem.jsonl"
    records = [{"response": "a\u2028b\x85c"}, {"response": "d"}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    assert _jsonl(path) == records


def test_recovery_is_measured_on_responses_with_an_injected_fault(tmp_path):
    """`with_fault_recovery` reads the evaluation's samples: a response counts when one of its calls was refused
    (`sandbox_error`); retried when a call was made after the refusal, recovered when it ended correct after a call
    that ran after the refusal (an answer from the output of a call before it is not a recovery)."""
    report = miniature_script()

    def sample(statuses, correct):
        return {"tool_statuses": statuses, "correct": correct}

    records = [{"level": "multiply", "samples": [sample(["sandbox_error", "ok"], True),  # refused, retried, right
                                                 sample(["sandbox_error"], False),  # gave up
                                                 sample(["sandbox_error", "sandbox_error"], True),  # a lucky guess
                                                 sample(["error", "ok"], True)]},  # its own error: not counted
               {"level": "easy", "samples": [sample([], True), sample(["ok", "sandbox_error", "skipped"], False),
                                             sample(["ok", "sandbox_error"], True)]},  # answered from the first
               {"level": "digitsum", "samples": [sample(["sandbox_error", "sandbox_error"], False)]}]
    path = tmp_path / "per_problem.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))

    def summary():
        return {"mean@4": 0.5, "mean@4_stderr": 0.1, "num_problems": 1, "mean_completion_tokens": 30.0,
                "tools": {"code_ratio": 1.0, "accuracy_with_tool": 0.5}, "self_correction": correction(0, 0)}

    metrics = {"n_samples": 4, **summary(), "by_level": {lvl: summary() for lvl in ("easy", "multiply", "digitsum")}}
    rows = report.level_rows(report.with_fault_recovery(metrics, path))
    multiply = rows["multiply"]["fault_recovery"]
    assert (multiply["responses_with_fault"], multiply["recovered"], multiply["retried"]) == (3, 1, 2)
    assert multiply["recovered_rate"] == pytest.approx(1 / 3)
    assert multiply["recovered_rate_stderr"] == pytest.approx(math.sqrt(2 / 9 / 3))
    easy = rows["easy"]["fault_recovery"]  # a call after the refusal over the budget (not run), or none at all
    assert (easy["responses_with_fault"], easy["recovered"], easy["retried"]) == (2, 0, 0)
    hard = rows["hard"]["fault_recovery"]  # pooled counts of the hard levels: multiply and digitsum
    assert (hard["responses_with_fault"], hard["recovered"], hard["retried"]) == (4, 1, 3)
    assert rows["all"]["fault_recovery"]["responses_with_fault"] == 6
    assert report.fault_rates({"responses_with_fault": 0, "recovered": 0, "retried": 0})["recovered_rate"] is None


def test_seed_list_runs_the_seeds_given():
    sys.path.insert(0, str(ROOT / "training"))
    from training.miniature import Arguments, seed_list

    assert seed_list(Arguments(seed=2, seeds=3)) == [2, 3, 4]
    assert seed_list(Arguments(seed_list=[0, 5, 6], seed=2, seeds=3)) == [0, 5, 6]  # replaces --seed and --seeds
    with pytest.raises(ValueError, match="distinct"):
        seed_list(Arguments(seed_list=[1, 1]))


def test_coldstart_retries_are_refused_again_as_often_as_asked():
    sys.path.insert(0, str(ROOT / "training"))
    from training.miniature_data import coldstart_kinds, make_problems

    problems = make_problems(200, seed=0)
    shares = {"easy": (0.9, 0.1), "hard": (0.4, 0.15)}
    once = coldstart_kinds(problems, shares, 0, fault_share=0.7, retry_share=0.75)
    again = coldstart_kinds(problems, shares, 0, fault_share=0.7, retry_share=0.75, again_share=0.2)
    assert "retry_again" not in once
    # The same draws: only retries change kind, about a fifth of them.
    assert [k for k in again if k != "retry_again"] == [k for k, a in zip(once, again, strict=True)
                                                        if a != "retry_again"]
    assert {k for k, a in zip(once, again, strict=True) if a == "retry_again"} == {"retry"}
    share = again.count("retry_again") / once.count("retry")
    assert 0.12 < share < 0.28, share


def test_copy_drills_vary_in_width_and_never_hold_a_test_question():
    sys.path.insert(0, str(ROOT / "training"))
    from training.miniature_data import make_drills

    drills = make_drills(300, seed=0)
    assert len({p.question for p in drills}) > 250 and {p.level for p in drills} == {"drill"}
    for p in drills:  # the answer is what the code prints
        a, b = map(int, re.fullmatch(r"What is (\d+) \* (\d+)\?", p.question).groups())
        assert p.answer == str(a * b) and p.metadata["code"] == f"print({a}*{b})"
    assert {len(p.answer) for p in drills} == set(range(1, 8))  # one to seven digits: only a copy writes them
    held_out = {p.question for p in drills[:50]}  # as if these were the test set's questions
    assert not held_out & {p.question for p in make_drills(300, seed=0, exclude=held_out)}


def test_a_third_call_in_the_cold_start_needs_three_calls(tmp_path):
    sys.path.insert(0, str(ROOT / "training"))
    from training.miniature import Arguments, main

    with pytest.raises(ValueError, match="--max_tool_calls 3"):
        main(Arguments(coldstart_fault_share=0.5, max_tool_calls=2, out=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()


def test_sft_learning_rate_holds_then_decays_over_the_share_asked():
    """The schedule run_sft passes to TRL, built by transformers as the trainer builds it."""
    import torch
    from transformers import get_scheduler

    sys.path.insert(0, str(ROOT / "training"))
    from training.miniature import Arguments, sft_schedule

    def rates(share: float, steps: int = 100) -> list[float]:
        schedule = sft_schedule(Arguments(sft_decay_share=share), steps)
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        scheduler = get_scheduler(schedule["lr_scheduler_type"], optimizer, num_warmup_steps=10,
                                  num_training_steps=steps,
                                  scheduler_specific_kwargs=schedule.get("lr_scheduler_kwargs"))
        out = []
        for _ in range(steps):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return out

    constant = rates(0.0)
    assert constant[0] == 0.0 and constant[10:] == [1.0] * 90  # the default: warm up, then hold
    decayed = rates(0.2)
    assert decayed[:80] == constant[:80]  # held until the last fifth
    assert decayed[81] < 1.0 and decayed[-1] < 0.01
    assert all(a >= b for a, b in itertools.pairwise(decayed[80:]))


def test_a_finished_seed_is_reused_only_with_the_settings_it_was_run_with(tmp_path):
    sys.path.insert(0, str(ROOT / "training"))
    from training.miniature import Arguments, finished_seed, main, result_settings, seed_summary_path

    args = Arguments(seed_list=[3, 1], out=str(tmp_path))
    assert finished_seed(args, tmp_path, 3) is None  # nothing there: run it
    summary = {"seed": 3, "settings": result_settings(args), "wall_seconds": 1.0, "result": {"seed": 3}}
    seed_summary_path(tmp_path, 3).write_text(json.dumps(summary))
    # Where and how fast it runs and which seeds: not the metrics' settings, so the seed is reused.
    same = Arguments(seed_list=[1, 3], out=str(tmp_path / "elsewhere"), parallel_arms=False, eval_processes=0)
    assert finished_seed(same, tmp_path, 3) == summary
    with pytest.raises(ValueError, match=r"rl_steps differ.*another --out"):  # never mixed into another experiment
        finished_seed(Arguments(seed_list=[3], rl_steps=7), tmp_path, 3)
    with pytest.raises(ValueError, match="rl_steps differ"):  # a sweep that would mix them stops before it starts
        main(Arguments(seed_list=[1, 3], rl_steps=7, out=str(tmp_path)))
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "seed1").exists()


def test_accuracy_when_the_tool_is_called_has_a_binomial_standard_error_over_those_responses():
    level_rows = miniature_script().level_rows

    def summary(code_ratio, with_tool, responses=100):
        return {"mean@4": 0.5, "mean@4_stderr": 0.05, "num_problems": 25, "mean_completion_tokens": 30.0,
                "tools": {"code_ratio": code_ratio, "accuracy_with_tool": with_tool, "responses": responses},
                "self_correction": correction(0, 0)}

    metrics = {"n_samples": 4, **summary(0.5, 0.8),
               "by_level": {"easy": summary(0.0, None), "multiply": summary(1, 0.7)}}
    rows = level_rows(metrics)
    assert rows["all"]["accuracy_with_tool_stderr"] == pytest.approx(math.sqrt(0.8 * 0.2 / 50))  # 50 responses called
    assert rows["multiply"]["accuracy_with_tool_stderr"] == pytest.approx(math.sqrt(0.7 * 0.3 / 100))
    assert rows["easy"]["accuracy_with_tool_stderr"] is None  # no call: no accuracy, no error


def test_checkpoints_lists_only_checkpoints_saved_whole_before_the_last_step(tmp_path):
    """Checkpoints are evaluated while GRPO still trains: one whose trainer_state.json (written after its weights) is
    not there yet is still being saved."""
    sys.path.insert(0, str(ROOT / "training"))
    from training.miniature import checkpoints

    for step, whole in ((30, True), (60, False), (90, True), (120, True)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if whole:
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    assert checkpoints(tmp_path, before=120) == [(30, tmp_path / "checkpoint-30"), (90, tmp_path / "checkpoint-90")]
