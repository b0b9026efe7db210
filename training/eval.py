"""Evaluate a tool-using math model with ReTool-Env: accuracy (mean@n, pass@k, maj@k), tool statistics, per level.

Every sample is one episode of `ToolEnvironment`, played by `retool_env.rollout.run_episodes` against a generation
backend from `retool_adapters.generators`: Hugging Face `generate` (`hf`), an in-process vLLM engine (`vllm`) or an
OpenAI-compatible completions server taking token-id prompts (`openai`: vLLM or SGLang serving the model).

    # Offline CPU smoke run: a tiny random Qwen2 on procedural problems (training/configs/eval_tiny_cpu.yaml)
    python training/eval.py

    # The paper's protocol on AIME 2024: 32 samples per problem, T=1.0, top-p 0.7, up to 16384 tokens, vLLM
    python training/eval.py --config training/configs/eval_qwen3_4b_aime24.yaml --model runs/sft-qwen3-4b-retool

Writes `<out>/per_problem.jsonl`, `<out>/report.md`, `<out>/metrics.json` and `<out>/accuracy.png`. From Python,
`evaluate(problems, generator, tokenizer, ...)` returns the metrics dict (and writes the same files when given `out`).

Metrics, over n samples of each problem: `mean@n` is the average accuracy of all samples (the paper's "avg@32");
`pass@k` is the unbiased estimator of Chen et al. (2021), 1 - C(n - c, k) / C(n, k) for c correct samples; `maj@k`
is the accuracy of the majority answer among the first k samples, answers grouped by `retool_env.grading`'s
normalisation and equivalence; `mean@n_stderr` is the standard error of `mean@n` over problems (the spread of
per-problem accuracy over the square root of the number of problems): the uncertainty of `mean@n` as an estimate of
accuracy on problems like these. An aborted episode (a backend failure) counts as a wrong sample and is reported.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

TINY_CPU_CONFIG = Path(__file__).parent / "configs" / "eval_tiny_cpu.yaml"
ERROR_STATUSES = ("error", "memory", "killed", "sandbox_error")


@dataclass
class ModelArguments:
    """What generates: the model and the backend serving it."""

    model: str | None = field(default=None, metadata={
        "help": "A model folder or Hub id (hf, vllm), or the served model name (openai). Unset with backend hf: a "
                "tiny random Qwen2 built offline, for smoke runs."})
    tokenizer: str | None = field(default=None, metadata={"help": "Tokenizer folder or id; default: the model's."})
    backend: str = field(default="hf", metadata={"help": "hf (transformers generate), vllm (in-process engine) or "
                                                         "openai (an OpenAI-compatible /v1/completions server)."})
    base_url: str | None = field(default=None, metadata={"help": "Server URL for backend openai, e.g. "
                                                                 "http://localhost:8000/v1."})
    dtype: str = field(default="auto", metadata={"help": "Weights dtype for hf and vllm (auto, bfloat16, float32)."})
    device: str | None = field(default=None, metadata={"help": "Device for backend hf (cpu, cuda); default: as "
                                                               "loaded."})
    tensor_parallel_size: int = field(default=1, metadata={"help": "vLLM tensor parallelism."})
    gpu_memory_utilization: float = field(default=0.85, metadata={"help": "vLLM GPU memory share."})
    max_model_len: int | None = field(default=None, metadata={"help": "vLLM context length (prompt + completion)."})


@dataclass
class DataArguments:
    """Which problems, and how many samples of each."""

    dataset: str = field(default="aime24", metadata={
        "help": "aime24, aime25, math500, arith (procedural), dapo, a local parquet/jsonl file, or a Hub id."})
    split: str | None = field(default=None, metadata={"help": "Split (arith: train or test); default: the "
                                                              "dataset's evaluation split."})
    limit: int | None = field(default=None, metadata={"help": "Evaluate at most this many problems."})
    levels: list[str] | None = field(default=None, metadata={"help": "Keep only problems of these levels."})
    n_samples: int = field(default=32, metadata={"help": "Samples per problem (n of mean@n and pass@k)."})
    ks: list[int] | None = field(default=None, metadata={"help": "k values of pass@k and maj@k; default: powers of "
                                                                 "two up to n_samples, and n_samples."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (the paper: 1.0)."})
    top_p: float = field(default=0.7, metadata={"help": "Nucleus sampling (the paper: 0.7)."})
    top_k: int = field(default=-1, metadata={"help": "Top-k sampling; -1 turns it off."})
    seed: int | None = field(default=0, metadata={"help": "Sampling seed (episode i uses seed + i) where the "
                                                          "backend supports it; unset for unseeded sampling."})


@dataclass
class EnvArguments:
    """The environment the model plays in: format, prompt, budgets, sandbox."""

    tool_format: str = field(default="hermes", metadata={"help": "hermes or retool."})
    prompt: str | None = field(default=None, metadata={"help": "Prompt template (retool, dapo, slime, plain); "
                                                               "default: the tool format's own."})
    reward: str = field(default="retool", metadata={"help": "Reward scheme (reported as mean_reward)."})
    max_tool_calls: int = field(default=16, metadata={"help": "Executed tool calls allowed per episode."})
    max_completion_tokens: int = field(default=16384, metadata={
        "help": "Token budget of an episode after the prompt, model and interpreter tokens together."})
    max_observation_tokens: int = field(default=512, metadata={"help": "Tokens of one interpreter output shown."})
    max_turn_tokens: int | None = field(default=None, metadata={"help": "Tokens the model may write per turn."})
    tool_timeout: float = field(default=10.0, metadata={"help": "Seconds one tool call may run."})
    sandbox: str = field(default="local", metadata={"help": "local or a SandboxFusion /run_code URL."})
    concurrency: int = field(default=64, metadata={"help": "Episodes in flight at once."})
    episode_timeout: float | None = field(default=None, metadata={"help": "Seconds an episode may take."})


@dataclass
class OutputArguments:
    """Where the results go."""

    out: str = field(default="runs/eval", metadata={"help": "Output folder."})
    save_responses: bool = field(default=True, metadata={"help": "Write each sample's text to per_problem.jsonl."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar."})


ARGUMENT_CLASSES = (ModelArguments, DataArguments, EnvArguments, OutputArguments)


# --- metrics -------------------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): the chance that k of the n samples, drawn without replacement, hold at
    least one of the c correct ones."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k}, n={n}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_vote(preds: Sequence[str | None]) -> int | None:
    """Index of a sample holding the most common answer (answers equal after normalisation or equivalent), the
    earliest cluster winning ties; None when no sample has an answer."""
    from retool_env.grading import is_equivalent, normalize_answer

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


def _tool_stats(trajectories: Sequence[Any]) -> dict[str, float | None]:
    """Tool use over responses (aborted episodes excluded): how often code is called, how it fails, and whether
    responses that call it are more accurate."""
    done = [t for t in trajectories if not t.aborted]
    calls = [c for t in done for c in t.tool_calls if c.status not in ("invalid", "skipped")]
    with_tool = [t for t in done if t.num_tool_calls > 0]
    without_tool = [t for t in done if t.num_tool_calls == 0]
    attempted = sum(len(t.tool_calls) for t in done)

    def share(part: int, whole: int) -> float | None:
        return part / whole if whole else None

    return {
        "responses": len(done),
        "code_ratio": share(len(with_tool), len(done)),
        "tool_calls_per_response": share(sum(t.num_tool_calls for t in done), len(done)),
        "tool_error_rate": share(sum(c.status in ERROR_STATUSES for c in calls), len(calls)),
        "tool_timeout_rate": share(sum(c.status == "timeout" for c in calls), len(calls)),
        "invalid_call_rate": share(sum(c.status == "invalid" for t in done for c in t.tool_calls), attempted),
        "accuracy_with_tool": share(sum(bool(t.correct) for t in with_tool), len(with_tool)),
        "accuracy_without_tool": share(sum(bool(t.correct) for t in without_tool), len(without_tool)),
    }


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
    summary["tools"] = _tool_stats(trajectories)
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
    from retool_env.data import LEVELS

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
    from retool_env.env import make_env_factory
    from retool_env.rollout import SamplingParams, run_episodes

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


def load_generator(args: ModelArguments, out: str | Path) -> tuple[Any, Any]:
    """The generator and tokenizer for a backend; heavy imports happen only for the backend asked for."""
    from transformers import AutoTokenizer

    if args.backend == "hf":
        from transformers import AutoModelForCausalLM

        from retool_adapters.generators import HFGenerator

        if args.model is None:  # a smoke run anywhere: a tiny random model, built offline
            from retool_adapters.offline_models import build_tiny_qwen

            args.model = str(build_tiny_qwen(Path(out) / "tiny-model"))
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=args.dtype)
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
        return HFGenerator(model, tokenizer, device=args.device), tokenizer
    if args.model is None:
        raise ValueError(f"backend {args.backend!r} needs --model (the model folder, Hub id or served name)")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    if args.backend == "vllm":
        import vllm

        from retool_adapters.generators import VLLMEngineGenerator

        engine = vllm.LLM(model=args.model, tokenizer=args.tokenizer or args.model, dtype=args.dtype,
                          tensor_parallel_size=args.tensor_parallel_size, max_model_len=args.max_model_len,
                          gpu_memory_utilization=args.gpu_memory_utilization)
        return VLLMEngineGenerator(engine), tokenizer
    if args.backend == "openai":
        from retool_adapters.generators import OpenAICompletionsGenerator

        if not args.base_url:
            raise ValueError("backend openai needs --base_url, e.g. http://localhost:8000/v1")
        return OpenAICompletionsGenerator(args.base_url, args.model), tokenizer
    raise ValueError(f"unknown backend {args.backend!r}; choose hf, vllm or openai")


def parse_args(argv: Sequence[str]) -> tuple[ModelArguments, DataArguments, EnvArguments, OutputArguments]:
    """The four argument dataclasses from `--config file.yaml` (optional) and the command line, which wins."""
    import argparse

    import yaml
    from transformers import HfArgumentParser

    parser = HfArgumentParser(ARGUMENT_CLASSES, description="Evaluate a tool-using math model with ReTool-Env.")
    parser.add_argument("--config", default=None, help="A YAML file of any of the arguments below.")
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, _ = pre.parse_known_args(argv)
    if known.config:
        config = yaml.safe_load(Path(known.config).read_text()) or {}
        unknown = set(config) - {f.name for cls in ARGUMENT_CLASSES for f in fields(cls)}
        if unknown:
            raise ValueError(f"{known.config}: unknown arguments {sorted(unknown)}")
        parser.set_defaults(**config)
    *parsed, _ = parser.parse_args_into_dataclasses(list(argv))  # the last is the namespace holding --config
    return tuple(parsed)  # type: ignore[return-value]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point (also `retool-env eval`); no arguments at all: the offline CPU smoke run."""
    from retool_env.data import arith_split, load_problems
    from retool_env.rollout import SamplingParams

    argv = list(sys.argv[1:] if argv is None else argv) or ["--config", str(TINY_CPU_CONFIG)]
    model_args, data_args, env_args, output_args = parse_args(argv)

    # 1. The problems (procedural ones from their held-out test split unless told otherwise).
    if data_args.dataset == "arith":
        problems = arith_split(data_args.split or "test", data_args.limit, data_args.levels)
    else:
        problems = load_problems(data_args.dataset, split=data_args.split)
        problems = [p for p in problems if not data_args.levels or p.level in data_args.levels][:data_args.limit]
    if not problems:
        raise ValueError(f"no problems in {data_args.dataset!r} (split {data_args.split}, levels {data_args.levels})")

    # 2. The backend.
    generator, tokenizer = load_generator(model_args, output_args.out)

    # 3. Play and score: n samples of each problem, every one a full episode with the interpreter.
    config = {**asdict(model_args), **asdict(data_args), **asdict(env_args), **asdict(output_args),
              "num_problems": len(problems)}
    metrics = evaluate(
        problems, generator, tokenizer,
        n_samples=data_args.n_samples,
        ks=data_args.ks,
        sampling=SamplingParams(temperature=data_args.temperature, top_p=data_args.top_p, top_k=data_args.top_k,
                                seed=data_args.seed),
        out=output_args.out,
        concurrency=env_args.concurrency,
        episode_timeout=env_args.episode_timeout,
        progress=output_args.progress,
        save_responses=output_args.save_responses,
        config=config,
        tool_format=env_args.tool_format,
        prompt=env_args.prompt,
        reward=env_args.reward,
        sandbox=env_args.sandbox,
        max_tool_calls=env_args.max_tool_calls,
        max_completion_tokens=env_args.max_completion_tokens,
        max_observation_tokens=env_args.max_observation_tokens,
        max_turn_tokens=env_args.max_turn_tokens,
        tool_timeout=env_args.tool_timeout,
    )
    n, k = data_args.n_samples, metrics["ks"][-1]
    print(f"{metrics['num_problems']} problems x {n}: mean@{n} {metrics[f'mean@{n}']:.3f}, pass@{k} "
          f"{metrics[f'pass@{k}']:.3f}, maj@{k} {metrics[f'maj@{k}']:.3f}, code ratio "
          f"{_fmt(metrics['tools']['code_ratio'])}; report: {Path(output_args.out) / 'report.md'}")
    return metrics


if __name__ == "__main__":
    main()
