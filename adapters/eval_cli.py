"""`retool-env eval` and `training/eval.py`: evaluate a tool-using math model with ReTool-Env, with and without the
tool (mean@n with 95% intervals, pass@k, maj@k, tool statistics, parse failures, per level). The evaluation itself is
`retool_env.evaluation`; this module picks the generation backend, the protocol and reads the arguments.

Every sample is one episode of `ToolEnvironment`, played by `retool_env.rollout.run_episodes` against a generation
backend from `retool_adapters.generators`: Hugging Face `generate` (`hf`), an in-process vLLM engine (`vllm`) or an
OpenAI-compatible completions server taking token-id prompts (`openai`: vLLM or SGLang serving the model).

    # Offline CPU smoke run: a tiny random Qwen2 on procedural problems (retool_env/configs/eval_tiny_cpu.yaml,
    # packaged, read when neither --config, --model nor --protocol is given); every flag applies on top of it
    retool-env eval --limit 2        # or: python training/eval.py --limit 2

    # A published protocol (paper, verl, matharena, aster; retool_env/configs/protocols/) on 2026 benchmarks
    retool-env eval --protocol aster --model runs/grpo --backend vllm --dataset aime26,hmmt_feb25,beyondaime

Writes, for each benchmark and arm, `<out>/<benchmark>/<arm>/{per_problem.jsonl,report.md,metrics.json,accuracy.png}`,
and `<out>/report.md` (both arms side by side), `<out>/metrics.json` and `<out>/arms.png`. From Python,
`retool_env.evaluation.evaluate_arms(...)` (both arms) and `evaluate(...)` (one) return the metrics.

Arguments come from four dataclasses, read from a YAML file (`--config`; without it, the CPU smoke config only for a
run with neither `--model` nor `--protocol`, else the dataclasses' defaults), then a protocol preset (`--protocol`: it
states every setting that changes a score, `PROTOCOL_FIELDS`, and replaces the file's), then the command line, which
wins. The report lists every setting that differs from the protocol, from the file or the command line alike:
`ModelArguments`, `DataArguments`, `EnvArguments` (`retool_env.EnvConfig` plus concurrency and the arms) and
`OutputArguments`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from importlib.resources import files
from pathlib import Path
from typing import Any

from retool_env.config import EnvConfig
from retool_env.evaluation import ARMS, NO_TOOL_PROMPT

# Packaged with retool_env (package-data), so an installed copy finds them too.
EVAL_CONFIGS = Path(str(files("retool_env") / "configs"))
PROTOCOLS = ("paper", "verl", "matharena", "aster")
# What a protocol preset must state: every argument that changes a score (the problems, sampling, budgets, the
# interpreter's limits, the weights' precision).
PROTOCOL_FIELDS = ("n_samples", "ks", "temperature", "top_p", "top_k", "seed", "limit", "levels",
                   "max_completion_tokens", "max_tool_calls", "max_observation_tokens", "max_turn_tokens",
                   "tool_timeout", "error_format", "on_timeout", "stateful", "dtype")
# Arguments that never change a score (what is evaluated, where it runs, where results go): not compared with the
# protocol.
UNSCORED_FIELDS = frozenset({"model", "tokenizer", "backend", "base_url", "device", "tensor_parallel_size",
                             "gpu_memory_utilization", "dataset", "protocol", "arms", "out", "save_responses",
                             "progress", "concurrency"})


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


@dataclass
class DataArguments:
    """Which problems, and how many samples of each."""

    dataset: str = field(default="aime24", metadata={
        "help": "One benchmark or several, comma-separated: aime24, aime25, aime26, hmmt_feb25, hmmt_nov25, "
                "hmmt_feb26, brumo25, cmimc25, beyondaime, amobench, math500, arith (procedural), a local "
                "parquet/jsonl file or folder, or a Hub id."})
    protocol: str | None = field(default=None, metadata={
        "help": f"A published evaluation protocol ({', '.join(PROTOCOLS)}; retool_env/configs/protocols/): every "
                "setting that changes a score, replacing the config file's; flags still win, and the report lists "
                "each setting that differs from the protocol."})
    split: str | None = field(default=None, metadata={"help": "Split (arith: train or test); default: the "
                                                              "dataset's evaluation split."})
    limit: int | None = field(default=None, metadata={"help": "Evaluate at most this many problems."})
    levels: list[str] | None = field(default=None, metadata={
        "help": "Keep only problems of these levels (of benchmarks that have levels; AMO-Bench's are answer types)."})
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
    arms: list[str] = field(default_factory=lambda: list(ARMS), metadata={
        "help": "tool (the environment as configured), no_tool (no tool in the prompt, no call allowed), or both: "
                "the same problems, n and seeds in each."})
    no_tool_prompt: str = field(default=NO_TOOL_PROMPT, metadata={
        "help": "Prompt of the no-tool arm (plain: the problem and 'Put your final answer in \\boxed{}.'; dapo)."})


@dataclass
class OutputArguments:
    """Where the results go."""

    out: str = field(default="runs/eval", metadata={"help": "Output folder."})
    save_responses: bool = field(default=True, metadata={"help": "Write each sample's text to per_problem.jsonl."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar."})


def load_protocol(name: str) -> tuple[str, list[str], dict[str, Any]]:
    """A protocol preset: where it comes from (`source`), where the environment cannot follow it or the source is
    silent (`notes`), and the argument values it sets (every one of `PROTOCOL_FIELDS`)."""
    import yaml

    from retool_adapters.scripts import UsageError

    if name not in PROTOCOLS:
        raise UsageError(f"--protocol {name}: unknown protocol; choose one of {', '.join(PROTOCOLS)}")
    preset = yaml.safe_load((EVAL_CONFIGS / "protocols" / f"{name}.yaml").read_text(encoding="utf-8"))
    source, notes = preset.pop("source"), preset.pop("notes", [])
    missing = [name for name in PROTOCOL_FIELDS if name not in preset]
    if missing:
        raise UsageError(f"protocol {name}: the preset does not state {', '.join(missing)}")
    return source, notes, preset


def _flags(argv: Iterable[str], names: set[str]) -> set[str]:
    """The argument names given on the command line (`--name value`, `--name=value`, `--no_name`)."""
    given = set()
    for token in argv:
        if token.startswith("--"):
            name = token[2:].split("=")[0]
            given.add(name[3:] if name.startswith("no_") and name[3:] in names else name)
    return given & names


def apply_protocol(parsed: tuple[Any, ...], argv: Sequence[str]) -> dict[str, Any] | None:
    """Set the protocol's values on the parsed dataclasses, except where a flag set one; return the record the report
    shows: name, source, notes, preset, and every setting that changes a score and differs from the protocol (its
    preset, else the argument's default), with where it was set (`flag` or `config`)."""
    from retool_adapters.scripts import UsageError

    data_args = parsed[1]
    owners = {f.name: args for args in parsed for f in fields(args)}
    given = _flags(argv, set(owners))
    if data_args.protocol is None:
        return None
    source, notes, preset = load_protocol(data_args.protocol)
    for name, value in preset.items():
        if name not in owners:
            raise UsageError(f"protocol {data_args.protocol}: {name!r} is not an argument of the evaluation")
        if name not in given:
            setattr(owners[name], name, value)
    if "n_samples" in given and "ks" not in given:  # the preset's k values belong to its own n
        data_args.ks = sorted({k for k in preset["ks"] if k <= data_args.n_samples} | {data_args.n_samples})
    derived = {"ks"} if "n_samples" in given else set()
    differences = {}
    for args in parsed:
        defaults = type(args)()  # as the dataclass normalises them
        for f in fields(args):
            expected = preset[f.name] if f.name in preset else getattr(defaults, f.name)
            value = getattr(args, f.name)
            if f.name not in UNSCORED_FIELDS and value != expected:
                differences[f.name] = {"value": value, "protocol": expected,
                                       "set_by": "flag" if f.name in given or f.name in derived else "config"}
    return {"name": data_args.protocol, "source": source, "notes": notes, "preset": preset,
            "differences": differences}


class EvalParser:
    """The evaluation's `ScriptParser` with `--protocol` applied after the config file and before the flags; the
    record of what was applied is kept on `DataArguments` as `protocol_record`."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parser, name)

    def parse_args_and_config(self, args: Iterable[str] | None = None, **kwargs: Any) -> tuple[Any, ...]:
        import sys

        from retool_adapters.scripts import UsageError

        argv = list(sys.argv[1:] if args is None else args)
        smoke_run = not _flags(argv, {"config", "model", "protocol"})  # only then the CPU smoke config
        parsed = self.parser.parse_args_and_config(argv, with_default_config=smoke_run, **kwargs)
        try:
            parsed[1].protocol_record = apply_protocol(parsed, argv)
        except UsageError as exc:
            self.parser.error(str(exc))
        return parsed


def make_parser() -> EvalParser:
    from retool_adapters.scripts import ScriptParser

    return EvalParser(ScriptParser(
        (ModelArguments, DataArguments, EnvArguments, OutputArguments),
        default_config=EVAL_CONFIGS / "eval_tiny_cpu.yaml", prog="retool-env eval",
        description="Evaluate a tool-using math model with ReTool-Env, with and without the tool: mean@n with 95% "
                    "intervals, pass@k, maj@k, tool use and parse failures, per benchmark and level. --protocol "
                    f"{'|'.join(PROTOCOLS)} applies a published protocol. Without --config, --model or --protocol: "
                    "the offline CPU smoke run."))


def parse_args(argv: Sequence[str] | None = None) -> tuple[ModelArguments, DataArguments, EnvArguments,
                                                           OutputArguments]:
    """The four argument dataclasses from `--config file.yaml` (without it: the CPU smoke config for a run with
    neither `--model` nor `--protocol`, else the defaults), then `--protocol`, then the command line, which wins."""
    return make_parser().parse_args_and_config(argv)


def load_generator(args: ModelArguments, out: str | Path, max_model_len: int | None = None) -> tuple[Any, Any]:
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

        return OpenAICompletionsGenerator(args.base_url or "", args.model), tokenizer
    try:
        import vllm
    except ModuleNotFoundError as exc:
        raise UsageError("--backend vllm needs vLLM: pip install -e '.[gpu]' on a GPU machine (README, GPU "
                         "quickstart), or --backend openai against a running server") from exc

    from retool_adapters.generators import VLLMEngineGenerator

    engine = vllm.LLM(model=args.model, tokenizer=args.tokenizer or args.model, dtype=args.dtype,
                      tensor_parallel_size=args.tensor_parallel_size, max_model_len=max_model_len,
                      gpu_memory_utilization=args.gpu_memory_utilization)
    return VLLMEngineGenerator(engine), tokenizer


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The command line (`retool-env eval ARGS`, `python training/eval.py ARGS`): the metrics dict."""
    from retool_adapters.scripts import run

    return run(evaluate_from_args, make_parser(), argv)  # type: ignore[arg-type]  # EvalParser wraps a ScriptParser


def load_benchmarks(data_args: DataArguments) -> dict[str, Sequence[Any]]:
    """Each benchmark's problems (procedural ones from their held-out test split unless told otherwise)."""
    from retool_adapters.scripts import UsageError
    from retool_env.data import arith_split, load_problems

    benchmarks: dict[str, Sequence[Any]] = {}
    for name in (n.strip() for n in data_args.dataset.split(",") if n.strip()):
        if name == "arith":
            problems = arith_split(data_args.split or "test", data_args.limit, data_args.levels)
        else:
            problems = load_problems(name, split=data_args.split)
            if data_args.levels and any(p.level is not None for p in problems):  # a benchmark without levels: all
                problems = [p for p in problems if p.level in data_args.levels]
            problems = problems[:data_args.limit]
        if not problems:
            raise UsageError(f"--dataset {name}: no problems (split {data_args.split}, levels {data_args.levels}, "
                             f"limit {data_args.limit})")
        benchmarks[Path(name).name if Path(name).exists() else name] = problems
    if not benchmarks:
        raise UsageError("--dataset: name at least one benchmark")
    return benchmarks


def evaluate_from_args(model_args: ModelArguments, data_args: DataArguments, env_args: EnvArguments,
                       output_args: OutputArguments) -> dict[str, Any]:
    """Load the benchmarks and the backend, play both arms, score, write the reports."""
    from retool_adapters.scripts import UsageError
    from retool_env.evaluation import evaluate_arms
    from retool_env.rollout import SamplingParams

    if not env_args.arms or set(env_args.arms) - set(ARMS):
        raise UsageError(f"--arms {' '.join(env_args.arms)}: choose tool, no_tool or both")

    # 1. The problems of every benchmark.
    benchmarks = load_benchmarks(data_args)

    # 2. The backend.
    random_model = model_args.model is None and model_args.backend == "hf"
    generator, tokenizer = load_generator(model_args, output_args.out, env_args.max_model_len)  # the env's cap too

    # 3. Play and score each arm: n samples of each problem, every one a full episode (with the interpreter, or
    #    without any tool), the same problems and sampling seeds in both.
    protocol = getattr(data_args, "protocol_record", None)
    config = {**asdict(model_args), **asdict(data_args), **asdict(env_args), **asdict(output_args),
              "num_problems": {name: len(problems) for name, problems in benchmarks.items()}, "protocol": protocol}
    results = evaluate_arms(
        benchmarks, generator, tokenizer,
        arms=env_args.arms,
        no_tool_prompt=env_args.no_tool_prompt,
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
    n = data_args.n_samples
    for name, arms in results.items():
        for arm in (a for a in ARMS if a in arms):
            m, k = arms[arm], arms[arm]["ks"][-1]
            print(f"{name} [{arm}] {m['num_problems']} problems x {n}: mean@{n} {m[f'mean@{n}']:.3f} "
                  f"(95% CI {m[f'mean@{n}_ci95']}), pass@{k} {m[f'pass@{k}']:.3f}, maj@{k} {m[f'maj@{k}']:.3f}, "
                  f"code ratio {m['tools']['code_ratio']}, parse failures {m['parse_failure_rate']}")
    print(f"report: {Path(output_args.out) / 'report.md'}")
    if random_model:
        print("(a smoke run: the model is a tiny random one, so zero accuracy is expected; pass --model to evaluate "
              "a real checkpoint)")
    return results
