"""Evaluation: play n episodes of each problem with any generator and score them (mean@n, pass@k, maj@k, tool use,
per level); `training/eval.py` (and `retool-env eval`) is the command line over it.

```python
from retool_env.evaluation import evaluate
metrics = evaluate(problems, generator, tokenizer, n_samples=4, tool_format="retool", out="runs/eval")
```

Metrics, over n samples of each problem: `mean@n` is the average accuracy of all samples (the paper's "avg@32");
`pass@k` is the unbiased estimator of Chen et al. (2021), 1 - C(n - c, k) / C(n, k) for c correct samples; `maj@k`
is the accuracy of the majority answer among the first k samples, answers grouped by `retool_env.grading`'s
normalisation and equivalence; `mean@n_stderr` is the standard error of `mean@n` over problems (the spread of
per-problem accuracy over the square root of the number of problems): the uncertainty of `mean@n` as an estimate of
accuracy on problems like these. An aborted episode (a backend failure) counts as a wrong sample and is reported.
`mean@n_ci95` is a 95% interval of `mean@n` from a problem-level bootstrap (problems resampled with replacement,
their per-problem accuracies averaged; `bootstrap_ci`), and `parse_failure_rate` the share of responses in which the
grader found no final answer. Tool use comes from `Trajectory.tool_stats` (see `tool_use`). With `out`, the
evaluation writes `per_problem.jsonl`, `metrics.json`, `report.md` and `accuracy.png` (matplotlib, imported only then).

`evaluate_arms` plays the same problems with the same samples (n, seeds) twice: the `tool` arm as configured, and the
`no_tool` arm with the tools taken away (no tool in the prompt, `max_tool_calls=0`), because turning tools on can
change a thinking model's accuracy even when it barely calls them (TRICE, arXiv 2605.06326). It reports both side by
side with the paired tool-minus-no-tool difference and its bootstrap interval (`report.md`, `arms.png`).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from retool_env.chat import with_chat_template
from retool_env.data import LEVELS
from retool_env.env import make_env_factory
from retool_env.formats import ToolFormat, format_class, resolve_tool_format
from retool_env.grading import is_equivalent, normalize_answer
from retool_env.rollout import SamplingParams, run_episodes
from retool_env.trajectory import NOT_RUN, ToolCallRecord, ToolStats, ToolStatus, Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): the chance that k of the n samples, drawn without replacement, hold at
    least one of the c correct ones."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k}, n={n}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_vote(preds: Sequence[str | None]) -> int | None:
    """Index of a sample holding the most common answer (answers equal after normalisation or equivalent), the
    earliest cluster winning ties; None when no sample has an answer."""
    clusters: list[list[int]] = []  # indices of samples with one answer, in order of first appearance
    keys: list[str] = []
    for i, pred in enumerate(preds):
        if pred is None:
            continue
        key = normalize_answer(pred)
        for cluster, other in zip(clusters, keys, strict=True):
            if key == other or is_equivalent(pred, str(preds[cluster[0]])):
                cluster.append(i)
                break
        else:
            clusters.append([i])
            keys.append(key)
    if not clusters:
        return None
    return max(clusters, key=len)[0]  # max keeps the first of equal-sized clusters


def default_ks(n: int) -> list[int]:
    return sorted({2 ** i for i in range(n.bit_length()) if 2 ** i <= n} | {n})


def tool_use(trajectories: Sequence[Trajectory]) -> dict[str, float | None]:
    """Tool use over responses (aborted episodes excluded), from `Trajectory.tool_stats`: how often code is called,
    how it fails, and whether responses that call it are more accurate.

    `code_ratio`: responses with an executed call; `tool_calls_per_response`: executed calls per response;
    `tool_error_rate` and `tool_timeout_rate`: `ToolStats.errors` and `.timeouts` over executed calls (a timeout is
    not an error here); `invalid_call_rate`: invalid calls over every call written; `call_attempt_rate`: responses
    that wrote any call, run or not (in the no-tool arm: calls to a tool the prompt never offered).
    """
    done = [t for t in trajectories if not t.aborted]
    stats = [t.tool_stats() for t in done]
    total = sum(stats, ToolStats())
    with_tool = [t for t, s in zip(done, stats, strict=True) if s.executed]
    without_tool = [t for t, s in zip(done, stats, strict=True) if not s.executed]

    def share(part: int, whole: int) -> float | None:
        return part / whole if whole else None

    return {
        "responses": len(done),
        "code_ratio": share(len(with_tool), len(done)),
        "tool_calls_per_response": share(total.executed, len(done)),
        "tool_error_rate": share(total.errors, total.executed),
        "tool_timeout_rate": share(total.timeouts, total.executed),
        "invalid_call_rate": share(total.invalid, total.calls),
        "call_attempt_rate": share(sum(bool(s.calls) for s in stats), len(done)),
        "accuracy_with_tool": share(sum(bool(t.correct) for t in with_tool), len(with_tool)),
        "accuracy_without_tool": share(sum(bool(t.correct) for t in without_tool), len(without_tool)),
    }


FAILED_RUNS = frozenset({ToolStatus.ERROR, ToolStatus.TIMEOUT, ToolStatus.MEMORY, ToolStatus.KILLED})

# The counts `self_correction` reports; pooling groups (levels, seeds) means summing these, then `correction_rates`.
CORRECTION_COUNTS = ("responses_with_failure", "recovered", "failures_followed", "fixed", "failed_calls",
                     "wrong_output_calls")


@functools.lru_cache(maxsize=65536)
def _output_is_gold(output: str, gold: str) -> bool:
    """Whether a call's last non-empty output line grades equal to the gold answer (cached: every call is graded
    once overall and once for its level)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return bool(lines) and is_equivalent(lines[-1], gold)


