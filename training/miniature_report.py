"""The miniature's report and plots (`training/miniature.py`): per-level rows of an evaluation, the targets, the
markdown report and the figures. Nothing here trains or evaluates; it reads what the pipeline measured."""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from retool_env.evaluation import CORRECTION_COUNTS, binomial_stderr, correction_rates

# Counts of recovery from injected faults (`fault_recovery`); pooling groups means summing these.
FAULT_COUNTS = ("responses_with_fault", "recovered", "retried")
NOT_RUN = ("invalid", "skipped")


def fault_rates(counts: dict[str, int]) -> dict[str, float | int | None]:
    """`fault_recovery`'s rates and their binomial standard errors from its counts."""
    out: dict[str, float | int | None] = {name: counts[name] for name in FAULT_COUNTS}
    whole = counts["responses_with_fault"]
    for rate, part in (("recovered_rate", "recovered"), ("retried_rate", "retried")):
        out[rate] = counts[part] / whole if whole else None
        out[f"{rate}_stderr"] = binomial_stderr(counts[part], whole)
    return out


def fault_recovery(samples: list[dict]) -> dict[str, float | int | None]:
    """Self-correction on recoverable failures: of the responses (evaluation samples of `per_problem.jsonl`) with a
    call refused by the injected faults (`EnvConfig.fault_rate`: status `sandbox_error`, which the real sandbox
    never returns in a working set-up), the share that called again after the first refusal (`retried`) and the
    share that ended correct after a call that ran after it (`recovered`: an answer from an earlier call's output,
    or a guess, is not a recovery). Unlike the errors of the model's own code, these cannot be foreseen and can
    always be recovered from by reading the message and calling again."""
    counts = dict.fromkeys(FAULT_COUNTS, 0)
    for sample in samples:
        statuses = [str(s) for s in sample["tool_statuses"]]
        if "sandbox_error" not in statuses:
            continue
        first = statuses.index("sandbox_error")
        counts["responses_with_fault"] += 1
        later = statuses[first + 1:]
        counts["retried"] += any(s not in NOT_RUN for s in later)
        counts["recovered"] += bool(sample["correct"]) and any(s not in (*NOT_RUN, "sandbox_error") for s in later)
    return fault_rates(counts)


def with_fault_recovery(metrics: dict, per_problem: Path) -> dict:
    """`metrics` with `fault_recovery` overall and per level, from the evaluation's per-problem samples."""
    records = _jsonl(per_problem)
    metrics["fault_recovery"] = fault_recovery([s for r in records for s in r["samples"]])
    for level, level_metrics in metrics.get("by_level", {}).items():
        level_metrics["fault_recovery"] = fault_recovery([s for r in records if r.get("level") == level
                                                          for s in r["samples"]])
    return metrics


def level_rows(metrics: dict) -> dict[str, dict]:
    """Per level (and `all`, and `hard`: every level but `easy`, pooled): accuracy, code use, accuracy when the
    tool is called, problems, self-correction (`retool_env.evaluation.self_correction`; None in metrics from before
    it was measured)."""
    mean_at_n = f"mean@{metrics['n_samples']}"

    def row(m: dict) -> dict:
        tools = m["tools"]
        # Binomial over the responses with a call that ran (the samples of one problem counted as independent).
        with_tool = round((tools["code_ratio"] or 0) * tools.get("responses", 0))
        return {"accuracy": m[mean_at_n], "accuracy_stderr": m.get(f"{mean_at_n}_stderr"),
                "code_use": tools["code_ratio"], "accuracy_with_tool": tools["accuracy_with_tool"],
                "accuracy_with_tool_stderr": binomial_stderr(round((tools["accuracy_with_tool"] or 0) * with_tool),
                                                             with_tool), "problems": m["num_problems"],
                "completion_tokens": m["mean_completion_tokens"], "self_correction": m.get("self_correction"),
                "fault_recovery": m.get("fault_recovery")}

    rows = {level: row(m) for level, m in metrics["by_level"].items()}
    rows["all"] = row(metrics)
    hard = [row for level, row in rows.items() if level not in ("easy", "all")]
    n = sum(r["problems"] for r in hard)
    stderrs = [r["accuracy_stderr"] for r in hard]
    corrections = [r["self_correction"] for r in hard]
    faults = [r["fault_recovery"] for r in hard]
    rows["hard"] = {"accuracy": sum(r["accuracy"] * r["problems"] for r in hard) / n,
                    "accuracy_stderr": None if None in stderrs else  # levels are independent samples
                    math.sqrt(sum((r["problems"] / n * se) ** 2 for r, se in zip(hard, stderrs, strict=True))),
                    "code_use": sum((r["code_use"] or 0) * r["problems"] for r in hard) / n,
                    "problems": n,
                    "self_correction": None if None in corrections else pooled_correction(corrections),
                    "fault_recovery": None if None in faults else
                    fault_rates({name: sum(f[name] for f in faults) for name in FAULT_COUNTS})}
    return rows


