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
Tool use comes from `Trajectory.tool_stats` (see `tool_use`). With `out`, the evaluation writes
`per_problem.jsonl`, `metrics.json`, `report.md` and `accuracy.png` (matplotlib, imported only then).
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

from retool_env.data import LEVELS
from retool_env.env import make_env_factory
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
        key = normalize_answer(pred)[0]
        for cluster, other in zip(clusters, keys, strict=True):
            if key == other or is_equivalent(pred, preds[cluster[0]]):
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
    not an error here); `invalid_call_rate`: invalid calls over every call written.
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


def _summary(groups: Sequence[tuple[Any, list[Any]]], n: int, ks: Sequence[int]) -> dict[str, Any]:
    """mean@n, pass@k, maj@k, rewards, lengths and tool statistics over (problem, its n trajectories) groups."""
    trajectories = [t for _, group in groups for t in group]
    summary: dict[str, Any] = {"num_problems": len(groups), "num_samples": len(trajectories)}
    correct = [[bool(t.correct) for t in group] for _, group in groups]
    summary[f"mean@{n}"] = sum(sum(c) / n for c in correct) / len(groups) if groups else 0.0
    summary[f"mean@{n}_stderr"] = _stderr([sum(c) / n for c in correct])
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
    metrics = {"n_samples": n_samples, "ks": ks, **_summary(groups, n_samples, ks)}
    by_level: dict[str, list] = defaultdict(list)
    for problem, group in groups:
        if problem.level is not None:
            by_level[str(problem.level)].append((problem, group))
    metrics["by_level"] = {level: _summary(by_level[level], n_samples, ks) for level in _level_order(by_level)}
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
              f"Standard error of mean@{n} over problems: {_fmt(metrics[f'mean@{n}_stderr'])}.", ""]
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