def _call_failed(call: ToolCallRecord, gold: str) -> bool:
    """A call that ran and either ended in an error, timeout, memory limit or signal, or (with a gold answer) ran
    `ok` but did not print the gold answer on its last non-empty line."""
    if call.status in FAILED_RUNS:
        return True
    return bool(gold) and call.status == ToolStatus.OK and not _output_is_gold(call.output, gold)


def binomial_stderr(part: int, whole: int) -> float | None:
    """Standard error of the proportion part / whole, sqrt(p (1 - p) / n); None when whole is 0."""
    if not whole:
        return None
    p = part / whole
    return math.sqrt(p * (1 - p) / whole)


def correction_rates(counts: dict[str, int]) -> dict[str, float | int | None]:
    """`self_correction`'s rates and their standard errors from its counts, so pooled counts give pooled rates."""
    out: dict[str, float | int | None] = {name: counts[name] for name in CORRECTION_COUNTS}
    for rate, part, whole in (("recovered_rate", "recovered", "responses_with_failure"),
                              ("fixed_rate", "fixed", "failures_followed")):
        out[rate] = counts[part] / counts[whole] if counts[whole] else None
        out[f"{rate}_stderr"] = binomial_stderr(counts[part], counts[whole])
    return out


def self_correction(trajectories: Sequence[Trajectory]) -> dict[str, float | int | None]:
    """How a model recovers when its code fails (the ReTool paper's headline behaviour), over responses (aborted
    episodes excluded).

    A call failed when it ran and either ended in an error, a timeout, the memory limit or a signal, or ran `ok`
    but its output is wrong: the last non-empty line of what it printed (as the model was shown it) does not grade
    equal to the trajectory's gold answer (`retool_env.grading.is_equivalent`). The last line, not all of stdout,
    because code that shows its work prints the result last. This suits code that computes the answer (the
    miniature's); code that prints an intermediate value counts as wrong. A trajectory without a gold answer
    (`gold == ""`) falls back to errors only. The executor's own failures (`sandbox_error`) never count.

    `responses_with_failure`: responses with at least one failed call; `recovered` / `recovered_rate`: of those, the
    ones that still ended correct; `failures_followed`: failed calls the model followed with another call that ran,
    in the same response; `fixed` / `fixed_rate`: of those, the ones whose next call succeeded (ran `ok` with a right
    output); `failed_calls` and `wrong_output_calls`: every failed call, and those that ran `ok`. `*_stderr`: the
    binomial standard error sqrt(p (1 - p) / n) of a rate. Pool groups by summing `CORRECTION_COUNTS` and calling
    `correction_rates`.
    """
    counts = dict.fromkeys(CORRECTION_COUNTS, 0)
    for t in trajectories:
        if t.aborted:
            continue
        ran = [c for c in t.tool_calls if c.status not in NOT_RUN]
        failed = [_call_failed(c, t.gold) for c in ran]
        if not any(failed):
            continue
        counts["responses_with_failure"] += 1
        counts["recovered"] += bool(t.correct)
        counts["failed_calls"] += sum(failed)
        counts["wrong_output_calls"] += sum(f and c.status == ToolStatus.OK for c, f in zip(ran, failed, strict=True))
        for (call_failed, next_failed), after in zip(itertools.pairwise(failed), ran[1:], strict=True):
            if call_failed:
                counts["failures_followed"] += 1
                counts["fixed"] += after.status == ToolStatus.OK and not next_failed
    return correction_rates(counts)