def pooled_correction(groups: list[dict]) -> dict:
    """Self-correction of several groups together: their counts summed, the rates recomputed (not averaged), so a
    level with few failing responses weighs little."""
    return correction_rates({name: sum(g[name] for g in groups) for name in CORRECTION_COUNTS})


def drop_over_last(heldout: list[dict], window: int = 30) -> float | None:
    """How far held-out accuracy ends below its best over the last `window` RL steps (checkpoints included); None
    when the run is shorter than the window."""
    last = heldout[-1]["step"] if heldout else 0
    if last < window:
        return None
    return max(p["levels"]["all"]["accuracy"] for p in heldout if p["step"] >= last - window) - \
        heldout[-1]["levels"]["all"]["accuracy"]


RECOVERY_TARGET = "hard: recovered after an injected fault, RL - SFT > 2 SE"
WITH_TOOL_TARGET = "accuracy when the tool is called: RL - SFT > 2 SE"
ALL_TARGET = "all: accuracy RL - SFT > 2 SE"


def gain(before: float | None, after: float | None, stderrs: tuple[float | None, float | None]
         ) -> tuple[float | None, float | None]:
    """after - before and its standard error (the two evaluations are independent samples); (None, None) when either
    value or standard error is unknown."""
    if before is None or after is None or None in stderrs:
        return None, None
    return after - before, math.hypot(*stderrs)  # type: ignore[arg-type]  # None excluded above


def stage_gain(result: dict, level: str, key: str, stderr_key: str) -> tuple[float | None, float | None]:
    """The tool arm's `key` on `level`, after RL minus after SFT, with its standard error."""
    sft, rl = (result["tool"][stage][level] for stage in ("after_sft", "after_rl"))
    return gain(sft.get(key), rl.get(key), (sft.get(stderr_key), rl.get(stderr_key)))


def recovery_gain(result: dict) -> tuple[float | None, float | None]:
    """The tool arm's recovered rate after an injected fault (`fault_recovery`) on the hard levels, after RL minus
    after SFT, and its standard error; (None, None) when either stage has no response with a fault (a run with
    `fault_rate` 0)."""
    sft, rl = (result["tool"][stage]["hard"].get("fault_recovery") or {} for stage in ("after_sft", "after_rl"))
    return gain(sft.get("recovered_rate"), rl.get("recovered_rate"),
                (sft.get("recovered_rate_stderr"), rl.get("recovered_rate_stderr")))


