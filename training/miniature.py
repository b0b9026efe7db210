"""ReTool in miniature: cold-start SFT, then GRPO with a Python interpreter, on a CPU in minutes.

The whole ReTool pipeline at toy scale, through the code a GPU run uses: a small tokenizer and a ~0.38M-parameter Qwen2
(head_dim 64, so vLLM loads it too) are built offline; procedural problems come at five levels (`easy` sums a model
can do in its head, and four hard levels one line of Python solves: see `training/miniature_data.py`); cold-start
trajectories (direct answers, code, and code that fails and is fixed) train the model with `training/sft_trl.py`;
GRPO runs through `accelerate launch training/grpo_trl.py`, the environment as TRL's rollout function; held-out
problems are evaluated per level with `training/eval.py`'s `evaluate` (after SFT, every `eval_every` GRPO steps from
the checkpoints, after RL), sampled at the rollouts' temperature: the policy RL trains, not its greedy mode, which a
model this small reaches long before its samples are reliable. Two arms share model size and budgets:

* `tool`: the interpreter is available; the reward is ReTool's (`retool`) minus `tool_call_cost` per call, so a
  call that is not needed (`70 + 3`) costs a little and using the tool becomes a decision.
* `text`: no interpreter. The cold start is the tool arm's without its code solutions (the direct answers only),
  trained for as many steps, and the environment allows no tool call (`max_tool_calls=0`: a call ends the episode
  unanswered). Both arms see the same `plain` prompt, which mentions no tool: at this scale a model cannot read
  instructions, and what it knows of the tool comes from its cold start.

    bash scripts/miniature.sh                  # one seed, both arms (about 13 minutes on 2 cores)
    bash scripts/miniature.sh --seeds 3        # mean and spread over three seeds
    bash scripts/miniature.sh --smoke          # the pipeline end to end in under 3 minutes (CI)

Writes `runs/miniature-<timestamp>/` (or `--out`): `metrics.jsonl` (every evaluation per level, every RL step),
`report.md` (per-level tables before SFT, after SFT and after RL for both arms, held-out results against RL steps,
the targets, self-correcting trajectories), `summary.json`, plots (`accuracy.png`, `code_use.png`, `heldout.png`,
`rl_curves.png`), and per seed and arm the
data, the SFT and GRPO models and configs, their logs and the evaluations' per-problem samples.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # training/ helpers, when run as a script


@dataclass
class Arguments:
    out: str | None = field(default=None, metadata={"help": "Run folder (default: runs/miniature-<timestamp>)."})
    seeds: int = field(default=1, metadata={"help": "Run the whole pipeline for seeds seed, seed+1, ..."})
    seed: int = field(default=0, metadata={"help": "First seed."})
    smoke: bool = field(default=False, metadata={"help": "Tiny everything: checks the pipeline end to end (< 3 min)."})
    arms: str = field(default="tool,text", metadata={"help": "Comma-separated arms to run: tool, text."})
    # data
    train_per_level: int = field(default=400, metadata={"help": "Training problems per level."})
    test_per_level: int = field(default=40, metadata={"help": "Held-out problems per level."})
    text_share_easy: float = field(default=0.9, metadata={"help": "Cold start: share of easy problems answered "
                                                                   "directly (the rest use code, self-correcting "
                                                                   "first). At 0.8, RL's early push toward code on "
                                                                   "hard problems spread to easy ones in two seeds "
                                                                   "of three (BENCHMARKS.md)."})
    text_share_hard: float = field(default=0.4, metadata={"help": "Cold start: share of hard problems answered "
                                                                   "directly (unlearnable: a guess). RL has to "
                                                                   "learn that these need the interpreter; more "
                                                                   "guesses leave RL more to add to the same "
                                                                   "copying skill."})
    self_correct_share: float = field(default=0.15, metadata={"help": "Cold start: share whose first code fails "
                                                                       "and is fixed."})
    # model
    vocab_size: int = field(default=400, metadata={"help": "BPE vocabulary (digits stay single characters)."})
    hidden_size: int = field(default=128, metadata={"help": "Model width; heads are 64 wide."})
    num_layers: int = field(default=2, metadata={"help": "Transformer layers."})
    num_kv_heads: int = field(default=2, metadata={"help": "Key/value heads (one per query head). With one shared "
                                                           "by both, copying digits formed as late as SFT step 670 "
                                                           "in three seeds; with two, by step 410 (BENCHMARKS.md)."})
    # cold-start SFT
    sft_epochs: float = field(default=7.0, metadata={"help": "Epochs over the tool arm's cold start; the text arm "
                                                              "takes as many steps. Copying the interpreter's "
                                                              "digits forms suddenly, at a seed-dependent step "
                                                              "(230-380 of these 875 in the seeds measured)."})
    sft_batch_size: int = field(default=16, metadata={"help": "SFT batch size."})
    sft_learning_rate: float = field(default=1e-3, metadata={"help": "SFT learning rate (constant after 10 warm-up steps: copying digits emerges only after enough steps at full rate)."})
    # GRPO
    rl_steps: int = field(default=120, metadata={"help": "GRPO steps (one optimizer step per generation batch)."})
    rl_prompts_per_step: int = field(default=4, metadata={"help": "Distinct problems per GRPO step."})
    num_generations: int = field(default=8, metadata={"help": "Episodes per problem (the GRPO group)."})
    rl_learning_rate: float = field(default=3e-4, metadata={"help": "GRPO peak learning rate (linear decay to 0)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of RL rollouts."})
    scale_rewards: str = field(default="batch", metadata={"help": "GRPO advantage scaling (TRL's): batch, group or "
                                                                   "none. Scaled per group, the shaping's +0.05 for a "
                                                                   "second failed call becomes a full advantage where "
                                                                   "every episode is wrong, and a level the model "
                                                                   "cannot yet solve turns into two garbage calls."})
    # environment
    tool_call_cost: float = field(default=0.05, metadata={"help": "Reward subtracted per executed tool call; below "
                                                                  "the `retool` shaping's +0.1, so a failed call "
                                                                  "still beats a wrong guess."})
    max_tool_calls: int = field(default=2, metadata={"help": "Tool calls per episode (tool arm)."})
    max_turn_tokens: int = field(default=48, metadata={"help": "Tokens the model may write per turn."})
    max_completion_tokens: int = field(default=160, metadata={"help": "Tokens per episode after the prompt."})
    max_observation_tokens: int = field(default=48, metadata={"help": "Tokens of interpreter output shown."})
    # evaluation
    eval_samples: int = field(default=4, metadata={"help": "Samples per held-out problem (mean@k)."})
    eval_temperature: float = field(default=1.0, metadata={"help": "Evaluation sampling temperature: the policy RL "
                                                                     "trains, sampled as in rollouts."})
    eval_every: int = field(default=30, metadata={"help": "Evaluate a GRPO checkpoint every this many steps."})

    def apply_smoke(self) -> None:
        """Shrink everything so the pipeline runs end to end in well under 3 minutes."""
        self.train_per_level, self.test_per_level = 24, 4
        self.num_layers, self.sft_epochs, self.rl_steps, self.rl_prompts_per_step = 2, 1.0, 2, 2
        self.num_generations, self.eval_samples, self.eval_every = 4, 2, 1


def env_settings(args: Arguments, arm: str) -> dict:
    """The environment both SFT replay, GRPO and evaluation use; the text arm has no interpreter."""
    return {"tool_format": "retool", "prompt": "plain", "reward": "retool",
            "reward_kwargs": {"tool_call_cost": args.tool_call_cost},
            "max_tool_calls": args.max_tool_calls if arm == "tool" else 0,
            "max_completion_tokens": args.max_completion_tokens,
            "max_observation_tokens": args.max_observation_tokens,
            "max_turn_tokens": args.max_turn_tokens, "tool_timeout": 5.0}


def write_yaml(path: Path, config: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_logged(cmd: list[str], log: Path) -> None:
    """Run a stage in its own process (as on a cluster); its output goes to the terminal and to `log`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
           "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            f.write(line)
            sys.stdout.write(line)
        if proc.wait():
            raise RuntimeError(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}); see {log}")


