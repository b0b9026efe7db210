"""ReTool in miniature: cold-start SFT, then GRPO with a Python interpreter, on a CPU in minutes.

The whole ReTool pipeline at toy scale, through the code a GPU run uses: a small tokenizer and a ~0.54M-parameter Qwen2
(head_dim 64, so vLLM loads it too) are built offline; procedural problems come at five levels (`easy` sums a model
can do in its head, and four hard levels one line of Python solves: see `training/miniature_data.py`); cold-start
trajectories (direct answers, code, and code that fails and is fixed) train the model with `training/sft_trl.py`;
GRPO runs through `accelerate launch training/grpo_trl.py`, the environment as TRL's rollout function; held-out
problems are evaluated per level with `retool_env.evaluation.evaluate` (after SFT, every `eval_every` GRPO steps from
the checkpoints, after RL), sampled at the rollouts' temperature: the policy RL trains, not its greedy mode, which a
model this small reaches long before its samples are reliable. Two arms share model size and budgets:

* `tool`: the interpreter is available; the reward is ReTool's (`retool`) minus `tool_call_cost` per call, so a
  call that is not needed (`70 + 3`) costs a little and using the tool becomes a decision.
* `text`: no interpreter. The cold start is the tool arm's without its code solutions (the direct answers only),
  trained for as many steps, and the environment allows no tool call (`max_tool_calls=0`: a call ends the episode
  unanswered). Both arms see the same `plain` prompt, which mentions no tool: at this scale a model cannot read
  instructions, and what it knows of the tool comes from its cold start.

    bash scripts/miniature.sh                  # one seed, both arms (about 15 minutes on 2 cores)
    bash scripts/miniature.sh --seeds 3        # mean and spread over three seeds
    bash scripts/miniature.sh --seed_list 0 1 2 --out runs/sweep  # these seeds; the same command resumes
    bash scripts/miniature.sh --smoke          # the pipeline end to end in about a minute (CI)

Writes `runs/miniature-<timestamp>/` (or `--out`): `seed<k>.json` per seed as it finishes (its settings and results;
a rerun with the same settings skips it), `metrics.jsonl` (every evaluation per level, every RL step), `report.md`
(per-level tables, held-out results against RL steps, the targets per seed and over seeds, self-correction),
`summary.json`, plots (`accuracy.png`, `code_use.png`, `self_correction.png`, `heldout.png`, `rl_curves.png`), and
per seed and arm the data, models, configs, logs and per-problem samples.

Everything random derives from `--seed`: problems, cold-start kinds and typos, tokenizer and weights, SFT order, GRPO
rollouts (`ReToolRollout` seeds each episode from GRPOConfig's seed and the step) and evaluation samples (each its own
seed, from the seed and the stage). Seeded requests sample the same tokens however they are batched (keyed noise and
fixed shapes in `HFGenerator`), so two runs of one command on one machine give identical metrics.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from miniature_report import criteria, level_rows, plot, with_fault_recovery, write_report  # training/

from retool_env.config import EnvConfig
from retool_env.rollout import derive_seed

ROOT = Path(__file__).resolve().parent.parent


# The miniature's environment: the paper's format, small budgets (every EnvConfig field is a flag as well). A fifth
# of the tool calls are refused before they run (`fault_rate`), a failure any model can recover from by reading the
# interpreter, so every run measures self-correction; three calls, so that a retry refused again can still recover,
# and the tokens three digit-sum calls and the answer need.
MINIATURE_ENV = EnvConfig.with_defaults(tool_format="retool", prompt="plain", max_tool_calls=3, max_turn_tokens=48,
                                        max_completion_tokens=192, max_observation_tokens=48, fault_rate=0.2)


@dataclass
class Arguments(MINIATURE_ENV):  # type: ignore[misc,valid-type]  # a dataclass built at import time (with_defaults)
    out: str | None = field(default=None, metadata={
        "help": "Run folder; none: runs/miniature-<timestamp>. A rerun into a folder skips the seeds whose "
        "seed<k>.json it holds (same settings only)."})
    seeds: int = field(default=1, metadata={"help": "Run seeds --seed, --seed + 1, ... (this many). Range: 1 or more."})
    seed: int = field(default=0, metadata={"help": "First seed. Range: any integer."})
    seed_list: list[int] | None = field(default=None, metadata={
        "help": "The seeds to run, in order (e.g. --seed_list 0 1 2), one combined report; replaces --seed and "
        "--seeds. Range: distinct integers."})
    smoke: bool = field(default=False, metadata={
        "help": "Tiny everything (a few SFT and GRPO steps): checks the pipeline end to end in about a minute; "
        "learns nothing."})
    arms: str = field(default="tool,text", metadata={"help": "Comma-separated arms to run. Range: tool, text or both."})
    parallel_arms: bool = field(default=True, metadata={
        "help": "Run a seed's arms side by side, each in its own process (same metrics as one after the other; "
        "--no_parallel_arms for that)."})
    records: bool = field(default=False, metadata={
        "help": "Record every RL episode of the tool arm in seed<k>/tool/records.jsonl (retool-env regrade)."})
    # data
    train_per_level: int = field(default=400, metadata={"help": "Training problems per level. Range: 1 or more."})
    test_per_level: int = field(default=40, metadata={"help": "Held-out problems per level. Range: 1 or more."})
    text_share_easy: float = field(default=0.9, metadata={
        "help": "Cold start: share of easy problems answered directly (the rest use code, self-correcting "
        "first). Range: 0-1."})
    text_share_hard: float = field(default=0.4, metadata={
        "help": "Cold start: share of hard problems answered directly (a guess), which RL has to learn need the "
        "interpreter. Range: 0-1."})
    self_correct_share: float = field(default=0.15, metadata={
        "help": "Cold start: share whose first code has a typo, read from the interpreter's error and fixed. "
        "Range: 0-1, with the text share at most 1."})
    copy_drills: int = field(default=1000, metadata={
        "help": "Cold start of the tool arm: this many copy drills added (products of numbers of random widths, "
        "solved with code and refused as often as the other code solutions; never in RL or evaluation), so that "
        "copying digits forms on every seed; 0: none. Range: 0 or more."})
    coldstart_fault_share: float = field(default=0.5, metadata={
        "help": "Cold start: share of the plain code solutions whose first call is refused, as --fault_rate "
        "refuses calls in GRPO and evaluation; 0: none. Range: 0-1."})
    coldstart_retry_share: float = field(default=0.75, metadata={
        "help": "Cold start: share of the refused calls followed by the same call again; the rest answer at once"
        " (a guess). Range: 0-1."})
    coldstart_again_share: float = field(default=0.2, metadata={
        "help": "Cold start: share of those retries refused again and retried once more (needs --max_tool_calls "
        "3 or more). Range: 0-1."})
    # model
    vocab_size: int = field(default=400, metadata={
        "help": "BPE vocabulary (digits stay single characters). Range: about 300 or more."})
    hidden_size: int = field(default=128, metadata={"help": "Model width; heads are 64 wide. Range: a multiple of 64."})
    num_layers: int = field(default=3, metadata={"help": "Transformer layers. Range: 1 or more."})
    num_kv_heads: int = field(default=2, metadata={"help": "Key/value heads. Range: a divisor of hidden_size / 64."})
    # cold-start SFT
    sft_epochs: float = field(default=10.0, metadata={
        "help": "Epochs over the tool arm's cold start; the text arm takes as many steps. Range: more than 0."})
    sft_decay_share: float = field(default=0.0, metadata={
        "help": "Share of the SFT steps at the end over which the learning rate decays to 0 (a cosine); 0: "
        "constant after the warm-up. Range: 0-1."})
    sft_batch_size: int = field(default=16, metadata={"help": "SFT batch size. Range: 1 or more."})
    sft_learning_rate: float = field(default=1e-3, metadata={
        "help": "SFT learning rate, after 10 warm-up steps. Range: more than 0."})
    # GRPO
    rl_steps: int = field(default=120, metadata={
        "help": "GRPO steps (one optimizer step per generation batch). Range: 1 or more."})
    rl_prompts_per_step: int = field(default=4, metadata={"help": "Distinct problems per GRPO step. Range: 1 or more."})
    num_generations: int = field(default=8, metadata={
        "help": "Episodes per problem (the GRPO group). Range: 2 or more."})
    rl_learning_rate: float = field(default=3e-4, metadata={
        "help": "GRPO peak learning rate (linear decay to 0). Range: more than 0."})
    temperature: float = field(default=1.0, metadata={
        "help": "Sampling temperature of RL rollouts. Range: more than 0."})
    skip_steps_without_signal: bool = field(default=True, metadata={
        "help": "Skip GRPO steps whose groups all have equal rewards (Adam's momentum would move the weights "
        "without a signal)."})
    scale_rewards: str = field(default="batch", metadata={
        "help": "GRPO advantage scaling (TRL's); per group, the shaping's small rewards become full advantages "
        "where every episode is wrong. Range: batch, group or none."})
    # environment
    tool_call_cost: float = field(default=0.05, metadata={
        "help": "Reward subtracted per executed tool call; below the `retool` shaping's +0.1, so a failed call "
        "still beats a wrong guess. Range: 0-0.1."})
    # evaluation
    eval_samples: int = field(default=4, metadata={"help": "Samples per held-out problem (mean@k). Range: 1 or more."})
    eval_temperature: float = field(default=1.0, metadata={
        "help": "Evaluation sampling temperature: the policy RL trains, sampled as in rollouts. Range: more than"
        " 0."})
    eval_every: int = field(default=30, metadata={
        "help": "Evaluate a GRPO checkpoint every this many steps. Range: 1 or more."})
    eval_processes: int = field(default=2, metadata={
        "help": "Processes an arm's evaluations run in, beside its training (same metrics); 0: in the arm's "
        "process, one after the other. Range: 0 or more."})

    def apply_smoke(self) -> None:
        """Shrink everything so the pipeline runs end to end in about a minute: the cost left is each stage's
        process start."""
        self.train_per_level, self.test_per_level = 24, 2
        self.num_layers, self.sft_epochs, self.rl_steps, self.rl_prompts_per_step = 2, 1.0, 2, 2
        self.copy_drills = 24
        self.num_generations, self.eval_samples, self.eval_every = 4, 2, 1


def env_settings(args: Arguments, arm: str, seed: int = 0) -> EnvConfig:
    """The environment SFT replay, GRPO and evaluation all use; the text arm has no interpreter. `seed` seeds the
    injected faults (`--fault_rate`)."""
    return EnvConfig.from_settings(args, reward_kwargs={**args.reward_kwargs, "tool_call_cost": args.tool_call_cost},
                                   max_tool_calls=args.max_tool_calls if arm == "tool" else 0, fault_seed=seed)


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
        assert proc.stdout is not None  # a pipe
        for line in proc.stdout:
            f.write(line)
            sys.stdout.write(line)
        if proc.wait():
            raise RuntimeError(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}); see {log}")


def sft_schedule(args: Arguments, steps: int) -> dict:
    """Warm up, hold the rate (copying forms only after enough steps at full rate), then decay over the last
    `sft_decay_share` of the steps, which sharpens what was learnt."""
    decay = round(args.sft_decay_share * steps)
    if not decay:
        return {"lr_scheduler_type": "constant_with_warmup"}
    return {"lr_scheduler_type": "warmup_stable_decay", "lr_scheduler_kwargs": {"num_decay_steps": decay}}


def run_sft(args: Arguments, arm: str, model_dir: Path, data: Path, out: Path, seed: int, steps: int) -> Path:
    """Cold-start SFT with training/sft_trl.py: solutions replayed through the environment, interpreter masked."""
    env = env_settings(args, arm, seed)
    config = {
        "dataset": str(data), **env, "max_tool_calls": args.max_tool_calls,  # the tool arm's budget (its data)
        "fault_rate": 0.0,  # the cold start's refusals are recorded in it; replay injects none of its own
        "model_name_or_path": str(model_dir), "dtype": "float32", "output_dir": str(out), "seed": seed,
        "attn_implementation": "sdpa",  # eager's losses to within 0.02 here (BENCHMARKS.md)
        "use_cpu": True, "bf16": False,
        "max_steps": steps, "per_device_train_batch_size": args.sft_batch_size,
        "learning_rate": args.sft_learning_rate, "warmup_steps": 10, **sft_schedule(args, steps),
        "max_length": 256, "gradient_checkpointing": False,  # on by default in TRL; a tiny model only pays for it
        "logging_steps": 10, "save_strategy": "no", "report_to": "none",
    }
    yaml_path = write_yaml(out.parent / "sft.yaml", config)
    run_logged([sys.executable, "training/sft_trl.py", "--config", str(yaml_path)], out.parent / "sft.log")
    return out


def run_grpo(args: Arguments, arm: str, model_dir: Path, problems: Path, out: Path, seed: int) -> Path:
    """GRPO through the real TRL path: `accelerate launch training/grpo_trl.py`, the environment as rollout_func."""
    env = env_settings(args, arm, seed)
    config = {
        "dataset": str(problems), **env,
        "model_name_or_path": str(model_dir), "dtype": "float32", "attn_implementation": "sdpa",
        "output_dir": str(out), "use_cpu": True, "bf16": False, "gradient_checkpointing": False, "seed": seed,
        "max_steps": args.rl_steps, "per_device_train_batch_size": args.rl_prompts_per_step * args.num_generations,
        "num_generations": args.num_generations, "max_completion_length": env.max_completion_tokens,
        "temperature": args.temperature, "learning_rate": args.rl_learning_rate, "lr_scheduler_type": "linear",
        "skip_steps_without_signal": args.skip_steps_without_signal,
        "beta": 0.0, "scale_rewards": args.scale_rewards, "epsilon": 0.2, "epsilon_high": 0.28,
        "logging_steps": 1, "report_to": "none",
        "save_strategy": "steps", "save_steps": args.eval_every, "save_only_model": True,  # held-out curve
    }
    if args.records and arm == "tool":
        config["records_path"] = str(out.parent / "records.jsonl")
    yaml_path = write_yaml(out.parent / "grpo.yaml", config)
    run_logged([sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "training/grpo_trl.py",
                "--config", str(yaml_path)], out.parent / "grpo.log")
    return out


def evaluate_model(args: Arguments, arm: str, model_dir: Path, problems: list, out: Path, seed: int,
                   n_samples: int | None = None) -> dict:
    """Sampled evaluation on held-out problems, per level (`retool_env.evaluation.evaluate`), each sample under its
    own seed (derived from `seed`), so its tokens do not depend on how the requests were batched; with recovery
    from the injected faults per level (`miniature_report.with_fault_recovery`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from retool_adapters.generators import HFGenerator
    from retool_env.evaluation import evaluate
    from retool_env.rollout import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    metrics = evaluate(problems, HFGenerator(model, tokenizer), tokenizer, n_samples=n_samples or args.eval_samples,
                       sampling=SamplingParams(temperature=args.eval_temperature, seed=seed), out=out,
                       concurrency=64, progress=True,
                       config={"model": str(model_dir), "backend": "hf", "dataset": "miniature test", "arm": arm,
                               "tool_format": "retool"},
                       **env_settings(args, arm, seed))
    return with_fault_recovery(metrics, out / "per_problem.jsonl")


def evaluate_rows(args: Arguments, arm: str, model_dir: Path, problems: list, out: Path, seed: int,
                  n_samples: int | None) -> tuple[dict, float]:
    """`evaluate_model`'s rows per level (`level_rows`) and the seconds it took; runs in an evaluation process too."""
    import torch

    torch.set_num_threads(1)  # a spawned process does not run this script's __main__ block
    t0 = time.time()
    return level_rows(evaluate_model(args, arm, model_dir, problems, out, seed, n_samples)), time.time() - t0


def rl_curve(grpo_dir: Path) -> list[dict]:
    """Per-step training metrics of the GRPO run (TRL's log history)."""
    history = json.loads((grpo_dir / "trainer_state.json").read_text())["log_history"]
    keys = {"reward": "reward", "retool/accuracy": "accuracy", "retool/used_tool": "code_use",
            "retool/turns": "turns", "retool/response_length": "response_length",
            "retool/tool_error_rate": "tool_error_rate", "retool/tool_calls_per_episode": "tool_calls"}
    return [{"step": h["step"], **{name: h[key] for key, name in keys.items() if key in h}}
            for h in history if "retool/accuracy" in h]


def checkpoints(grpo_dir: Path, before: int) -> list[tuple[int, Path]]:
    """(step, folder) of the GRPO checkpoints saved whole before the last step, in order: the Trainer writes a
    checkpoint's trainer_state.json after its weights."""
    found = [(int(d.name.split("-")[1]), d) for d in grpo_dir.glob("checkpoint-*")
             if (d / "trainer_state.json").exists()]
    return sorted((step, d) for step, d in found if step < before)


# --- one seed ------------------------------------------------------------------------------------------------------

def run_seed(args: Arguments, seed: int, out: Path, log, start: float) -> dict:
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
    train_path = write_problems(train, seed_dir / "train.jsonl")
    test_path = write_problems(test, seed_dir / "test.jsonl")
    test = load_problems(test_path)

    # 2. Tokenizer and model: a BPE without digit merges, a small random Qwen2 (same weights for both arms).
    faults = bool(args.fault_rate or args.coldstart_fault_share)  # the refusal message in the BPE's corpus
    tokenizer = tiny_tokenizer(args.vocab_size, tokenizer_corpus(train, faults=faults))
    init_dir = build_tiny_qwen(seed_dir / "model-init", tokenizer, hidden_size=args.hidden_size,
                               num_layers=args.num_layers, num_heads=args.hidden_size // 64,
                               num_kv_heads=args.num_kv_heads, seed=seed,
                               initializer_range=0.02)  # Qwen's own scale; the default (10x) learned slower here

    results: dict = {"seed": seed, "curves": {}, "heldout": {}}
    arms = args.arms.split(",")
    if args.parallel_arms and len(arms) > 1:
        # One process per arm (spawned: no forked torch or sandbox state); each returns its log records, written here
        # in the order a sequential run writes them, with the times they were made at.
        with ProcessPoolExecutor(len(arms), mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(run_arm_process, args, seed, arm, seed_dir / arm, init_dir, train, train_path,
                                   test, start) for arm in arms]
            outcomes = [future.result() for future in futures]
    else:
        outcomes = [run_arm_process(args, seed, arm, seed_dir / arm, init_dir, train, train_path, test, start,
                                    log) for arm in arms]
    for arm, (arm_result, records) in zip(arms, outcomes, strict=True):
        for record in records:
            log(record)
        results[arm], results["curves"][arm], results["heldout"][arm] = arm_result
    return results


def run_arm_process(args: Arguments, seed: int, arm: str, arm_dir: Path, init_dir: Path, train: list,
                    train_path: Path, test: list, start: float, log=None) -> tuple[tuple, list[dict]]:
    """`run_arm`, its log records kept with their times (seconds since `start`) and returned, or written at once to
    `log` when one is given (a run without a process per arm)."""
    import torch

    torch.set_num_threads(1)  # a spawned process does not run this script's __main__ block
    records: list[dict] = []

    def keep(record: dict) -> None:
        record = {"time_s": round(time.time() - start, 1), **record}
        if log is None:
            records.append(record)
        else:
            log(record)

    return run_arm(args, seed, arm, arm_dir, init_dir, train, train_path, test, keep), records


def run_arm(args: Arguments, seed: int, arm: str, arm_dir: Path, init_dir: Path, train: list, train_path: Path,
            test: list, log) -> tuple[dict, list[dict], list[dict]]:
    """Cold start, SFT, GRPO and held-out evaluations of one arm: (rows per stage, RL training curve, held-out
    evaluations against RL steps: after SFT, every `eval_every` steps, after RL)."""
    from miniature_data import coldstart_kinds, make_drills, write_coldstart

    shutil.rmtree(arm_dir, ignore_errors=True)  # a rerun into the same folder must not evaluate stale checkpoints
    arm_dir.mkdir()
    shares = {"easy": (args.text_share_easy, args.self_correct_share),
              "hard": (args.text_share_hard, args.self_correct_share)}
    problems, kinds = train, coldstart_kinds(train, shares, seed, args.coldstart_fault_share,
                                             args.coldstart_retry_share, args.coldstart_again_share)
    if arm == "tool" and args.copy_drills:  # the copy skill, drilled where the task uses it
        drills = make_drills(args.copy_drills, seed, exclude={p.question for p in test})
        problems, kinds = problems + drills, kinds + coldstart_kinds(  # code solutions, refused as often as the rest
            drills, {"easy": (0.0, 0.0), "hard": (0.0, 0.0)}, seed, args.coldstart_fault_share,
            args.coldstart_retry_share, args.coldstart_again_share)
    if arm == "text":  # the same cold start without the solutions that use code
        kept = [(p, k) for p, k in zip(train, kinds, strict=True) if k == "text"]
        problems, kinds = [p for p, _ in kept], [k for _, k in kept]
    print(f"\n== seed {seed} / {arm}: cold-start data (code runs in the sandbox) ==", flush=True)
    counts = write_coldstart(problems, kinds, arm_dir / "coldstart.jsonl", seed)
    drilled = sum(p.level == "drill" for p in problems)
    log({"seed": seed, "arm": arm, "event": "coldstart", "kinds": counts, "copy_drills": drilled})

    # Evaluations run in processes of their own when asked (`eval_processes`), beside the training that does not
    # need them: before SFT while SFT trains, after SFT while GRPO trains, the checkpoints' side by side.
    pool = (ProcessPoolExecutor(args.eval_processes, mp_context=multiprocessing.get_context("spawn"))
            if args.eval_processes else None)

    def start_eval(stage: str, model_dir: Path) -> Future:
        print(f"\n== seed {seed} / {arm}: evaluate {stage} ==", flush=True)
        n_samples = 1 if stage == "before_sft" else None  # a random model: one sample shows it knows nothing
        call = (args, arm, model_dir, test, arm_dir / f"eval-{stage}", derive_seed(seed, stage), n_samples)
        if pool is not None:
            return pool.submit(evaluate_rows, *call)
        done: Future = Future()
        done.set_result(evaluate_rows(*call))
        return done

    def logged(stage: str, evaluation: Future, train_s: float = 0.0, step: int | None = None) -> dict:
        rows, seconds = evaluation.result()
        log({"seed": seed, "arm": arm, "event": "eval", "stage": stage, "step": step,
             "train_seconds": round(train_s, 1), "eval_seconds": round(seconds, 1), "levels": rows})
        return rows

    try:
        before_sft = start_eval("before_sft", init_dir)
        print(f"\n== seed {seed} / {arm}: cold-start SFT ==", flush=True)
        t0 = time.time()
        # Both arms take the same number of SFT steps: `sft_epochs` over the tool arm's (larger) cold start.
        steps = math.ceil(args.sft_epochs * len(train) / args.sft_batch_size)
        sft_dir = run_sft(args, arm, init_dir, arm_dir / "coldstart.jsonl", arm_dir / "sft", seed, steps)
        sft_s = time.time() - t0
        stages = {"before_sft": logged("before_sft", before_sft)}
        after_sft = start_eval("after_sft", sft_dir)
        print(f"\n== seed {seed} / {arm}: GRPO ({args.rl_steps} steps) ==", flush=True)
        t0 = time.time()
        during: dict[int, Future] = {}  # each checkpoint evaluated as soon as it is saved, beside the training
        with ThreadPoolExecutor(1) as runner:
            grpo_run = runner.submit(run_grpo, args, arm, sft_dir, train_path, arm_dir / "grpo", seed)
            while True:
                done = grpo_run.done()  # seen before the listing, so the last listing holds every checkpoint
                for step, checkpoint in checkpoints(arm_dir / "grpo", before=args.rl_steps):
                    if step not in during:
                        during[step] = start_eval(f"rl_step{step}", checkpoint)
                if done:
                    break
                time.sleep(1.0)
            grpo_dir = grpo_run.result()
        train_s = time.time() - t0
        stages["after_sft"] = logged("after_sft", after_sft, sft_s, step=0)
        curve = rl_curve(grpo_dir)
        for point in curve:
            log({"seed": seed, "arm": arm, "event": "rl_step", **point})
        after_rl = start_eval("after_rl", grpo_dir)
        heldout = [{"step": 0, "levels": stages["after_sft"]}]
        for step, evaluation in sorted(during.items()):
            heldout.append({"step": step, "levels": logged(f"rl_step{step}", evaluation, step=step)})
        stages["after_rl"] = logged("after_rl", after_rl, train_s, step=args.rl_steps)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    heldout.append({"step": args.rl_steps, "levels": stages["after_rl"]})
    return stages, curve, heldout


def seed_list(args: Arguments) -> list[int]:
    """The seeds to run: `--seed_list`, else `--seeds` of them from `--seed`."""
    seeds = list(args.seed_list) if args.seed_list else list(range(args.seed, args.seed + args.seeds))
    if len(set(seeds)) != len(seeds) or not seeds:
        raise ValueError(f"the seeds to run must be distinct and at least one, got {seeds}")
    return seeds


# Settings that change no metric: where and how fast a run goes, and which seeds it runs.
NOT_RESULT_SETTINGS = ("out", "seeds", "seed", "seed_list", "parallel_arms", "eval_processes", "records")


def result_settings(args: Arguments) -> dict:
    """The settings a seed's metrics depend on (every flag but `NOT_RESULT_SETTINGS`), as `seed<k>.json` holds them
    (JSON: a tuple reads back as a list)."""
    return json.loads(json.dumps({key: value for key, value in asdict(args).items()
                                  if key not in NOT_RESULT_SETTINGS}))


def seed_summary_path(out: Path, seed: int) -> Path:
    return out / f"seed{seed}.json"


def write_atomically(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a run stopped while writing leaves no half a summary."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def finished_seed(args: Arguments, out: Path, seed: int) -> dict | None:
    """The summary an earlier run with the same settings wrote for `seed` in `out` (`seed<k>.json`, a small file to
    keep, e.g. under bench/results/miniature/), or None when there is none; one written with other settings is an
    error, not a result to mix in."""
    path = seed_summary_path(out, seed)
    if not path.exists():
        return None
    finished = json.loads(path.read_text())
    settings = result_settings(args)
    differ = sorted(key for key in {*settings, *finished["settings"]}
                    if settings.get(key) != finished["settings"].get(key))
    if differ:
        raise ValueError(f"{path} was written with other settings ({', '.join(differ)} differ): run with the same "
                         f"settings to reuse it, or pass another --out")
    return finished


def main(args: Arguments) -> Path:
    if args.smoke:
        args.apply_smoke()
    if args.coldstart_fault_share and args.coldstart_again_share and args.max_tool_calls < 3:
        raise ValueError(f"--coldstart_again_share {args.coldstart_again_share} shows a third call: it needs "
                         f"--max_tool_calls 3 or more (got {args.max_tool_calls}), or --coldstart_again_share 0")
    out = Path(args.out or ROOT / "runs" / f"miniature-{time.strftime('%Y%m%d-%H%M%S')}")
    seeds = seed_list(args)
    finished = {seed: finished_seed(args, out, seed) for seed in seeds}  # refused before anything runs
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    results, seed_seconds = [], []
    with open(out / "metrics.jsonl", "a") as metrics_file:  # a rerun adds the seeds it runs

        def log(record: dict) -> None:  # a record that has its time (made in an arm's process) keeps it
            metrics_file.write(json.dumps({"time_s": round(time.time() - start, 1), **record}) + "\n")
            metrics_file.flush()

        log({"event": "config", **asdict(args)})
        for seed in seeds:
            summary = finished[seed]
            if summary is None:
                seed_start = time.time()
                result = run_seed(args, seed, out, log, start)
                text = json.dumps({"seed": seed, "settings": result_settings(args),
                                   "wall_seconds": round(time.time() - seed_start, 1), "result": result},
                                  separators=(",", ":"))
                write_atomically(seed_summary_path(out, seed), text)
                summary = json.loads(text)  # as a rerun reads it back
            else:
                print(f"seed {seed}: finished in an earlier run ({seed_summary_path(out, seed)}), not run again")
            results.append(summary["result"])
            seed_seconds.append(summary["wall_seconds"])
        log({"event": "done", "wall_seconds": round(time.time() - start, 1)})
    wall = sum(seed_seconds)  # the seeds' own times, in this run or the earlier one that ran them
    (out / "summary.json").write_text(json.dumps({"wall_seconds": wall, "results": results,
                                                  "criteria": [criteria(r) for r in results]}, indent=2))
    write_report(args, out, results, wall)
    plot(out, results, args.arms.split(","))
    print(f"\nDone: {out / 'report.md'} (the seeds took {wall / 60:.1f} min)")
    return out


if __name__ == "__main__":
    import torch
    from transformers import HfArgumentParser

    torch.set_num_threads(1)
    (arguments,) = HfArgumentParser(Arguments).parse_args_into_dataclasses()
    main(arguments)
