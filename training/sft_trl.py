"""Cold-start SFT (ReTool's first stage) with TRL's SFTTrainer, on data replayed through ReTool-Env.

Every example is a solution replayed turn by turn through `ToolEnvironment` (`retool_env.coldstart`): the
environment runs the code (or, for ReTool-SFT, answers with the recorded interpreter outputs), inserts the
interpreter's answer and grades the result. The SFT example is that trajectory's tokens, exactly what RL produces,
and the loss covers only the tokens the model wrote: the prompt and every interpreter/tool token are masked, as the
ReTool paper masks interpreter feedback (slime's SFT example trains on it; verl masks it by role).

    # Offline CPU smoke run: a tiny random Qwen2 on procedural cold-start data (training/configs/sft_tiny_cpu.yaml,
    # the default config); every flag applies on top of it
    python training/sft_trl.py --max_steps 2

    # The recipe: Qwen3-4B-Instruct-2507 on ReTool-SFT, 8 GPUs
    accelerate launch --config_file training/configs/accelerate/zero3.yaml \
        training/sft_trl.py --config training/configs/sft_qwen3_4b_retool.yaml

Arguments come from three dataclasses, read from a YAML file (`--config`, default: the CPU smoke config) and the
command line, which wins: `DataArguments` below (`retool_env.EnvConfig` plus the data), TRL's `SFTConfig` and TRL's
`ModelConfig` (LoRA with `--use_peft`). `--help` lists the common ones, `--help-all` every one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from retool_env.config import EnvConfig

TINY_CPU_CONFIG = Path(__file__).parent / "configs" / "sft_tiny_cpu.yaml"


@dataclass
class DataArguments(EnvConfig.with_defaults(max_completion_tokens=16384)):  # type: ignore[misc]  # a dataclass built at import time (EnvConfig.with_defaults)
    """The cold-start data: where solutions come from, and the environment that replays them (`EnvConfig`: use the
    tool format and prompt the RL stage will use, and budgets generous enough for the data). A recorded solution must
    fit `max_completion_tokens` whole (longer ones are cut, then dropped), so SFT's default is longer than the
    environment's."""

    dataset: str = field(default="arith", metadata={
        "help": "arith (procedural cold-start solutions written here and run in the sandbox), or ReTool-SFT: "
                "JoeYing/ReTool-SFT or a local parquet/jsonl file or folder of it (replayed with its recorded "
                "interpreter outputs)."})
    dataset_split: str = field(default="train", metadata={"help": "Split of the arith problems (train or test)."})
    dataset_limit: int | None = field(default=None, metadata={"help": "Use at most this many problems or rows."})
    levels: list[str] | None = field(default=None, metadata={"help": "arith levels to use (default: all)."})
    coldstart_seed: int = field(default=0, metadata={
        "help": "Seed of which arith problem gets which kind of solution (and which bug)."})
    text_share: float = field(default=0.2, metadata={"help": "Share of tool-free arith solutions, per level."})
    self_correct_share: float = field(default=0.2, metadata={
        "help": "Share of arith solutions whose first code fails and is fixed after reading the error, per level."})
    require_correct: bool = field(default=True, metadata={
        "help": "Drop replays the environment does not grade correct (a budget cut the answer off, no answer)."})


def coldstart_rows(data_args: DataArguments, tokenizer) -> list[dict]:
    """Replayed cold-start rows (`input_ids`, `assistant_masks`, id, level, kind, ...) for the data arguments."""
    from retool_adapters.scripts import UsageError
    from retool_env.coldstart import arith_solutions, build_coldstart, retool_sft_solutions
    from retool_env.data import arith_split, load_retool_sft

    if data_args.dataset == "arith":  # procedural solutions written here, their code run in the sandbox
        problems = arith_split(data_args.dataset_split, data_args.dataset_limit, data_args.levels)
        solutions = arith_solutions(problems, seed=data_args.coldstart_seed, text_share=data_args.text_share,
                                    self_correct_share=data_args.self_correct_share)
    else:  # ReTool-SFT's trajectories, answered with their recorded interpreter outputs
        solutions = retool_sft_solutions(load_retool_sft(data_args.dataset, limit=data_args.dataset_limit))
    rows = build_coldstart(solutions, tokenizer, require_correct=data_args.require_correct,
                           **EnvConfig.from_settings(data_args))
    if not rows:
        raise UsageError(f"none of the {len(solutions)} solutions replayed correctly; check the budgets "
                         f"(max_completion_tokens, max_tool_calls) and the tool format")
    if len(rows) < len(solutions):
        print(f"dropped {len(solutions) - len(rows)} of {len(solutions)} solutions: wrong or over a budget on replay")
    return rows


def main(data_args: DataArguments, training_args, model_args) -> None:
    # Heavy imports here, so that `--help` is instant.
    from datasets import Dataset
    from trl import SFTTrainer, get_peft_config, get_quantization_config

    from retool_adapters.scripts import load_policy

    # 1. The model. Without one, build a tiny random Qwen2 (offline, seconds) so the script runs anywhere.
    tokenizer = load_policy(model_args, training_args)

    # 2. The data: solutions replayed through the environment; tokens and loss mask are those of an RL trajectory.
    rows = coldstart_rows(data_args, tokenizer)
    trained = sum(sum(row["assistant_masks"]) for row in rows)
    total = sum(len(row["input_ids"]) for row in rows)
    print(f"cold-start data: {len(rows)} solutions {dict(Counter(row['kind'] for row in rows))}; {trained} of {total} "
          f"tokens trained (prompt and interpreter tokens masked)")

    # 3. SFTTrainer on pre-tokenized rows: labels are input_ids where `assistant_masks` is 1, -100 elsewhere.
    train_dataset = Dataset.from_list([{"input_ids": row["input_ids"], "assistant_masks": row["assistant_masks"]}
                                       for row in rows])
    trainer = SFTTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)

    # 4. Save the model (the LoRA adapter under --use_peft) with its tokenizer, and the log history.
    trainer.save_model(training_args.output_dir)
    trainer.save_state()
    trainer.accelerator.print(f"Model and trainer_state.json saved to {training_args.output_dir}.")
    trainer.end()


def make_parser():
    from trl import ModelConfig, SFTConfig

    from retool_adapters.scripts import ScriptParser

    return ScriptParser((DataArguments, SFTConfig, ModelConfig), own=(DataArguments,), default_config=TINY_CPU_CONFIG,
                        prog="sft_trl.py", description="Cold-start SFT: TRL's SFTTrainer on solutions replayed through "
                        "ReTool-Env (interpreter tokens masked). Without --config: the offline CPU smoke run.")


if __name__ == "__main__":
    from retool_adapters.scripts import run

    run(main, make_parser())