def criteria(result: dict) -> list[tuple[str, float | None, bool | None, float | None]]:
    """The issue's targets for one seed: (name, measured value, met, the value's standard error where it is a gain).
    A gain is met when RL is above SFT by more than two standard errors: a fixed gain would punish a strong cold
    start and reward a weak one."""
    tool, text = result.get("tool"), result.get("text")
    out = []

    def check(name: str, value: float | None, ok: bool | None, stderr: float | None = None) -> None:
        out.append((name, value, ok if value is not None else None, stderr))

    def check_gain(name: str, found: tuple[float | None, float | None]) -> None:
        value, stderr = found
        check(name, value, value is not None and stderr is not None and value > 2 * stderr, stderr)

    if tool:
        rl = tool["after_rl"]
        check("hard: code use after RL >= 0.95", rl["hard"]["code_use"], rl["hard"]["code_use"] >= 0.95)
        check("hard: accuracy after RL >= 0.90", rl["hard"]["accuracy"], rl["hard"]["accuracy"] >= 0.90)
        easy_code = rl["easy"]["code_use"] or 0.0
        check("easy: code use after RL <= 0.30", easy_code, easy_code <= 0.30)
        check("easy: accuracy after RL >= 0.90", rl["easy"]["accuracy"], rl["easy"]["accuracy"] >= 0.90)
        check_gain(WITH_TOOL_TARGET, stage_gain(result, "all", "accuracy_with_tool", "accuracy_with_tool_stderr"))
        check_gain(ALL_TARGET, stage_gain(result, "all", "accuracy", "accuracy_stderr"))
        drop = drop_over_last(result.get("heldout", {}).get("tool", []))
        check("tool RL: held-out accuracy drop over the last 30 steps <= 0.05", drop, drop is not None and drop <= 0.05)
        check_gain(RECOVERY_TARGET, recovery_gain(result))
    if tool and text:
        gap = tool["after_rl"]["hard"]["accuracy"] - text["after_rl"]["hard"]["accuracy"]
        check("hard: tool RL - text RL >= +0.50", gap, gap >= 0.50)
        easy = text["after_rl"]["easy"]["accuracy"]
        check("easy: text RL accuracy > 0", easy, easy > 0)
    return out


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


STAGES = ("before_sft", "after_sft", "after_rl")