def run_sft(args: Arguments, arm: str, model_dir: Path, data: Path, out: Path, seed: int, steps: int) -> Path:
    """Cold-start SFT with training/sft_trl.py: solutions replayed through the environment, interpreter masked."""
    env = env_settings(args, arm)
    config = {
        "dataset": str(data), "tool_format": env["tool_format"], "prompt": env["prompt"],
        "max_tool_calls": max(env["max_tool_calls"], 2), "max_completion_tokens": env["max_completion_tokens"],
        "max_observation_tokens": env["max_observation_tokens"],
        "model_name_or_path": str(model_dir), "dtype": "float32", "attn_implementation": "eager",
        "output_dir": str(out), "use_cpu": True, "bf16": False, "seed": seed,
        "max_steps": steps, "per_device_train_batch_size": args.sft_batch_size,
        "learning_rate": args.sft_learning_rate, "lr_scheduler_type": "constant_with_warmup", "warmup_steps": 10,
        "max_length": 256, "gradient_checkpointing": False,  # on by default in TRL; a tiny model only pays for it
        "logging_steps": 10, "save_strategy": "no", "report_to": "none",
    }
    yaml_path = write_yaml(out.parent / "sft.yaml", config)
    run_logged([sys.executable, "training/sft_trl.py", "--config", str(yaml_path)], out.parent / "sft.log")
    return out


