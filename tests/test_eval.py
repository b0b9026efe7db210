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
            assert s["completion_tokens"] <= 48 and s["finish_reason"] in ("answer", "length", "max_completion_tokens")
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
    metrics = ev.main(["--config", str(CONFIGS / "eval_tiny_cpu.yaml"), "--model", str(tiny_model), "--limit", "2",
                       "--n_samples", "1", "--max_completion_tokens", "32", "--out", str(tmp_path), "--no_progress"])
    assert metrics["num_problems"] == 2 and metrics["ks"] == [1]
    assert {p.name for p in tmp_path.iterdir()} >= {"per_problem.jsonl", "report.md", "metrics.json", "accuracy.png"}
    config = json.loads((tmp_path / "metrics.json").read_text())["config"]
    assert (config["dataset"], config["split"], config["max_completion_tokens"]) == ("arith", "test", 32)


@pytest.mark.parametrize("config", sorted(CONFIGS.glob("eval_*.yaml")), ids=lambda path: path.name)
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