def level_table(results: list[dict], arm: str) -> list[str]:
    """Markdown rows: per level, accuracy / code use (mean, and spread over seeds) at each stage."""
    levels = list(results[0][arm]["after_rl"])
    lines = ["| level | " + " | ".join(f"{s} acc | {s} code" for s in STAGES) + " | after_rl acc w/ tool |",
             "|---|" + "---|---|" * len(STAGES) + "---|"]
    for level in levels:
        cells = [level]
        for stage in STAGES:
            for key in ("accuracy", "code_use"):
                cells.append(spread([r[arm][stage][level].get(key) for r in results]))
        cells.append(spread([r[arm]["after_rl"][level].get("accuracy_with_tool") for r in results]))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def correction_table(results: list[dict], arm: str) -> list[str]:
    """Markdown rows: per level, the recovered and fixed rates (mean ± sd over seeds) at each stage; n counts the
    responses with a failed call, summed over seeds, which the rates are shares of."""
    lines = ["| level | " + " | ".join(f"{s} recovered (n) | {s} fixed" for s in STAGES) + " |",
             "|---|" + "---|---|" * len(STAGES)]
    for level in results[0][arm]["after_rl"]:
        cells = [level]
        for stage in STAGES:
            found = [r[arm][stage][level].get("self_correction") or {} for r in results]
            n = sum(c.get("responses_with_failure") or 0 for c in found)
            cells += [f"{spread([c.get('recovered_rate') for c in found])} (n={n})",
                      spread([c.get("fixed_rate") for c in found])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def fault_table(results: list[dict], arm: str) -> list[str]:
    """Markdown rows: per level, the recovered and retried rates after an injected fault (mean ± sd over seeds) at
    each stage; n counts the responses with a fault, summed over seeds."""
    lines = ["| level | " + " | ".join(f"{s} recovered (n) | {s} retried" for s in STAGES) + " |",
             "|---|" + "---|---|" * len(STAGES)]
    for level in results[0][arm]["after_rl"]:
        cells = [level]
        for stage in STAGES:
            found = [r[arm][stage][level].get("fault_recovery") or {} for r in results]
            n = sum(c.get("responses_with_fault") or 0 for c in found)
            cells += [f"{spread([c.get('recovered_rate') for c in found])} (n={n})",
                      spread([c.get("retried_rate") for c in found])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def recovery_gain_line(results: list[dict]) -> str:
    """The hard levels' recovered rate after an injected fault, after RL minus after SFT (tool arm): per seed with
    its standard error, and the mean over seeds with the standard error of that mean across seeds."""
    gains = [(r["seed"], *recovery_gain(r)) for r in results]
    per_seed = ", ".join(f"seed {seed} {_signed(gain)} ± {_fmt(se)}" for seed, gain, se in gains)
    values = [gain for _, gain, _ in gains if gain is not None]
    mean = statistics.mean(values) if values else None
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) >= 2 else None
    return (f"Hard levels, recovered rate after an injected fault, after RL - after SFT (tool arm): {per_seed}; "
            f"mean over {len(values)} seed(s) {_signed(mean)} ± {_fmt(se)}.")


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def _higher_is_better(target: str) -> bool:
    """Each target states its direction in its name (`>=`, `>` or `<=`)."""
    return "<=" not in target


def seed_summary(results: list[dict]) -> list[dict]:
    """Per target, across seeds: mean and standard deviation of the measured value, the worst seed (lowest value,
    or highest for a `<=` target) and how many seeds met it; seeds where the value is unknown are left out of the
    statistics but not of `seeds`."""
    table = [criteria(r) for r in results]
    summary = []
    for i, (name, *_) in enumerate(table[0]):
        measured = [(r["seed"], value) for r, t in zip(results, table, strict=True) if (value := t[i][1]) is not None]
        values = [v for _, v in measured]
        pick = min if _higher_is_better(name) else max
        worst = pick(measured, key=lambda sv: sv[1]) if measured else (None, None)
        summary.append({"target": name, "mean": statistics.mean(values) if values else None,
                        "sd": statistics.stdev(values) if len(values) >= 2 else None,
                        "worst_seed": worst[0], "worst_value": worst[1],
                        "met": sum(bool(t[i][2]) for t in table), "seeds": len(results)})
    return summary


def heldout_table(results: list[dict]) -> list[str]:
    """Markdown rows: held-out accuracy and code use against RL steps, per arm (mean over seeds)."""
    lines = ["## Held-out evaluation during RL", "",
             "| arm | step | all acc | acc w/ tool | hard acc | hard code | easy acc | easy code |",
             "|---|---|---|---|---|---|---|---|"]
    for arm in results[0].get("heldout", {}):
        for point in results[0]["heldout"][arm]:
            cells = [arm, str(point["step"])]
            same_step = [p for r in results for p in r["heldout"][arm] if p["step"] == point["step"]]
            for level, key in (("all", "accuracy"), ("all", "accuracy_with_tool"), ("hard", "accuracy"),
                               ("hard", "code_use"), ("easy", "accuracy"), ("easy", "code_use")):
                cells.append(spread([p["levels"][level].get(key) for p in same_step]))
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def spread(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def _jsonl(path: Path) -> list[dict]:
    """One record per line. Not `splitlines()`: model text kept unescaped (ensure_ascii=False) may hold U+2028 or
    U+0085, which it treats as line ends."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]


def self_correction_samples(out: Path, limit: int = 3) -> list[str]:
    """Evaluation samples whose first tool call failed and which called the tool again (correct ones first, latest
    stage first); where evaluation shows none, one cold-start example, labelled as such, shows the pattern taught."""
    fixed: list[Any] = []
    retried: list[Any] = []
    for stage in ("after_rl", "after_sft"):
        for path in sorted(out.glob(f"seed*/tool/eval-{stage}/per_problem.jsonl")):
            for record in _jsonl(path):
                for sample in record["samples"]:
                    statuses = sample["tool_statuses"]
                    if len(statuses) > 1 and statuses[0] != "ok":
                        verdict = "correct" if sample["correct"] else "wrong"
                        text = (f"{stage}, {path.parts[-4]}, {verdict}: **{record['question']}** (gold "
                                f"{record['gold']})\n```\n{sample.get('response', '')}\n```")
                        (fixed if sample["correct"] and statuses[-1] == "ok" else retried).append(text)
    found = (fixed + retried)[:limit]
    if not found:
        for path in sorted(out.glob("seed*/tool/coldstart.jsonl"))[:1]:
            for record in _jsonl(path):
                messages = record["messages"]
                if "Fix the typo." in messages[1]["content"]:
                    found.append(f"No evaluation sample retried after an error; a cold-start example of the "
                                 f"pattern: **{messages[0]['content']}**\n```\n{messages[1]['content']}\n```")
                    break
    return found


def write_report(args: Any, out: Path, results: list[dict], wall_s: float) -> None:
    lines = ["# ReTool in miniature", "",
             f"Command: `bash scripts/miniature.sh {' '.join(sys.argv[1:])}`  ", f"Wall time: {wall_s / 60:.1f} min "
             f"({len(results)} seed(s), arms {args.arms}); machine: {os.cpu_count()} CPUs.", "",
             f"Accuracy (mean@{args.eval_samples}) and code-use rate per level on held-out problems, "
             f"{args.eval_samples} samples each at temperature {args.eval_temperature}, the policy RL trains; "
             "one sample before SFT; mean ± standard deviation over seeds.", ""]
    if args.smoke:
        lines += ["**A smoke run** (`--smoke`): 2 RL steps on a 2-layer model, to check that every stage runs end to "
                  "end. Accuracies near 0 and targets \"not met\" are expected; run without `--smoke` to see learning.",
                  ""]
    for arm in args.arms.split(","):
        lines += [f"## Arm `{arm}`", "", *level_table(results, arm), ""]
    lines += ["## Targets", "", "| target | " + " | ".join(f"seed {r['seed']}" for r in results) + " |",
              "|---|" + "---|" * len(results)]
    table = [criteria(r) for r in results]
    for i, (name, *_) in enumerate(table[0]):
        cells = [f"{_fmt(value) if stderr is None else f'{_signed(value)} ± {stderr:.2f}'} "
                 f"{'met' if met else 'not met' if met is False else 'n/a'}" for _, value, met, stderr in
                 (t[i] for t in table)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Over seeds (worst: the lowest value, or the highest for a `<=` target):", "",
              "| target | mean | sd | worst seed | seeds met |", "|---|---|---|---|---|"]
    for t in seed_summary(results):
        worst = "-" if t["worst_seed"] is None else f"seed {t['worst_seed']}: {_fmt(t['worst_value'])}"
        lines.append(f"| {t['target']} | {_fmt(t['mean'])} | {_fmt(t['sd'])} | {worst} | {t['met']}/{t['seeds']} |")
    if all("tool" in r for r in results):
        noise = ", ".join(f"seed {r['seed']} hard ± {_fmt(r['tool']['after_rl']['hard']['accuracy_stderr'])} / all ± "
                          f"{_fmt(r['tool']['after_rl']['all']['accuracy_stderr'])}" for r in results)
        lines += ["", f"Standard error over problems of the tool arm's accuracy after RL: {noise}."]
    lines += ["", "Held-out accuracy drop: how far the final accuracy lies below the best checkpoint of the last 30 "
              "RL steps (n/a when the run is shorter).", "", *heldout_table(results), "", "## Self-correction", "",
              f"**On recoverable failures** (the target): calls refused before they ran by the injected faults "
              f"(`--fault_rate {args.fault_rate}`, a retryable message), which no model can foresee and any can "
              "recover from by calling again. Of the responses with one, the share that still ended correct "
              "(recovered) and the share that called again (retried); mean ± sd over seeds.", ""]
    if "tool" in args.arms.split(",") and any((r["tool"][s]["all"].get("fault_recovery") or {}).get(
            "responses_with_fault") for r in results for s in STAGES):
        lines += [*fault_table(results, "tool"), ""]
    else:
        lines += ["No call was refused in any evaluation of the tool arm.", ""]
    if all("tool" in r for r in results):
        lines += [recovery_gain_line(results), ""]
    lines += ["**On every failed call** (the model's own: an error, timeout, memory limit or signal, or code that "
              "ran but whose last printed line is not the gold answer; refusals not counted): the share of the "
              "responses with one that still ended correct (recovered), and of failed calls followed by another, the "
              "share whose next call ran and printed the gold answer (fixed); mean ± sd over seeds.", ""]
    for arm in args.arms.split(","):
        if any((r[arm][s]["all"].get("self_correction") or {}).get("responses_with_failure")
               for r in results for s in STAGES):
            lines += [f"Arm `{arm}`:", "", *correction_table(results, arm), ""]
        else:
            lines += [f"Arm `{arm}`: no failed tool call in any evaluation.", ""]
    lines += ["## Self-correction in evaluation samples", ""]
    lines += self_correction_samples(out) or ["(none found)"]
    lines += ["", "## Settings", "", "```json", json.dumps(asdict(args), indent=2), "```", ""]
    (out / "report.md").write_text("\n".join(lines))


def _stage_bars(ax: Any, results: list[dict], arm: str, levels: list[str], value: Any) -> None:
    """Bars per level, one per stage: `value(row)` averaged over seeds (0 where no seed measured it)."""
    width = 0.8 / len(STAGES)
    for j, stage in enumerate(STAGES):
        means = []
        for level in levels:
            found = [v for r in results if (v := value(r[arm][stage][level])) is not None]
            means.append(statistics.mean(found) if found else 0.0)
        ax.bar([i + j * width for i in range(len(levels))], means, width, label=stage)
    ax.set_xticks([i + width for i in range(len(levels))], levels, rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.legend()


def plot(out: Path, results: list[dict], arms: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(results[0][arms[0]]["after_rl"])
    for key, name in (("accuracy", "accuracy"), ("code_use", "code_use")):
        fig, axes = plt.subplots(1, len(arms), figsize=(6 * len(arms), 4), squeeze=False)
        for ax, arm in zip(axes[0], arms, strict=True):
            _stage_bars(ax, results, arm, levels, lambda row, key=key: row.get(key))
            ax.set_title(f"{arm} arm: {name.replace('_', ' ')} per level")
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=110)
        plt.close(fig)
    if "tool" in arms:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        _stage_bars(axes[0], results, "tool", levels,
                    lambda row: (row.get("fault_recovery") or {}).get("recovered_rate"))
        axes[0].set_title("tool arm: recovered after an injected fault, per level")
        _stage_bars(axes[1], results, "tool", levels,
                    lambda row: (row.get("self_correction") or {}).get("recovered_rate"))
        axes[1].set_title("tool arm: recovered after a failed call of its own, per level")
        fig.tight_layout()
        fig.savefig(out / "self_correction.png", dpi=110)
        plt.close(fig)
    heldout_keys = (("accuracy", "held-out accuracy"), ("code_use", "held-out code use"))
    fig, axes = plt.subplots(1, len(heldout_keys) + 1, figsize=(5 * (len(heldout_keys) + 1), 3.8))
    for r in results:
        for arm, points in r.get("heldout", {}).items():
            steps = [p["step"] for p in points]
            for ax, (key, title) in zip(axes, heldout_keys, strict=False):
                for level in ("easy", "hard", "all"):
                    ax.plot(steps, [p["levels"][level].get(key) or 0.0 for p in points],
                            label=f"{arm} {level} s{r['seed']}", linestyle="-" if arm == "tool" else ":")
                ax.set_title(f"RL: {title}")
            axes[-1].plot(steps, [p["levels"]["all"].get("accuracy_with_tool") for p in points],
                          label=f"{arm} s{r['seed']}")
    axes[-1].set_title("RL: held-out accuracy when the tool is called")
    for ax in axes:
        ax.set_xlabel("step")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "heldout.png", dpi=110)
    plt.close(fig)
    curve_keys = ("accuracy", "code_use", "reward", "turns", "response_length")
    fig, axes = plt.subplots(1, len(curve_keys), figsize=(4 * len(curve_keys), 3.5))
    for ax, key in zip(axes, curve_keys, strict=True):
        for r in results:
            for arm, curve in r.get("curves", {}).items():
                ax.plot([p["step"] for p in curve], [p.get(key) for p in curve], label=f"{arm} s{r['seed']}")
        ax.set_title(f"RL: {key}")
        ax.set_xlabel("step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "rl_curves.png", dpi=110)
    plt.close(fig)