def run_grpo(args: Arguments, arm: str, model_dir: Path, problems: Path, out: Path, seed: int) -> Path:
    """GRPO through the real TRL path: `accelerate launch training/grpo_trl.py`, the environment as rollout_func."""
    env = env_settings(args, arm)
    config = {
        "dataset": str(problems), "tool_format": env["tool_format"], "prompt": env["prompt"],
        "reward": env["reward"], "reward_kwargs": json.dumps(env["reward_kwargs"]),
        "max_tool_calls": env["max_tool_calls"], "max_observation_tokens": env["max_observation_tokens"],
        "max_turn_tokens": env["max_turn_tokens"], "tool_timeout": env["tool_timeout"],
        "model_name_or_path": str(model_dir), "dtype": "float32", "attn_implementation": "eager",
        "output_dir": str(out), "use_cpu": True, "bf16": False, "gradient_checkpointing": False, "seed": seed,
        "max_steps": args.rl_steps, "per_device_train_batch_size": args.rl_prompts_per_step * args.num_generations,
        "num_generations": args.num_generations, "max_completion_length": env["max_completion_tokens"],
        "temperature": args.temperature, "learning_rate": args.rl_learning_rate, "lr_scheduler_type": "linear",
        "beta": 0.0, "scale_rewards": args.scale_rewards, "epsilon": 0.2, "epsilon_high": 0.28,
        "logging_steps": 1, "report_to": "none",
        "save_strategy": "steps", "save_steps": args.eval_every, "save_only_model": True,  # held-out curve
    }
    yaml_path = write_yaml(out.parent / "grpo.yaml", config)
    run_logged([sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no", "training/grpo_trl.py",
                "--config", str(yaml_path)], out.parent / "grpo.log")
    return out


def evaluate_model(args: Arguments, arm: str, model_dir: Path, problems: list, out: Path,
                   n_samples: int | None = None) -> dict:
    """Sampled evaluation on held-out problems, per level (training/eval.py's `evaluate`)."""
    from eval import evaluate
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from retool_adapters.generators import HFGenerator
    from retool_env.rollout import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    return evaluate(problems, HFGenerator(model, tokenizer), tokenizer, n_samples=n_samples or args.eval_samples,
                    sampling=SamplingParams(temperature=args.eval_temperature), out=out, concurrency=64, progress=True,
                    config={"model": str(model_dir), "backend": "hf", "dataset": "miniature test", "arm": arm,
                            "tool_format": "retool"},
                    **env_settings(args, arm))


def level_rows(metrics: dict) -> dict[str, dict]:
    """Per level (and `all`, `hard`): accuracy, code use, accuracy when the tool is called, problems."""
    from miniature_data import HARD_LEVELS

    mean_at_n = f"mean@{metrics['n_samples']}"

    def row(m: dict) -> dict:
        return {"accuracy": m[mean_at_n], "accuracy_stderr": m.get(f"{mean_at_n}_stderr"),
                "code_use": m["tools"]["code_ratio"],
                "accuracy_with_tool": m["tools"]["accuracy_with_tool"], "problems": m["num_problems"],
                "completion_tokens": m["mean_completion_tokens"]}

    rows = {level: row(m) for level, m in metrics["by_level"].items()}
    rows["all"] = row(metrics)
    hard = [rows[level] for level in HARD_LEVELS if level in rows]
    n = sum(r["problems"] for r in hard)
    stderrs = [r["accuracy_stderr"] for r in hard]
    rows["hard"] = {"accuracy": sum(r["accuracy"] * r["problems"] for r in hard) / n,
                    "accuracy_stderr": None if None in stderrs else  # levels are independent samples
                    math.sqrt(sum((r["problems"] / n * se) ** 2 for r, se in zip(hard, stderrs, strict=True))),
                    "code_use": sum((r["code_use"] or 0) * r["problems"] for r in hard) / n,
                    "problems": n}
    return rows


