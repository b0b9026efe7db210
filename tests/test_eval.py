"""training/eval.py: metrics checked against direct computation, and real evaluations with a tiny model."""

from __future__ import annotations

import itertools
import json
import math
import statistics
import types
from pathlib import Path

import pytest

from retool_env.data import Problem, generate_arith
from retool_env.rollout import SamplingParams
from retool_env.trajectory import ToolCallRecord, Trajectory

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "training" / "configs"
EVAL_CONFIGS = ROOT / "retool_env" / "configs"  # packaged: the default config and the protocol presets


def eval_script():
    """The evaluation library and its command line, as one namespace."""
    from retool_adapters import eval_cli
    from retool_env import evaluation

    return types.SimpleNamespace(**vars(evaluation), main=eval_cli.main, parse_args=eval_cli.parse_args)


def sample(pred, gold, *, statuses=(), aborted=False, tokens=10):
    """A finished (or aborted) episode as the environment records it."""
    if aborted:
        return Trajectory(prompt_ids=[], gold=gold, has_logprobs=False, finish_reason="aborted: boom")
    correct = pred is not None and pred.replace(".0", "") == gold
    calls = [ToolCallRecord("print(1)", "1", status) for status in statuses]
    ran = sum(s not in ("invalid", "skipped") for s in statuses)
    return Trajectory(prompt_ids=[1], gold=gold, completion_ids=[2] * tokens, env_mask=[1] * tokens,
                      logprobs=[0.0] * tokens, tool_calls=calls, correct=correct, pred=pred,
                      reward=1.0 if correct else min(-0.6, -1 + 0.1 * ran), finish_reason="answer")


PROBLEMS = [Problem("p0", "42", "p0", level="easy"), Problem("p1", "7", "p1", level="easy"),
            Problem("p2", "100", "p2", level="count")]
TRAJECTORIES = [
    # p0: 2 of 4 correct; the first two disagree (41 first wins the tie), the four agree on 42 ("42" == "42.0").
    sample("41", "42", statuses=["ok"]), sample("42", "42", statuses=["error", "ok"]),
    sample("42.0", "42"), sample(None, "42"),
    # p1: 1 of 4 correct, the rest say 8 (majority wrong at every k).
    sample("8", "7", statuses=["timeout"]), sample("8", "7"), sample("7", "7", statuses=["ok"]), sample("8", "7"),
    # p2: all wrong, one aborted, one invalid call.
    sample("99", "100", statuses=["invalid"]), sample(None, "100", aborted=True), sample("98", "100"),
    sample("99", "100", statuses=["ok", "ok"]),
]