def _stderr(values: Sequence[float]) -> float | None:
    """Standard error of the mean of `values` (sample standard deviation / sqrt(count)); None below two values."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) >= 2 else None


BOOTSTRAP_RESAMPLES = 2000


def bootstrap_ci(values: Sequence[float], *, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = 0) -> list[float] | None:
    """Percentile bootstrap interval of the mean of per-problem values (problems resampled with replacement): the
    uncertainty of a benchmark score over problems like these. Seeded, so a report is reproducible; None below two
    values."""
    import numpy as np

    if len(values) < 2:
        return None
    data = np.asarray(values, dtype=float)
    means = data[np.random.default_rng(seed).integers(0, len(data), (resamples, len(data)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return [float(low), float(high)]


def _parse_failure_rate(trajectories: Sequence[Trajectory]) -> float | None:
    """Responses (aborted episodes excluded) in which the grader found no final answer."""
    done = [t for t in trajectories if not t.aborted]
    return sum(t.pred is None for t in done) / len(done) if done else None


def _summary(groups: Sequence[tuple[Any, list[Any]]], n: int, ks: Sequence[int]) -> dict[str, Any]:
    """mean@n, pass@k, maj@k, rewards, lengths and tool statistics over (problem, its n trajectories) groups."""
    trajectories = [t for _, group in groups for t in group]
    summary: dict[str, Any] = {"num_problems": len(groups), "num_samples": len(trajectories)}
    correct = [[bool(t.correct) for t in group] for _, group in groups]
    summary[f"mean@{n}"] = sum(sum(c) / n for c in correct) / len(groups) if groups else 0.0
    summary[f"mean@{n}_stderr"] = _stderr([sum(c) / n for c in correct])
    summary[f"mean@{n}_ci95"] = bootstrap_ci([sum(c) / n for c in correct])
    for k in ks:
        summary[f"pass@{k}"] = sum(pass_at_k(n, sum(c), k) for c in correct) / len(groups) if groups else 0.0
    for k in ks:
        wins = 0
        for _, group in groups:
            winner = majority_vote([t.pred for t in group[:k]])
            wins += winner is not None and bool(group[winner].correct)
        summary[f"maj@{k}"] = wins / len(groups) if groups else 0.0
    done = [t for t in trajectories if not t.aborted]
    summary["mean_reward"] = sum(t.reward or 0.0 for t in done) / len(done) if done else None
    summary["mean_completion_tokens"] = sum(len(t.completion_ids) for t in done) / len(done) if done else None
    summary["truncation_rate"] = sum(t.truncated for t in done) / len(done) if done else None
    summary["aborted"] = len(trajectories) - len(done)
    summary["parse_failure_rate"] = _parse_failure_rate(trajectories)
    summary["finish_reasons"] = dict(Counter(t.finish_reason.split(":")[0] for t in trajectories))
    summary["tools"] = tool_use(trajectories)
    summary["self_correction"] = self_correction(trajectories)
    return summary


def compute_metrics(problems: Sequence[Any], trajectories: Sequence[Any], n_samples: int,
                    ks: Sequence[int] | None = None) -> dict[str, Any]:
    """Metrics of `n_samples` trajectories per problem, in `run_episodes` order (problem-major): overall and, when
    problems carry a `level`, per level."""
    if len(trajectories) != len(problems) * n_samples:
        raise ValueError(f"expected {len(problems)} x {n_samples} trajectories, got {len(trajectories)}")
    ks = sorted(set(ks or default_ks(n_samples)))
    if ks[0] < 1 or ks[-1] > n_samples:
        raise ValueError(f"every k must lie in 1..n_samples={n_samples}, got {ks}")
    groups = [(p, list(trajectories[i * n_samples:(i + 1) * n_samples])) for i, p in enumerate(problems)]
    metrics = {"n_samples": n_samples, "ks": ks, **_summary(groups, n_samples, ks),
               "per_problem_accuracy": [sum(bool(t.correct) for t in group) / n_samples for _, group in groups]}
    by_level: dict[str, list] = defaultdict(list)
    for problem, group in groups:
        if problem.level is not None:
            by_level[str(problem.level)].append((problem, group))
    metrics["by_level"] = {level: _summary(by_level[level], n_samples, ks) for level in _level_order(list(by_level))}
    return metrics


def _level_order(levels: Sequence[str]) -> list[str]:
    """Procedural levels in their curriculum order, then MATH levels and anything else sorted."""
    return sorted(levels, key=lambda level: (list(LEVELS).index(level) if level in LEVELS else len(LEVELS), level))


def problem_records(problems: Sequence[Any], trajectories: Sequence[Any], n_samples: int, ks: Sequence[int],
                    tokenizer: Any = None) -> list[dict[str, Any]]:
    """One JSON-ready record per problem: its samples (answer, verdict, tools, length; text with a tokenizer)."""
    records = []
    for i, problem in enumerate(problems):
        group = trajectories[i * n_samples:(i + 1) * n_samples]
        c = sum(bool(t.correct) for t in group)
        winner = majority_vote([t.pred for t in group])
        record = {"id": problem.id, "level": problem.level, "source": problem.source, "question": problem.question,
                  "gold": problem.answer, "n": n_samples, "num_correct": c,
                  "majority_answer": None if winner is None else group[winner].pred,
                  **{f"pass@{k}": pass_at_k(n_samples, c, k) for k in ks}, "samples": []}
        for t in group:
            sample = {"pred": t.pred, "correct": bool(t.correct), "reward": t.reward, "finish_reason": t.finish_reason,
                      "num_tool_calls": t.num_tool_calls, "tool_statuses": [c.status for c in t.tool_calls],
                      "completion_tokens": len(t.completion_ids)}
            if tokenizer is not None:
                sample["response"] = tokenizer.decode(t.completion_ids)
            record["samples"].append(sample)
        records.append(record)
    return records


# --- outputs -------------------------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _fmt_ci(ci: Sequence[float] | None) -> str:
    return "-" if ci is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def render_report(metrics: dict[str, Any], config: dict[str, Any] | None = None) -> str:
    """The markdown report: headline accuracy, per-level table, tool statistics and the run's settings."""
    n, ks = metrics["n_samples"], metrics["ks"]
    columns = [f"mean@{n}", *(f"pass@{k}" for k in ks), *(f"maj@{k}" for k in ks)]
    lines = ["# ReTool-Env evaluation", ""]
    if config:
        lines += [f"Model `{config.get('model')}` ({config.get('backend')}) on `{config.get('dataset')}`: "
                  f"{metrics['num_problems']} problems x {n} samples, tool format `{config.get('tool_format')}`.", ""]
    lines += ["## Accuracy", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
              "| " + " | ".join(_fmt(metrics[c]) for c in columns) + " |", "",
              f"Standard error of mean@{n} over problems: {_fmt(metrics[f'mean@{n}_stderr'])}; 95% bootstrap interval: "
              f"{_fmt_ci(metrics[f'mean@{n}_ci95'])}; parse failures: {_fmt(metrics['parse_failure_rate'])}.", ""]
    if metrics["by_level"]:
        header = ["level", "problems", *columns, "code ratio", "calls/response"]
        lines += ["## By level", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for level, row in metrics["by_level"].items():
            cells = [level, row["num_problems"], *(row[c] for c in columns), row["tools"]["code_ratio"],
                     row["tools"]["tool_calls_per_response"]]
            lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
        lines.append("")
    lines += ["## Tool use", "", "| statistic | value |", "|---|---|"]
    lines += [f"| {name} | {_fmt(value)} |" for name, value in metrics["tools"].items()]
    lines += ["", "## Episodes", "", "| statistic | value |", "|---|---|"]
    for name in ("num_samples", "mean_reward", "mean_completion_tokens", "truncation_rate", "aborted"):
        lines.append(f"| {name} | {_fmt(metrics[name])} |")
    lines.append(f"| finish_reasons | {', '.join(f'{k}: {v}' for k, v in metrics['finish_reasons'].items())} |")
    if config:
        lines += ["", "## Settings", "", "```json", json.dumps(config, indent=2, default=str), "```"]
    return "\n".join(lines) + "\n"


def plot_accuracy(metrics: dict[str, Any], path: str | Path) -> None:
    """Bar chart of mean@n, pass@k and maj@k (largest k), overall and per level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n, k = metrics["n_samples"], metrics["ks"][-1]
    names = [f"mean@{n}", f"pass@{k}", f"maj@{k}"]
    groups = {"all": metrics, **metrics["by_level"]}
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups) + 2), 4))
    for j, name in enumerate(names):
        ax.bar([i + j * width for i in range(len(groups))], [g[name] for g in groups.values()], width, label=name)
    ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(groups))], list(groups), rotation=30,
                  ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(f"{metrics['num_problems']} problems x {n} samples")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(out: str | Path, metrics: dict[str, Any], records: Sequence[dict[str, Any]],
                  config: dict[str, Any] | None = None) -> Path:
    """per_problem.jsonl, metrics.json, report.md and accuracy.png under `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "per_problem.jsonl", "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    (out / "metrics.json").write_text(json.dumps({**metrics, "config": config or {}}, indent=2, default=str))
    (out / "report.md").write_text(render_report(metrics, config))
    plot_accuracy(metrics, out / "accuracy.png")
    return out


# --- the evaluation ------------------------------------------------------------------------------------------------


async def aevaluate(
    problems: Sequence[Any],
    generator: Any,
    tokenizer: Any,
    *,
    n_samples: int = 1,
    ks: Sequence[int] | None = None,
    sampling: Any = None,
    out: str | Path | None = None,
    concurrency: int = 64,
    episode_timeout: float | None = None,
    progress: bool = True,
    save_responses: bool = True,
    config: dict[str, Any] | None = None,
    **env_kwargs: Any,
) -> dict[str, Any]:
    """`evaluate` for a running event loop (an `AsyncLLM` engine, a notebook)."""
    problems = list(problems)
    ks = sorted(set(ks or default_ks(n_samples)))
    make_env = make_env_factory(tokenizer=tokenizer, dataset=problems, **env_kwargs)
    trajectories = await run_episodes(problems, make_env, generator, n_per_problem=n_samples,
                                      concurrency=concurrency, sampling=sampling or SamplingParams(),
                                      episode_timeout=episode_timeout, progress=progress)
    metrics = compute_metrics(problems, trajectories, n_samples, ks)
    if out is not None:
        records = problem_records(problems, trajectories, n_samples, ks, tokenizer if save_responses else None)
        write_outputs(out, metrics, records, config)
    return metrics


def evaluate(problems: Sequence[Any], generator: Any, tokenizer: Any, **kwargs: Any) -> dict[str, Any]:
    """Play `n_samples` episodes of each problem with `generator` and return the metrics dict (`compute_metrics`);
    with `out`, also write per_problem.jsonl, metrics.json, report.md and accuracy.png there.

    Keyword arguments: n_samples, ks, sampling (`retool_env.rollout.SamplingParams`), out, concurrency,
    episode_timeout, progress, save_responses, config (recorded in the outputs), and `ToolEnvironment` arguments
    (tool_format, prompt, reward, sandbox, budgets).
    """
    return asyncio.run(aevaluate(problems, generator, tokenizer, **kwargs))


# --- two arms: the same model with and without the tool -----------------------------------------------------------

ARMS = ("tool", "no_tool")
NO_TOOL_PROMPT = "plain"  # the problem and "Put your final answer in \boxed{}.": no word about code or tools


def without_tools(tool_format: str | ToolFormat, tokenizer: Any) -> ToolFormat:
    """The arm's tool format with its tools taken away: the prompt advertises none, the parser stays the same, so a
    call the model writes anyway is recorded (and, with `max_tool_calls=0`, ends the episode unrun)."""
    base = (type(tool_format) if isinstance(tool_format, ToolFormat)
            else format_class(resolve_tool_format(tool_format, tokenizer)))

    class NoTools(base):  # type: ignore[misc, valid-type]
        system_prompt = None  # nor in the system message

        @property
        def tools(self) -> None:
            return None

    NoTools.__name__ = NoTools.__qualname__ = f"{base.__name__}WithoutTools"
    return NoTools(tokenizer)


def arm_env_kwargs(arm: str, tokenizer: Any, env_kwargs: dict[str, Any],
                   no_tool_prompt: str = NO_TOOL_PROMPT) -> dict[str, Any]:
    """`ToolEnvironment` arguments of one arm: `tool` as given; `no_tool` with no tool in the prompt (the format's
    tools removed, `no_tool_prompt` in place of a prompt that describes the interpreter) and no call allowed."""
    if arm == "tool":
        return dict(env_kwargs)
    if arm != "no_tool":
        raise ValueError(f"unknown arm {arm!r}; choose from {ARMS}")
    chat_tokenizer = with_chat_template(tokenizer, env_kwargs.get("chat_template"))
    return {**env_kwargs, "tool_format": without_tools(env_kwargs.get("tool_format", "hermes"), chat_tokenizer),
            "prompt": no_tool_prompt, "max_tool_calls": 0}


def arm_difference(tool: dict[str, Any], no_tool: dict[str, Any]) -> dict[str, Any]:
    """Tool minus no tool on the same problems: mean@n and its paired bootstrap interval (the per-problem
    differences resampled together, so problem difficulty cancels)."""
    n = tool["n_samples"]
    diffs = [a - b for a, b in zip(tool["per_problem_accuracy"], no_tool["per_problem_accuracy"], strict=True)]
    return {f"mean@{n}": tool[f"mean@{n}"] - no_tool[f"mean@{n}"], f"mean@{n}_ci95": bootstrap_ci(diffs),
            "problems_better_with_tool": sum(d > 0 for d in diffs),
            "problems_better_without_tool": sum(d < 0 for d in diffs)}


async def aevaluate_arms(benchmarks: dict[str, Sequence[Any]], generator: Any, tokenizer: Any, *,
                         arms: Sequence[str] = ARMS, no_tool_prompt: str = NO_TOOL_PROMPT,
                         out: str | Path | None = None, config: dict[str, Any] | None = None,
                         **kwargs: Any) -> dict[str, Any]:
    """`evaluate_arms` for a running event loop."""
    results: dict[str, Any] = {}
    env_kwargs = {k: v for k, v in kwargs.items() if k not in _RUN_OPTIONS}
    run_options = {k: v for k, v in kwargs.items() if k in _RUN_OPTIONS}
    for name, problems in benchmarks.items():
        results[name] = {}
        for arm in arms:
            arm_out = None if out is None else Path(out) / name / arm
            arm_config = {**(config or {}), "benchmark": name, "arm": arm}
            results[name][arm] = await aevaluate(problems, generator, tokenizer, out=arm_out, config=arm_config,
                                                 **run_options, **arm_env_kwargs(arm, tokenizer, env_kwargs,
                                                                                 no_tool_prompt))
        if {"tool", "no_tool"} <= set(arms):
            results[name]["difference"] = arm_difference(results[name]["tool"], results[name]["no_tool"])
    if out is not None:
        write_arms_outputs(out, results, config)
    return results


_RUN_OPTIONS = frozenset({"n_samples", "ks", "sampling", "concurrency", "episode_timeout", "progress",
                          "save_responses"})


def evaluate_arms(benchmarks: dict[str, Sequence[Any]], generator: Any, tokenizer: Any,
                  **kwargs: Any) -> dict[str, Any]:
    """Evaluate every benchmark (a name -> problems mapping) in the tool and the no-tool arm, with the same problems,
    n and sampling seeds, and return `{benchmark: {"tool": metrics, "no_tool": metrics, "difference": ...}}`.

    Keyword arguments: those of `evaluate` (n_samples, ks, sampling, concurrency, ..., and `ToolEnvironment`
    arguments for the tool arm), `arms` (default both), `no_tool_prompt` (default "plain") and `out`: then each arm
    writes its own outputs under `out/<benchmark>/<arm>/`, and `out` gets `report.md` (the arms side by side),
    `metrics.json` and `arms.png`.
    """
    return asyncio.run(aevaluate_arms(benchmarks, generator, tokenizer, **kwargs))


def render_arms_report(results: dict[str, Any], config: dict[str, Any] | None = None) -> str:
    """The two-arm markdown report: accuracy with 95% intervals, the difference, tool use, the protocol."""
    config = config or {}
    first = next(iter(next(iter(results.values())).values()))
    n, ks = first["n_samples"], first["ks"]
    k = ks[-1]
    lines = ["# ReTool-Env evaluation: with and without the tool", ""]
    if config:
        lines += [f"Model `{config.get('model')}` ({config.get('backend')}), {n} samples per problem, tool format "
                  f"`{config.get('tool_format')}`; the no-tool arm has no tool in its prompt (prompt "
                  f"`{config.get('no_tool_prompt', NO_TOOL_PROMPT)}`) and no call allowed. Both arms: the same "
                  f"problems, n, sampling (temperature {config.get('temperature')}, top_p {config.get('top_p')}) and "
                  f"seed ({config.get('seed')}; unseeded when none).", ""]
    protocol = config.get("protocol")
    if protocol:
        lines += [f"Protocol `{protocol['name']}`: {protocol['source']}", ""]
        lines += [f"- {note}" for note in protocol.get("notes", [])] + [""] * bool(protocol.get("notes"))
        differences = protocol.get("differences", {})
        lines += [("**Differs from the protocol:** " + ", ".join(
            f"`{name}={d['value']}` (protocol: `{d['protocol']}`; {d['set_by']})" for name, d in differences.items())
            + ".") if differences else "Every setting that changes a score is the protocol's.", ""]
    header = ["benchmark", "arm", "problems", f"mean@{n} [95% CI]", f"pass@{k}", f"maj@{k}", "parse failures",
              "truncated"]
    lines += ["## Accuracy", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, arms in results.items():
        for arm, m in ((a, m) for a, m in arms.items() if a in ARMS):
            cells = [name, arm, m["num_problems"], f"{_fmt(m[f'mean@{n}'])} {_fmt_ci(m[f'mean@{n}_ci95'])}",
                     m[f"pass@{k}"], m[f"maj@{k}"], m["parse_failure_rate"], m["truncation_rate"]]
            lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    diffs = {name: arms["difference"] for name, arms in results.items() if "difference" in arms}
    if diffs:
        lines += ["", "## Tool minus no tool (paired over problems)", "",
                  f"| benchmark | mean@{n} difference [95% CI] | problems better with tool | better without |",
                  "|---|---|---|---|"]
        for name, d in diffs.items():
            lines.append(f"| {name} | {_fmt(d[f'mean@{n}'])} {_fmt_ci(d[f'mean@{n}_ci95'])} | "
                         f"{d['problems_better_with_tool']} | {d['problems_better_without_tool']} |")
    columns = ["code_ratio", "tool_calls_per_response", "call_attempt_rate", "tool_error_rate", "tool_timeout_rate",
               "invalid_call_rate", "accuracy_with_tool", "accuracy_without_tool"]
    lines += ["", "## Tool use", "", "| benchmark | arm | " + " | ".join(columns) + " |",
              "|---|---|" + "---|" * len(columns)]
    for name, arms in results.items():
        for arm, m in ((a, m) for a, m in arms.items() if a in ARMS):
            lines.append(f"| {name} | {arm} | " + " | ".join(_fmt(m["tools"][c]) for c in columns) + " |")
    more = [f"pass@{j}" for j in ks] + [f"maj@{j}" for j in ks]
    lines += ["", "## pass@k and maj@k", "", "| benchmark | arm | " + " | ".join(more) + " |",
              "|---|---|" + "---|" * len(more)]
    for name, arms in results.items():
        for arm, m in ((a, m) for a, m in arms.items() if a in ARMS):
            lines.append(f"| {name} | {arm} | " + " | ".join(_fmt(m[c]) for c in more) + " |")
    if config:
        lines += ["", "## Settings", "", "```json", json.dumps(config, indent=2, default=str), "```"]
    return "\n".join(lines) + "\n"


def plot_arms(results: dict[str, Any], path: str | Path) -> None:
    """mean@n per benchmark, one bar per arm, with the 95% bootstrap interval as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    arms = [a for a in ARMS if all(a in results[name] for name in names)]
    n = results[names[0]][arms[0]]["n_samples"]
    width = 0.8 / len(arms)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(names) + 2), 4))
    for j, arm in enumerate(arms):
        values = [results[name][arm][f"mean@{n}"] for name in names]
        cis = [results[name][arm][f"mean@{n}_ci95"] or [v, v] for name, v in zip(names, values, strict=True)]
        errors = [[v - lo for v, (lo, _) in zip(values, cis, strict=True)],
                  [hi - v for v, (_, hi) in zip(values, cis, strict=True)]]
        bars = ax.bar([i + j * width for i in range(len(names))], values, width, yerr=errors, capsize=3,
                      label=arm.replace("_", " "))
        ax.bar_label(bars, fmt="%.2f", padding=2, fontsize=8)
    ax.set_xticks([i + width * (len(arms) - 1) / 2 for i in range(len(names))], names, rotation=30, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"mean@{n} (95% bootstrap CI)")
    ax.set_title("With and without the tool")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_arms_outputs(out: str | Path, results: dict[str, Any], config: dict[str, Any] | None = None) -> Path:
    """report.md, metrics.json and arms.png under `out` (each arm's own outputs are in `out/<benchmark>/<arm>/`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps({"benchmarks": results, "config": config or {}}, indent=2,
                                                 default=str))
    (out / "report.md").write_text(render_arms_report(results, config))
    plot_arms(results, out / "arms.png")
    return out