def rl_curve(grpo_dir: Path) -> list[dict]:
    """Per-step training metrics of the GRPO run (TRL's log history)."""
    history = json.loads((grpo_dir / "trainer_state.json").read_text())["log_history"]
    keys = {"reward": "reward", "retool/accuracy": "accuracy", "retool/used_tool": "code_use",
            "retool/turns": "turns", "retool/response_length": "response_length",
            "retool/tool_error_rate": "tool_error_rate", "retool/tool_calls_per_episode": "tool_calls"}
    return [{"step": h["step"], **{name: h[key] for key, name in keys.items() if key in h}}
            for h in history if "retool/accuracy" in h]


def checkpoints(grpo_dir: Path, before: int) -> list[tuple[int, Path]]:
    """(step, folder) of the GRPO checkpoints saved before the last step, in order."""
    found = [(int(d.name.split("-")[1]), d) for d in grpo_dir.glob("checkpoint-*") if d.is_dir()]
    return sorted((step, d) for step, d in found if step < before)


# --- one seed ------------------------------------------------------------------------------------------------------

def run_seed(args: Arguments, seed: int, out: Path, log) -> dict:
    """Build, cold-start, train and evaluate both arms for one seed; returns {arm: {stage: rows}, curves, heldout}."""
    from miniature_data import make_problems, tokenizer_corpus, write_problems

    from retool_adapters.offline_models import build_tiny_qwen
    from retool_env.data import load_problems
    from retool_env.offline import tiny_tokenizer

    seed_dir = out / f"seed{seed}"
    seed_dir.mkdir(parents=True, exist_ok=True)

    # 1. Problems: held-out test first, then training problems that never repeat a hard test question.
    test = make_problems(args.test_per_level, seed=10_000 + seed)
    train = make_problems(args.train_per_level, seed=seed, exclude={p.question for p in test})
    train_path, test_path = write_problems(train, seed_dir / "train.jsonl"), write_problems(test, seed_dir / "test.jsonl")
    test = load_problems(test_path)

    # 2. Tokenizer and model: a BPE without digit merges, a small random Qwen2 (same weights for both arms).
    tokenizer = tiny_tokenizer(args.vocab_size, tokenizer_corpus(train))
    init_dir = build_tiny_qwen(seed_dir / "model-init", tokenizer, hidden_size=args.hidden_size,
                               num_layers=args.num_layers, num_heads=args.hidden_size // 64,
                               num_kv_heads=args.num_kv_heads, seed=seed,
                               initializer_range=0.02)  # Qwen's own scale; the default (10x) learned slower here

    results: dict = {"seed": seed, "curves": {}, "heldout": {}}
    for arm in args.arms.split(","):
        results[arm], results["curves"][arm], results["heldout"][arm] = run_arm(
            args, seed, arm, seed_dir / arm, init_dir, train, train_path, test, log)
    return results


def run_arm(args: Arguments, seed: int, arm: str, arm_dir: Path, init_dir: Path, train: list, train_path: Path,
            test: list, log) -> tuple[dict, list[dict], list[dict]]:
    """Cold start, SFT, GRPO and held-out evaluations of one arm: (rows per stage, RL training curve, held-out
    evaluations against RL steps: after SFT, every `eval_every` steps, after RL)."""
    from miniature_data import coldstart_kinds, write_coldstart

    shutil.rmtree(arm_dir, ignore_errors=True)  # a rerun into the same folder must not evaluate stale checkpoints
    arm_dir.mkdir()
    shares = {"easy": (args.text_share_easy, args.self_correct_share),
              "hard": (args.text_share_hard, args.self_correct_share)}
    problems, kinds = train, coldstart_kinds(train, shares, seed)
    if arm == "text":  # the same cold start without the solutions that use code
        problems, kinds = zip(*[(p, k) for p, k in zip(train, kinds, strict=True) if k == "text"], strict=True)
    print(f"\n== seed {seed} / {arm}: cold-start data (code runs in the sandbox) ==", flush=True)
    counts = write_coldstart(problems, kinds, arm_dir / "coldstart.jsonl", seed)
    log({"seed": seed, "arm": arm, "event": "coldstart", "kinds": counts})

    def evaluate_stage(stage: str, model_dir: Path, train_s: float = 0.0, step: int | None = None) -> dict:
        print(f"\n== seed {seed} / {arm}: evaluate {stage} ==", flush=True)
        t0 = time.time()
        n_samples = 1 if stage == "before_sft" else None  # a random model: one sample shows it knows nothing
        rows = level_rows(evaluate_model(args, arm, model_dir, test, arm_dir / f"eval-{stage}", n_samples))
        log({"seed": seed, "arm": arm, "event": "eval", "stage": stage, "step": step,
             "train_seconds": round(train_s, 1), "eval_seconds": round(time.time() - t0, 1), "levels": rows})
        return rows

    stages = {"before_sft": evaluate_stage("before_sft", init_dir)}
    print(f"\n== seed {seed} / {arm}: cold-start SFT ==", flush=True)
    t0 = time.time()
    # Both arms take the same number of SFT steps: `sft_epochs` over the tool arm's (larger) cold start.
    steps = math.ceil(args.sft_epochs * len(train) / args.sft_batch_size)
    sft_dir = run_sft(args, arm, init_dir, arm_dir / "coldstart.jsonl", arm_dir / "sft", seed, steps)
    stages["after_sft"] = evaluate_stage("after_sft", sft_dir, time.time() - t0, step=0)
    print(f"\n== seed {seed} / {arm}: GRPO ({args.rl_steps} steps) ==", flush=True)
    t0 = time.time()
    grpo_dir = run_grpo(args, arm, sft_dir, train_path, arm_dir / "grpo", seed)
    train_s = time.time() - t0
    curve = rl_curve(grpo_dir)
    for point in curve:
        log({"seed": seed, "arm": arm, "event": "rl_step", **point})
    heldout = [{"step": 0, "levels": stages["after_sft"]}]
    for step, checkpoint in checkpoints(grpo_dir, before=args.rl_steps):
        heldout.append({"step": step, "levels": evaluate_stage(f"rl_step{step}", checkpoint, step=step)})
    stages["after_rl"] = evaluate_stage("after_rl", grpo_dir, train_s, step=args.rl_steps)
    heldout.append({"step": args.rl_steps, "levels": stages["after_rl"]})
    return stages, curve, heldout


