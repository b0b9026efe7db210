"""`retool-env eval` and `training/eval.py`: evaluate a tool-using math model with ReTool-Env (mean@n, pass@k, maj@k,
tool statistics, per level). The evaluation itself is `retool_env.evaluation`; this module picks the generation
backend and reads the arguments.

Every sample is one episode of `ToolEnvironment`, played by `retool_env.rollout.run_episodes` against a generation
backend from `retool_adapters.generators`: Hugging Face `generate` (`hf`), an in-process vLLM engine (`vllm`) or an
OpenAI-compatible completions server taking token-id prompts (`openai`: vLLM or SGLang serving the model).

    # Offline CPU smoke run: a tiny random Qwen2 on procedural problems (training/configs/eval_tiny_cpu.yaml, the
    # default config); every flag applies on top of it
    retool-env eval --limit 2        # or: python training/eval.py --limit 2

    # The paper's protocol on AIME 2024: 32 samples per problem, T=1.0, top-p 0.7, up to 16384 tokens, vLLM
    python training/eval.py --config training/configs/eval_qwen3_4b_aime24.yaml --model runs/sft-qwen3-4b-retool

Writes `<out>/per_problem.jsonl`, `<out>/report.md`, `<out>/metrics.json` and `<out>/accuracy.png`. From Python,
`retool_env.evaluation.evaluate(problems, generator, tokenizer, ...)` returns the metrics dict (and writes the same
files when given `out`); the metrics are described there.

Arguments come from four dataclasses, read from a YAML file (`--config`, default: the CPU smoke config) and the
command line, which wins: `ModelArguments`, `DataArguments`, `EnvArguments` (`retool_env.EnvConfig` plus
concurrency) and `OutputArguments`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from retool_env.config import EnvConfig


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
class EnvArguments(EnvConfig):
    """The environment the model plays in (`EnvConfig`: format, prompt, reward, budgets, sandbox), and how many
    episodes run at once."""

    concurrency: int = field(default=64, metadata={"help": "Episodes in flight at once."})
    episode_timeout: float | None = field(default=None, metadata={"help": "Seconds an episode may take."})


@dataclass
class OutputArguments:
    """Where the results go."""

    out: str = field(default="runs/eval", metadata={"help": "Output folder."})
    save_responses: bool = field(default=True, metadata={"help": "Write each sample's text to per_problem.jsonl."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar."})


def make_parser():
    from retool_adapters.scripts import CONFIGS, ScriptParser

    return ScriptParser((ModelArguments, DataArguments, EnvArguments, OutputArguments),
                        default_config=CONFIGS / "eval_tiny_cpu.yaml", prog="retool-env eval",
                        description="Evaluate a tool-using math model with ReTool-Env: mean@n, pass@k, maj@k and tool "
                                    "use, per level. Without --config: the offline CPU smoke run.")


def parse_args(argv: Sequence[str] | None = None) -> tuple[ModelArguments, DataArguments, EnvArguments,
                                                           OutputArguments]:
    """The four argument dataclasses from `--config file.yaml` (default: the CPU smoke config) and the command line,
    which wins."""
    return make_parser().parse_args_and_config(argv)  # type: ignore[return-value]


def load_generator(args: ModelArguments, out: str | Path) -> tuple[Any, Any]:
    """The generator and tokenizer for a backend; heavy imports happen only for the backend asked for."""
    from retool_adapters.scripts import UsageError, load_tokenizer

    if args.backend == "hf":
        from transformers import AutoModelForCausalLM

        from retool_adapters.generators import HFGenerator

        if args.model is None:  # a smoke run anywhere: a tiny random model, built offline
            from retool_adapters.offline_models import build_tiny_qwen

            args.model = str(build_tiny_qwen(Path(out) / "tiny-model"))
        tokenizer = load_tokenizer(args.tokenizer or args.model)  # first: its error names the fix
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=args.dtype)
        return HFGenerator(model, tokenizer, device=args.device), tokenizer
    if args.backend not in ("vllm", "openai"):
        raise UsageError(f"--backend {args.backend}: unknown backend; choose hf, vllm or openai")
    if args.model is None:
        raise UsageError(f"--backend {args.backend} needs --model (the model folder, Hub id or served name)")
    if args.backend == "openai" and not args.base_url:
        raise UsageError("--backend openai needs --base_url, e.g. --base_url http://localhost:8000/v1")
    tokenizer = load_tokenizer(args.tokenizer or args.model)
    if args.backend == "openai":
        from retool_adapters.generators import OpenAICompletionsGenerator

        return OpenAICompletionsGenerator(args.base_url, args.model), tokenizer
    try:
        import vllm
    except ModuleNotFoundError as exc:
        raise UsageError("--backend vllm needs vLLM: pip install -e '.[gpu]' on a GPU machine (README, GPU "
                         "quickstart), or --backend openai against a running server") from exc

    from retool_adapters.generators import VLLMEngineGenerator

    engine = vllm.LLM(model=args.model, tokenizer=args.tokenizer or args.model, dtype=args.dtype,
                      tensor_parallel_size=args.tensor_parallel_size, max_model_len=args.max_model_len,
                      gpu_memory_utilization=args.gpu_memory_utilization)
    return VLLMEngineGenerator(engine), tokenizer


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The command line (`retool-env eval ARGS`, `python training/eval.py ARGS`): the metrics dict."""
    from retool_adapters.scripts import run

    return run(evaluate_from_args, make_parser(), argv)


def evaluate_from_args(model_args: ModelArguments, data_args: DataArguments, env_args: EnvArguments,
                       output_args: OutputArguments) -> dict[str, Any]:
    """Load the problems and the backend, play, score, write the report."""
    from retool_adapters.scripts import UsageError
    from retool_env.data import arith_split, load_problems
    from retool_env.evaluation import evaluate
    from retool_env.rollout import SamplingParams

    # 1. The problems (procedural ones from their held-out test split unless told otherwise).
    if data_args.dataset == "arith":
        problems = arith_split(data_args.split or "test", data_args.limit, data_args.levels)
    else:
        problems = load_problems(data_args.dataset, split=data_args.split)
        problems = [p for p in problems if not data_args.levels or p.level in data_args.levels][:data_args.limit]
    if not problems:
        raise UsageError(f"--dataset {data_args.dataset}: no problems (split {data_args.split}, levels "
                         f"{data_args.levels}, limit {data_args.limit})")

    # 2. The backend.
    random_model = model_args.model is None and model_args.backend == "hf"
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
        **env_args,
    )
    n, k = data_args.n_samples, metrics["ks"][-1]
    print(f"{metrics['num_problems']} problems x {n}: mean@{n} {metrics[f'mean@{n}']:.3f}, pass@{k} "
          f"{metrics[f'pass@{k}']:.3f}, maj@{k} {metrics[f'maj@{k}']:.3f}, code ratio "
          f"{metrics['tools']['code_ratio']}; report: {Path(output_args.out) / 'report.md'}")
    if random_model:
        print("(a smoke run: the model is a tiny random one, so zero accuracy is expected; pass --model to evaluate "
              "a real checkpoint)")
    return metrics