def direct_pass_at_k(correct, k):
    """pass@k by enumerating every k-subset of the samples."""
    subsets = list(itertools.combinations(correct, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_is_the_unbiased_estimator():
    ev = eval_script()
    for n in range(1, 8):
        for c in range(n + 1):
            correct = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                assert ev.pass_at_k(n, c, k) == pytest.approx(direct_pass_at_k(correct, k))
    with pytest.raises(ValueError):
        ev.pass_at_k(4, 1, 5)


def test_metrics_match_direct_computation():
    ev = eval_script()
    metrics = ev.compute_metrics(PROBLEMS, TRAJECTORIES, n_samples=4)
    assert metrics["ks"] == [1, 2, 4]
    correct = [[bool(t.correct) for t in TRAJECTORIES[i * 4:(i + 1) * 4]] for i in range(3)]
    assert correct == [[False, True, True, False], [False, False, True, False], [False] * 4]
    assert metrics["mean@4"] == pytest.approx((2 / 4 + 1 / 4 + 0) / 3)
    assert metrics["mean@4_stderr"] == pytest.approx(statistics.stdev([2 / 4, 1 / 4, 0]) / math.sqrt(3))
    for k in (1, 2, 4):
        assert metrics[f"pass@{k}"] == pytest.approx(sum(direct_pass_at_k(c, k) for c in correct) / 3)
    # maj@1: 41, 8, 99 -> none right; maj@2: ties go to the first answer -> none; maj@4: 42 (x2, equivalent) wins p0.
    assert (metrics["maj@1"], metrics["maj@2"], metrics["maj@4"]) == (0.0, 0.0, pytest.approx(1 / 3))
    assert metrics["aborted"] == 1 and metrics["num_samples"] == 12

    tools = metrics["tools"]
    executed = ["ok", "error", "ok", "timeout", "ok", "ok", "ok"]  # the invalid call ran nothing
    assert tools["responses"] == 11
    assert tools["code_ratio"] == pytest.approx(5 / 11)  # p2's first sample only made an invalid call
    assert tools["tool_calls_per_response"] == pytest.approx(len(executed) / 11)
    assert tools["tool_error_rate"] == pytest.approx(1 / len(executed))
    assert tools["tool_timeout_rate"] == pytest.approx(1 / len(executed))
    assert tools["invalid_call_rate"] == pytest.approx(1 / 8)
    assert tools["accuracy_with_tool"] == pytest.approx(2 / 5)  # p0 #2 and p1 #3 called the tool and were right
    assert tools["accuracy_without_tool"] == pytest.approx(1 / 6)  # p0 #3

    easy, count = metrics["by_level"]["easy"], metrics["by_level"]["count"]
    assert list(metrics["by_level"]) == ["easy", "count"]  # curriculum order
    assert easy["num_problems"] == 2 and easy["mean@4"] == pytest.approx((0.5 + 0.25) / 2)
    assert easy["mean@4_stderr"] == pytest.approx(0.125) and count["mean@4_stderr"] is None  # one problem: unknown
    assert easy["maj@4"] == pytest.approx(0.5) and count["pass@4"] == 0.0
    assert count["tools"]["responses"] == 3


def test_majority_groups_equivalent_answers():
    ev = eval_script()
    assert ev.majority_vote(["1/2", "0.3", "\\frac{1}{2}", "0.5", "0.3"]) == 0
    assert ev.majority_vote(["3", "4", "4.0"]) == 1
    assert ev.majority_vote([None, None]) is None
    with pytest.raises(ValueError, match="1 x 4"):
        ev.compute_metrics(PROBLEMS[:1], TRAJECTORIES[:3], n_samples=4)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from retool_adapters.offline_models import build_tiny_qwen

    return build_tiny_qwen(tmp_path_factory.mktemp("tiny"))


def test_evaluate_with_hf_generator_writes_every_output(tiny_model, tmp_path):
    from retool_adapters.generators import HFGenerator

    ev = eval_script()
    generator = HFGenerator.from_pretrained(tiny_model)
    tok = generator.tokenizer
    problems = generate_arith(3, seed=1, levels=["easy", "modpow"])
    metrics = ev.evaluate(problems, generator, tok, n_samples=2, out=tmp_path, tool_format="retool",
                          sampling=SamplingParams(temperature=1.0, seed=0), max_completion_tokens=48,
                          progress=False, config={"model": "tiny"})
    assert metrics["num_problems"] == 3 and metrics["num_samples"] == 6 and metrics["ks"] == [1, 2]
    assert metrics["aborted"] == 0 and metrics["tools"]["responses"] == 6
    assert 0 < metrics["mean_completion_tokens"] <= 48
    assert list(metrics["by_level"]) == ["easy", "modpow"] and metrics["by_level"]["easy"]["num_problems"] == 2

    records = [json.loads(line) for line in (tmp_path / "per_problem.jsonl").read_text().splitlines()]
    assert [(r["id"], r["level"], r["gold"]) for r in records] == [(p.id, p.level, p.answer) for p in problems]
    for record in records:
        assert record["n"] == len(record["samples"]) == 2
        assert record["num_correct"] == sum(s["correct"] for s in record["samples"])
        for s in record["samples"]:
            assert len(tok.encode(s["response"], add_special_tokens=False)) > 0
            assert s["completion_tokens"] <= 48
            assert s["finish_reason"] in ("answer", "length", "max_completion_tokens", "observation_too_long")
    mean = sum(r["num_correct"] for r in records) / 6
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["mean@2"] == pytest.approx(mean) == metrics["mean@2"] and saved["config"] == {"model": "tiny"}
    report = (tmp_path / "report.md").read_text()
    assert "| easy | 2 |" in report and "| modpow | 1 |" in report and "code_ratio" in report
    assert (tmp_path / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Same seed, same samples: the evaluation is reproducible.
    again = ev.evaluate(problems, generator, tok, n_samples=2, tool_format="retool", max_completion_tokens=48,
                        sampling=SamplingParams(temperature=1.0, seed=0), progress=False)
    assert again == metrics


def test_main_runs_the_command_line_path(tiny_model, tmp_path):
    ev = eval_script()
    results = ev.main(["--config", str(EVAL_CONFIGS / "eval_tiny_cpu.yaml"), "--model", str(tiny_model), "--limit",
                       "2", "--n_samples", "1", "--max_completion_tokens", "32", "--arms", "tool", "--out",
                       str(tmp_path), "--no_progress"])
    metrics = results["arith"]["tool"]
    assert list(results["arith"]) == ["tool"] and metrics["num_problems"] == 2 and metrics["ks"] == [1]
    arm = tmp_path / "arith" / "tool"
    assert {p.name for p in arm.iterdir()} >= {"per_problem.jsonl", "report.md", "metrics.json", "accuracy.png"}
    config = json.loads((arm / "metrics.json").read_text())["config"]
    assert (config["dataset"], config["split"], config["max_completion_tokens"]) == ("arith", None, 32)  # arith: test
    assert config["protocol"] is None and (tmp_path / "report.md").exists()


@pytest.mark.parametrize("config", sorted([*CONFIGS.glob("eval_*.yaml"), *EVAL_CONFIGS.glob("eval_*.yaml")]),
                         ids=lambda path: path.name)
def test_each_shipped_config_parses(config, tmp_path):
    ev = eval_script()
    model_args, data_args, env_args, output_args = ev.parse_args(["--config", str(config), "--n_samples", "4"])
    assert data_args.n_samples == 4  # the command line wins over the file
    assert env_args.tool_format in ("retool", "hermes") and model_args.backend in ("hf", "vllm", "openai")
    if "aime24" in config.name:
        assert (data_args.dataset, data_args.temperature, data_args.top_p) == ("aime24", 1.0, 0.7)
        assert env_args.max_completion_tokens == 16384
    bad = tmp_path / "bad.yaml"
    bad.write_text("n_sample: 3\n")
    with pytest.raises(SystemExit):  # one line on stderr naming the key, no traceback
        ev.parse_args(["--config", str(bad)])


def test_self_correction_counts_recoveries_and_fixes():
    from retool_env.evaluation import self_correction
    from retool_env.trajectory import ToolCallRecord, Trajectory

    def episode(statuses: list[str], correct: bool, finish: str = "answer") -> Trajectory:
        calls = [ToolCallRecord("code", "out", status, turn=i) for i, status in enumerate(statuses)]
        return Trajectory(prompt_ids=[1], tool_calls=calls, correct=correct, finish_reason=finish)

    trajectories = [
        episode(["error", "ok"], True),  # failed, fixed by the next call, recovered
        episode(["timeout", "invalid", "error"], False),  # the invalid call ran nothing: the next run failed again
        episode(["ok"], True),  # never failed
        episode(["memory"], True),  # failed, never retried, still right
        episode(["sandbox_error", "ok"], False),  # the executor's failure is not the model's
        episode(["error", "ok"], True, finish="aborted: the generator failed"),  # aborted: not a response
    ]
    stats = self_correction(trajectories)
    assert stats["responses_with_failure"] == 3
    assert stats["recovered_rate"] == pytest.approx(2 / 3)
    assert stats["fixed_rate"] == pytest.approx(1 / 2)  # error -> ok fixed; timeout -> error not
    assert stats["recovered_rate_stderr"] == pytest.approx(math.sqrt(2 / 3 * 1 / 3 / 3))
    assert stats["fixed_rate_stderr"] == pytest.approx(0.5 / math.sqrt(2))
    clean = self_correction([episode(["ok"], True)])  # no gold here: errors only, so an `ok` call never fails
    assert clean["responses_with_failure"] == 0 and clean["recovered_rate"] is clean["fixed_rate_stderr"] is None


def test_self_correction_counts_a_call_that_printed_a_wrong_value_as_failed():
    from retool_env.evaluation import self_correction
    from retool_env.trajectory import ToolCallRecord, Trajectory

    def episode(calls: list[tuple[str, str]], correct: bool) -> Trajectory:
        records = [ToolCallRecord("code", output, status, turn=i) for i, (status, output) in enumerate(calls)]
        return Trajectory(prompt_ids=[1], gold="42", tool_calls=records, correct=correct, finish_reason="answer")

    trajectories = [
        episode([("ok", "41"), ("ok", "working...\n42\n")], True),  # wrong value, then the gold on the last line
        episode([("ok", "42.0")], True),  # graded equal to the gold: no failure
        episode([("error", "NameError"), ("ok", "7")], False),  # fixed the error, but printed a wrong value
        episode([("ok", "42\ndone")], False),  # the last line is what counts
    ]
    stats = self_correction(trajectories)
    assert stats["responses_with_failure"] == 3 and stats["recovered"] == 1
    assert stats["failed_calls"] == 4 and stats["wrong_output_calls"] == 3
    assert stats["failures_followed"] == 2 and stats["fixed"] == 1 and stats["fixed_rate"] == pytest.approx(1 / 2)
    assert stats["recovered_rate"] == pytest.approx(1 / 3)


# --- protocols and the two arms ------------------------------------------------------------------------------------

PROTOCOL_SETTINGS = {  # (n_samples, temperature, top_p, max_completion_tokens), as each source states them
    "paper": (32, 1.0, 0.7, 16384),
    "verl": (30, 1.0, 0.6, 16384),
    "matharena": (4, 0.6, 1.0, 16000),
    "aster": (16, 1.0, 1.0, 90000),
}


@pytest.mark.parametrize("name", list(PROTOCOL_SETTINGS))
def test_protocol_presets_state_their_source_and_flags_win_on_top(name):
    from retool_adapters import eval_cli

    source, notes, preset = eval_cli.load_protocol(name)
    assert "arXiv" in source or "recipe" in source
    assert set(eval_cli.PROTOCOL_FIELDS) <= set(preset) and all(isinstance(note, str) for note in notes)
    assert (EVAL_CONFIGS / "protocols" / f"{name}.yaml").is_file()
    assert eval_cli.EVAL_CONFIGS.resolve() == EVAL_CONFIGS.resolve()  # found from the package, not ../training
    _, data, env, _ = eval_cli.parse_args(["--protocol", name])
    assert (data.n_samples, data.temperature, data.top_p, env.max_completion_tokens) == PROTOCOL_SETTINGS[name]
    assert data.ks[-1] == data.n_samples and data.protocol_record["differences"] == {}
    _, data, env, out = eval_cli.parse_args(["--protocol", name, "--n_samples", "2", "--no_progress"])
    assert data.n_samples == 2 and out.progress is False and data.temperature == PROTOCOL_SETTINGS[name][1]
    assert data.ks == [1, 2]  # the preset's k values that fit the new n, and n
    differences = data.protocol_record["differences"]
    assert list(differences) == ["n_samples", "ks"]  # progress changes no score
    assert differences["n_samples"] == {"value": 2, "protocol": PROTOCOL_SETTINGS[name][0], "set_by": "flag"}


@pytest.mark.parametrize("name", list(PROTOCOL_SETTINGS))
def test_a_protocol_run_is_the_whole_benchmark_under_the_sources_settings(name):
    """Nothing of the CPU smoke config (10 problems, 2 tool calls, 64-token observations, float32, unseeded) leaks
    into a protocol run: the preset states every setting that changes a score."""
    from retool_adapters import eval_cli

    model, data, env, _ = eval_cli.parse_args(["--protocol", name, "--model", "Qwen/Qwen3-4B", "--backend", "vllm",
                                               "--dataset", "aime24,amobench"])
    assert data.limit is None and data.levels is None and data.seed == 0 and model.dtype == "auto"
    _, _, preset = eval_cli.load_protocol(name)
    assert (env.max_tool_calls, env.max_observation_tokens, env.tool_timeout) == (
        preset["max_tool_calls"], preset["max_observation_tokens"], preset["tool_timeout"])
    assert data.protocol_record["differences"] == {}


def test_the_report_lists_every_setting_that_differs_from_the_protocol_wherever_it_was_set():
    from retool_adapters import eval_cli
    from retool_env.evaluation import render_arms_report

    _, data, env, _ = eval_cli.parse_args(["--config", str(EVAL_CONFIGS / "eval_tiny_cpu.yaml"), "--protocol",
                                           "paper", "--max_tool_calls", "2"])
    differences = data.protocol_record["differences"]
    assert differences["tool_format"] == {"value": "hermes", "protocol": "auto", "set_by": "config"}
    assert differences["max_tool_calls"] == {"value": 2, "protocol": 16384, "set_by": "flag"}
    assert data.limit is None and env.max_observation_tokens == 400  # the file's smoke values are replaced
    metrics = {"n_samples": 1, "ks": [1], "num_problems": 1, "mean@1": 0.0, "mean@1_ci95": None, "pass@1": 0.0,
               "maj@1": 0.0, "parse_failure_rate": 0.0, "truncation_rate": 0.0,
               "tools": dict.fromkeys(["code_ratio", "tool_calls_per_response", "call_attempt_rate",
                                       "tool_error_rate", "tool_timeout_rate", "invalid_call_rate",
                                       "accuracy_with_tool", "accuracy_without_tool"])}
    report = render_arms_report({"arith": {"tool": metrics}}, {"protocol": data.protocol_record})
    assert "`max_tool_calls=2` (protocol: `16384`; flag)" in report
    assert "`tool_format=hermes` (protocol: `auto`; config)" in report
    assert "no call cap" in report  # the source's own settings and the notes


def test_the_cpu_smoke_config_is_read_only_for_a_run_without_a_model_or_protocol():
    from retool_adapters import eval_cli

    _, data, env, _ = eval_cli.parse_args(["--limit", "2"])
    assert (data.dataset, data.limit, env.max_tool_calls) == ("arith", 2, 2)  # the smoke run
    model, data, env, _ = eval_cli.parse_args(["--model", "runs/grpo", "--backend", "vllm"])
    assert (data.limit, data.n_samples, data.top_p, model.dtype, env.max_tool_calls) == (None, 32, 0.7, "auto", 8)


def test_unknown_protocol_is_one_line(capsys):
    from retool_adapters import eval_cli

    with pytest.raises(SystemExit):
        eval_cli.parse_args(["--protocol", "leaderboard"])
    assert "unknown protocol" in capsys.readouterr().err


def test_bootstrap_interval_resamples_problems():
    import numpy as np

    from retool_env.evaluation import bootstrap_ci

    values = [0.0, 0.25, 0.5, 1.0, 1.0]
    low, high = bootstrap_ci(values, resamples=500, seed=3)
    draws = np.random.default_rng(3).integers(0, 5, (500, 5))
    means = np.asarray(values)[draws].mean(axis=1)
    assert (low, high) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
    assert low < statistics.mean(values) < high
    assert bootstrap_ci([0.5, 0.5, 0.5]) == [0.5, 0.5] and bootstrap_ci([1.0]) is None


class CallThenAnswer:
    """A scripted model: one code_interpreter call, then `\\boxed{42}` once it has seen a tool result."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.prompts: list[str] = []

    async def generate(self, prompt_ids, *, max_tokens, stop_token_ids=(), stop=(), sampling=None):
        from retool_env.formats import format_class
        from retool_env.rollout import Generation

        context = self.tokenizer.decode(list(prompt_ids))
        self.prompts.append(context)
        text = "\\boxed{42}" if "<tool_response>" in context else format_class("hermes").call_text("print(6 * 7)")
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.convert_tokens_to_ids(
            "<|im_end|>")]
        return Generation(ids[:max_tokens], None, "stop")


def test_two_arms_same_problems_no_tool_in_the_no_tool_prompt_and_the_difference(tmp_path):
    from retool_env.evaluation import evaluate_arms
    from retool_env.offline import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = CallThenAnswer(tokenizer)
    problems = [Problem(f"What is 6 * 7? ({i})", "42", f"q{i}") for i in range(3)]
    results = evaluate_arms({"toy": problems}, model, tokenizer, n_samples=2, tool_format="hermes",
                            max_completion_tokens=256, progress=False, out=tmp_path, config={"model": "scripted"})
    tool, no_tool, diff = results["toy"]["tool"], results["toy"]["no_tool"], results["toy"]["difference"]
    assert tool["mean@2"] == 1.0 and tool["tools"]["code_ratio"] == 1.0 and tool["parse_failure_rate"] == 0.0
    # Without the tool: the prompt offers none, the call the model writes anyway is recorded but never runs.
    assert no_tool["mean@2"] == 0.0 and no_tool["tools"]["code_ratio"] == 0.0
    assert no_tool["tools"]["call_attempt_rate"] == 1.0 and no_tool["parse_failure_rate"] == 1.0
    assert no_tool["finish_reasons"] == {"max_tool_calls": 6}
    first_prompts = [p for p in model.prompts if "<tool_response>" not in p]
    with_tools = [p for p in first_prompts if "code_interpreter" in p.split("<|im_start|>user")[0]]
    assert len(with_tools) == 6 and len(first_prompts) == 12  # 3 problems x 2 samples x 2 arms; half offer the tool
    assert tool["num_problems"] == no_tool["num_problems"] == 3
    assert diff["mean@2"] == 1.0 and diff["mean@2_ci95"] == [1.0, 1.0] and diff["problems_better_with_tool"] == 3

    report = (tmp_path / "report.md").read_text()
    assert "| toy | tool | 3 | 1.000 [1.000, 1.000] |" in report and "| toy | no_tool | 3 | 0.000" in report
    assert "## Tool minus no tool" in report and "call_attempt_rate" in report
    assert (tmp_path / "arms.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["benchmarks"]["toy"]["difference"]["mean@2"] == 1.0
    assert (tmp_path / "toy" / "no_tool" / "per_problem.jsonl").exists()


def test_retool_env_eval_protocol_paper_writes_the_two_arm_report_and_plot(tiny_model, tmp_path):
    """`retool-env eval --protocol paper --dataset arith --limit 2` on the tiny offline model, on CPU. The protocol's
    32 samples of 16,384 tokens on every problem would take hours here (and pass the tiny model's 4,096 positions):
    flags cut them, and the report lists each as a difference from the protocol."""
    from retool_env.cli import main

    assert main(["eval", "--protocol", "paper", "--dataset", "arith", "--limit", "2", "--model", str(tiny_model),
                 "--n_samples", "2", "--max_completion_tokens", "24", "--out", str(tmp_path), "--no_progress"]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "Protocol `paper`: ReTool (Feng et al. 2025, arXiv 2504.11536)" in report
    assert "`n_samples=2` (protocol: `32`; flag)" in report
    assert "`max_completion_tokens=24` (protocol: `16384`; flag)" in report and "`limit=2` (protocol: `None`" in report
    assert "| arith | tool | 2 |" in report and "| arith | no_tool | 2 |" in report
    assert (tmp_path / "arms.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((tmp_path / "metrics.json").read_text())
    arms = saved["benchmarks"]["arith"]
    assert set(arms) == {"tool", "no_tool", "difference"}
    for arm in ("tool", "no_tool"):
        assert arms[arm]["num_samples"] == 4 and 0 <= arms[arm]["parse_failure_rate"] <= 1
        assert len(arms[arm]["mean@2_ci95"]) == 2
    assert saved["config"]["top_p"] == 0.7 and saved["config"]["protocol"]["name"] == "paper"
    assert arms["no_tool"]["tools"]["tool_calls_per_response"] == 0.0


def test_an_installed_copy_finds_its_default_config_and_protocols(tmp_path):
    """Build the packages as a wheel would hold them (setuptools' build_py, package-data included), then run the
    evaluation's parser from that copy, outside the repository: no ../training/configs to fall back on."""
    import os
    import shutil
    import subprocess
    import sys

    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv*", ".git", "runs", "tests", "bench", "*.pyc"))
    build = subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py",
                            "--build-lib", str(tmp_path / "lib")], cwd=source, capture_output=True, text=True,
                           timeout=240)
    assert build.returncode == 0, build.stderr
    assert not (tmp_path / "lib" / "training").exists()
    code = ("import retool_env, retool_adapters.eval_cli as e\n"
            "_, data, env, _ = e.parse_args(['--protocol', 'aster'])\n"
            "print(retool_env.__file__, e.EVAL_CONFIGS, data.dataset, data.n_samples, env.max_completion_tokens)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "lib")})
    assert out.returncode == 0, out.stderr
    module, configs, dataset, n, budget = out.stdout.split()
    assert module.startswith(str(tmp_path / "lib")) and configs == str(tmp_path / "lib" / "retool_env" / "configs")
    assert (dataset, n, budget) == ("aime24", "16", "90000")  # a protocol run: not the smoke config


def test_several_benchmarks_in_one_run_and_levels_only_where_a_benchmark_has_them():
    from retool_adapters import eval_cli

    fixtures = ROOT / "tests" / "fixtures" / "data"
    _, data, _, _ = eval_cli.parse_args(["--dataset",
                                         f"{fixtures / 'matharena' / 'aime_2026'},{fixtures / 'amo_bench'}",
                                         "--levels", "number", "set", "variable", "--limit", "2"])
    benchmarks = eval_cli.load_benchmarks(data)
    assert list(benchmarks) == ["aime_2026", "amo_bench"]
    assert [p.id for p in benchmarks["aime_2026"]] == ["aime26-1", "aime26-2"]  # no levels: not filtered
    assert [p.level for p in benchmarks["amo_bench"]] == ["number", "set"]  # AMO-Bench-P, then the limit
