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


def level_rows(metrics: dict) -> dict[str, dict]:
    """Per level (and `all`, and `hard`: every level but `easy`, pooled): accuracy, code use, accuracy when the
    tool is called, problems."""
    mean_at_n = f"mean@{metrics['n_samples']}"

    def row(m: dict) -> dict:
        return {"accuracy": m[mean_at_n], "accuracy_stderr": m.get(f"{mean_at_n}_stderr"),
                "code_use": m["tools"]["code_ratio"],
                "accuracy_with_tool": m["tools"]["accuracy_with_tool"], "problems": m["num_problems"],
                "completion_tokens": m["mean_completion_tokens"]}

    rows = {level: row(m) for level, m in metrics["by_level"].items()}
    rows["all"] = row(metrics)
    hard = [row for level, row in rows.items() if level not in ("easy", "all")]
    n = sum(r["problems"] for r in hard)
    stderrs = [r["accuracy_stderr"] for r in hard]
    rows["hard"] = {"accuracy": sum(r["accuracy"] * r["problems"] for r in hard) / n,
                    "accuracy_stderr": None if None in stderrs else  # levels are independent samples
                    math.sqrt(sum((r["problems"] / n * se) ** 2 for r, se in zip(hard, stderrs, strict=True))),
                    "code_use": sum((r["code_use"] or 0) * r["problems"] for r in hard) / n,
                    "problems": n}
    return rows


def drop_over_last(heldout: list[dict], window: int = 30) -> float | None:
    """How far held-out accuracy ends below its best over the last `window` RL steps (checkpoints included); None
    when the run is shorter than the window."""
    last = heldout[-1]["step"] if heldout else 0
    if last < window:
        return None
    return max(p["levels"]["all"]["accuracy"] for p in heldout if p["step"] >= last - window) - \
        heldout[-1]["levels"]["all"]["accuracy"]


def criteria(result: dict) -> list[tuple[str, float | None, bool | None]]:
    """The issue's targets for one seed: (name, measured value, met)."""
    tool, text = result.get("tool"), result.get("text")
    out = []

    def check(name: str, value: float | None, ok: bool | None) -> None:
        out.append((name, value, ok if value is not None else None))

    if tool:
        rl, sft = tool["after_rl"], tool["after_sft"]
        check("hard: code use after RL >= 0.95", rl["hard"]["code_use"], rl["hard"]["code_use"] >= 0.95)
        check("hard: accuracy after RL >= 0.90", rl["hard"]["accuracy"], rl["hard"]["accuracy"] >= 0.90)
        easy_code = rl["easy"]["code_use"] or 0.0
        check("easy: code use after RL <= 0.30", easy_code, easy_code <= 0.30)
        check("easy: accuracy after RL >= 0.90", rl["easy"]["accuracy"], rl["easy"]["accuracy"] >= 0.90)
        with_tool = [s["all"]["accuracy_with_tool"] for s in (sft, rl)]
        gain = None if None in with_tool else with_tool[1] - with_tool[0]
        check("accuracy when the tool is called: RL - SFT >= +0.10", gain, gain is not None and gain >= 0.10)
        gain = rl["all"]["accuracy"] - sft["all"]["accuracy"]
        check("all: accuracy RL - SFT >= +0.30", gain, gain >= 0.30)
        drop = drop_over_last(result.get("heldout", {}).get("tool", []))
        check("tool RL: held-out accuracy drop over the last 30 steps <= 0.05", drop, drop is not None and drop <= 0.05)
    if tool and text:
        gap = tool["after_rl"]["hard"]["accuracy"] - text["after_rl"]["hard"]["accuracy"]
        check("hard: tool RL - text RL >= +0.50", gap, gap >= 0.50)
        easy = text["after_rl"]["easy"]["accuracy"]
        check("easy: text RL accuracy > 0", easy, easy > 0)
    return out


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def level_table(results: list[dict], arm: str) -> list[str]:
    """Markdown rows: per level, accuracy / code use (mean, and spread over seeds) at each stage."""
    levels = list(results[0][arm]["after_rl"])
    stages = ("before_sft", "after_sft", "after_rl")
    lines = ["| level | " + " | ".join(f"{s} acc | {s} code" for s in stages) + " | after_rl acc w/ tool |",
             "|---|" + "---|---|" * len(stages) + "---|"]
    for level in levels:
        cells = [level]
        for stage in stages:
            for key in ("accuracy", "code_use"):
                cells.append(spread([r[arm][stage][level].get(key) for r in results]))
        cells.append(spread([r[arm]["after_rl"][level].get("accuracy_with_tool") for r in results]))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


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
    fixed, retried = [], []
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
    for i, (name, _, _) in enumerate(table[0]):
        cells = [f"{_fmt(t[i][1])} {'met' if t[i][2] else 'not met' if t[i][2] is False else 'n/a'}" for t in table]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if all("tool" in r for r in results):
        noise = ", ".join(f"seed {r['seed']} hard ± {_fmt(r['tool']['after_rl']['hard']['accuracy_stderr'])} / all ± "
                          f"{_fmt(r['tool']['after_rl']['all']['accuracy_stderr'])}" for r in results)
        lines += ["", f"Standard error over problems of the tool arm's accuracy after RL: {noise}."]
    lines += ["", "Held-out accuracy drop: how far the final accuracy lies below the best checkpoint of the last 30 "
              "RL steps (n/a when the run is shorter).", "", *heldout_table(results), "",
              "## Self-correction in evaluation samples", ""]
    lines += self_correction_samples(out) or ["(none found)"]
    lines += ["", "## Settings", "", "```json", json.dumps(asdict(args), indent=2), "```", ""]
    (out / "report.md").write_text("\n".join(lines))


def plot(out: Path, results: list[dict], arms: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = ("before_sft", "after_sft", "after_rl")
    for key, name in (("accuracy", "accuracy"), ("code_use", "code_use")):
        levels = list(results[0][arms[0]]["after_rl"])
        fig, axes = plt.subplots(1, len(arms), figsize=(6 * len(arms), 4), squeeze=False)
        for ax, arm in zip(axes[0], arms, strict=True):
            width = 0.8 / len(stages)
            for j, stage in enumerate(stages):
                values = [statistics.mean([r[arm][stage][lv].get(key) or 0.0 for r in results]) for lv in levels]
                ax.bar([i + j * width for i in range(len(levels))], values, width, label=stage)
            ax.set_xticks([i + width for i in range(len(levels))], levels, rotation=30, ha="right")
            ax.set_ylim(0, 1.05)
            ax.set_title(f"{arm} arm: {name.replace('_', ' ')} per level")
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=110)
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