# --- report --------------------------------------------------------------------------------------------------------

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


def self_correction_samples(out: Path, limit: int = 3) -> list[str]:
    """Evaluation samples whose first tool call failed and which called the tool again (correct ones first, latest
    stage first); where evaluation shows none, one cold-start example, labelled as such, shows the pattern taught."""
    fixed, retried = [], []
    for stage in ("after_rl", "after_sft"):
        for path in sorted(out.glob(f"seed*/tool/eval-{stage}/per_problem.jsonl")):
            for line in path.read_text().splitlines():
                record = json.loads(line)
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
            for line in path.read_text().splitlines():
                messages = json.loads(line)["messages"]
                if "Fix the typo." in messages[1]["content"]:
                    found.append(f"No evaluation sample retried after an error; a cold-start example of the "
                                 f"pattern: **{messages[0]['content']}**\n```\n{messages[1]['content']}\n```")
                    break
    return found


def write_report(args: Arguments, out: Path, results: list[dict], wall_s: float) -> None:
    lines = ["# ReTool in miniature", "",
             f"Command: `bash scripts/miniature.sh {' '.join(sys.argv[1:])}`  ", f"Wall time: {wall_s / 60:.1f} min "
             f"({len(results)} seed(s), arms {args.arms}); machine: {os.cpu_count()} CPUs.", "",
             f"Accuracy (mean@{args.eval_samples}) and code-use rate per level on held-out problems, "
             f"{args.eval_samples} samples each at temperature {args.eval_temperature}, the policy RL trains; "
             "one sample before SFT; mean ± standard deviation over seeds.", ""]
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


def main(args: Arguments) -> Path:
    if args.smoke:
        args.apply_smoke()
    out = Path(args.out or ROOT / "runs" / f"miniature-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with open(out / "metrics.jsonl", "w") as metrics_file:

        def log(record: dict) -> None:
            metrics_file.write(json.dumps({"time_s": round(time.time() - start, 1), **record}) + "\n")
            metrics_file.flush()

        log({"event": "config", **asdict(args)})
        results = [run_seed(args, seed, out, log) for seed in range(args.seed, args.seed + args.seeds)]
        wall = time.time() - start
        log({"event": "done", "wall_seconds": round(wall, 1)})
    (out / "summary.json").write_text(json.dumps({"wall_seconds": wall, "results": results,
                                                  "criteria": [criteria(r) for r in results]}, indent=2))
    write_report(args, out, results, wall)
    plot(out, results, args.arms.split(","))
    print(f"\nDone in {wall / 60:.1f} min: {out / 'report.md'}")
    return out


if __name__ == "__main__":
    import torch
    from transformers import HfArgumentParser

    torch.set_num_threads(1)
    (arguments,) = HfArgumentParser(Arguments).parse_args_into_dataclasses()
    main(arguments)
