"""GRPO with a Python interpreter in the loop (ReTool's RL stage), on TRL's GRPOTrainer and ReTool-Env.

Each prompt of a batch is played as one multi-turn episode of `ToolEnvironment`: the policy writes, calls the code
interpreter, reads its output (tokens with no loss), and answers; the environment grades the answer and its reward
is GRPO's reward. Generation uses the trainer's own vLLM (colocate or server mode) or, with `use_vllm: false`,
Hugging Face `generate` on the policy.

    # Offline CPU smoke run: a tiny random Qwen2 on procedural arithmetic (training/configs/grpo_tiny_cpu.yaml, the
    # default config); every flag applies on top of it
    accelerate launch --cpu --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
        training/grpo_trl.py --max_steps 2

    # The recipe: Qwen3-4B-Instruct-2507 on DAPO-Math-17k, evaluated on AIME 2024, 8 GPUs, vLLM colocated
    accelerate launch --config_file training/configs/accelerate/zero3.yaml \
        training/grpo_trl.py --config training/configs/grpo_qwen3_4b_dapo_colocate.yaml

    # Asynchronous GRPO (TRL's AsyncGRPOTrainer): episodes generated against a vLLM server while the GPUs train
    accelerate launch --config_file training/configs/accelerate/zero3.yaml --num_processes 4 \
        training/grpo_trl.py --async --config training/configs/async_grpo_qwen3_4b_dapo.yaml

Arguments come from three dataclasses, read from a YAML file (`--config`, default: the CPU smoke config) and the
command line, which wins: `EnvArguments` below (`retool_env.EnvConfig` plus the data), TRL's `GRPOConfig` and TRL's
`ModelConfig` (LoRA with `--use_peft`). `--help` lists the common ones, `--help-all` every one.
With `--async`, `AsyncGRPOConfig` replaces `GRPOConfig` and LoRA is left out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from retool_env.config import EnvConfig

TINY_CPU_CONFIG = Path(__file__).parent / "configs" / "grpo_tiny_cpu.yaml"


@dataclass
class EnvArguments(EnvConfig.with_defaults(max_completion_tokens=None, taken_elsewhere=["chat_template_kwargs"])):  # type: ignore[misc]  # a dataclass built at import time (EnvConfig.with_defaults)
    """The environment (`EnvConfig`: tool format, prompt, reward, budgets, sandbox) and the problems it plays.

    `max_completion_tokens` defaults to GRPOConfig's `max_completion_length`, which spans every turn; GRPOConfig's own
    `chat_template_kwargs` set the template's options (ReToolRollout forwards them to every environment render)."""

    dataset: str = field(default="arith", metadata={
        "help": "Training problems: a name (arith, dapo, dapo-processed, aime24, aime25, math500), a local "
                "parquet/jsonl file or folder, or a Hub id; read by retool_env.data.load_problems."})
    dataset_split: str = field(default="train", metadata={"help": "Split of `dataset`."})
    dataset_limit: int | None = field(default=None, metadata={"help": "Use at most this many training problems."})
    eval_dataset: str | None = field(default=None, metadata={
        "help": "Evaluation problems (for example aime24), played with the same environment; needs eval_strategy."})
    eval_split: str | None = field(default=None, metadata={"help": "Split of `eval_dataset` (arith: test)."})
    eval_limit: int | None = field(default=None, metadata={"help": "Use at most this many evaluation problems."})
    concurrency: int = field(default=256, metadata={"help": "Episodes run at once per process."})
    episode_timeout: float | None = field(default=None, metadata={
        "help": "Seconds an episode may take; a slower one is dropped from training (zero advantage, no loss)."})
    records_path: str | None = field(default=None, metadata={
        "help": "Append every training episode to this JSONL file (retool_env.records); `retool-env regrade` "
                "re-scores it."})
    skip_steps_without_signal: bool = field(default=False, metadata={
        "help": "Skip the optimizer step when every group's rewards are equal (the gradient is zero, yet Adam's "
                "momentum would move the weights): retool_adapters.trl.callbacks.SkipStepsWithoutSignal."})


def main(env_args: EnvArguments, training_args, model_args) -> None:
    # Heavy imports here, so that `--help` is instant.
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from retool_adapters.scripts import load_policy
    from retool_adapters.trl import REWARD_FUNCS, REWARD_WEIGHTS, ReToolRollout, problems_to_dataset
    from retool_adapters.trl.callbacks import SkipStepsWithoutSignal
    from retool_env.data import load_problems

    # 1. The policy. Without a model, build a tiny random Qwen2 (offline, seconds) so the script runs anywhere.
    tokenizer = load_policy(model_args, training_args)

    # 2. The problems. TRL passes the rollout only the `prompt` column, the raw question it maps back to a problem.
    train_problems = load_problems(env_args.dataset, split=env_args.dataset_split, limit=env_args.dataset_limit)
    eval_problems = []
    if env_args.eval_dataset is not None:
        eval_problems = load_problems(env_args.eval_dataset, split=env_args.eval_split, limit=env_args.eval_limit)

    # 3. The rollout: one environment episode per prompt, generated by the trainer's engine (vLLM or HF generate).
    env_config = EnvConfig.from_settings(
        env_args, max_completion_tokens=env_args.max_completion_tokens or training_args.max_completion_length)
    rollout = ReToolRollout(train_problems + eval_problems, tokenizer=tokenizer, concurrency=env_args.concurrency,
                            episode_timeout=env_args.episode_timeout, records_path=env_args.records_path,
                            **env_config)

    # 4. The rewards: the environment's own reward trains; correctness (weight 0) puts accuracy in the logs.
    if training_args.reward_weights is None:
        training_args.reward_weights = list(REWARD_WEIGHTS)

    # 5. Train: GRPO (DAPO token-level loss by default), interpreter tokens masked out of the loss via env_mask.
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=list(REWARD_FUNCS),
        args=training_args,
        train_dataset=problems_to_dataset(train_problems),
        eval_dataset=problems_to_dataset(eval_problems) if eval_problems else None,
        processing_class=tokenizer,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
        rollout_func=rollout,
        callbacks=[SkipStepsWithoutSignal()] if env_args.skip_steps_without_signal else None,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)

    # 6. Save the policy (the LoRA adapter under --use_peft) and the log history.
    trainer.save_model(training_args.output_dir)
    trainer.save_state()
    trainer.accelerator.print(f"Model and trainer_state.json saved to {training_args.output_dir}.")
    trainer.end()


def main_async(env_args: EnvArguments, training_args, model_args) -> None:
    """GRPO with generation decoupled from training: `ReToolRolloutWorker` plays episodes against the vLLM server
    the trainer pushes its weights to, tagging every turn with the policy version that wrote it; the trainer drops
    samples more than `max_staleness` versions old. Needs CUDA (AsyncGRPOTrainer's packed attention is
    FlashAttention-3)."""
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from retool_adapters.generators import OpenAICompletionsGenerator
    from retool_adapters.trl import problems_to_dataset, sampling_from_config
    from retool_adapters.trl.async_worker import ReToolRolloutWorker
    from retool_env.data import load_problems

    if not model_args.model_name_or_path:
        raise ValueError("--async needs --model_name_or_path: the model the vLLM server at vllm_server_base_url serves")
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    problems = load_problems(env_args.dataset, split=env_args.dataset_split, limit=env_args.dataset_limit)
    env_config = EnvConfig.from_settings(
        env_args, max_completion_tokens=env_args.max_completion_tokens or training_args.max_completion_length)
    worker = ReToolRolloutWorker(
        problems, tokenizer,
        OpenAICompletionsGenerator(training_args.vllm_server_base_url, model_args.model_name_or_path),
        num_generations=training_args.num_generations, sampling=sampling_from_config(training_args),
        max_inflight_groups=max(1, env_args.concurrency // training_args.num_generations),
        max_staleness=training_args.max_staleness, episode_timeout=env_args.episode_timeout,
        queue_maxsize=training_args.queue_maxsize, seed=training_args.seed, **env_config)
    trainer = AsyncGRPOTrainer(model=model_args.model_name_or_path, args=training_args,
                               train_dataset=problems_to_dataset(problems), processing_class=tokenizer,
                               rollout_worker=worker)  # the environment's reward, normalised per group, is the reward
    try:
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    finally:
        worker.stop()
    trainer.save_model(training_args.output_dir)
    trainer.save_state()


@dataclass
class AsyncModelArguments:
    """The policy of `--async`, in place of TRL's ModelConfig: AsyncGRPOConfig carries `dtype` and
    `trust_remote_code` itself, and LoRA is left out (vLLM would have to serve each adapter version by name)."""

    model_name_or_path: str = field(default="", metadata={"help": "The policy, as the vLLM server serves it."})
    model_revision: str = field(default="main", metadata={"help": "Revision of the policy (a branch, tag or commit)."})


def make_parser(asynchronous: bool = False):
    from trl import GRPOConfig, ModelConfig

    from retool_adapters.scripts import ScriptParser

    if asynchronous:
        from trl.experimental.async_grpo import AsyncGRPOConfig

        types: tuple[type, ...] = (EnvArguments, AsyncGRPOConfig, AsyncModelArguments)
    else:
        types = (EnvArguments, GRPOConfig, ModelConfig)
    return ScriptParser(types, own=(EnvArguments,), default_config=TINY_CPU_CONFIG, prog="grpo_trl.py",
                        description="GRPO with a Python interpreter in the loop: TRL's GRPOTrainer (AsyncGRPOTrainer "
                        "with --async), every episode played by ReTool-Env. Without --config: the offline CPU "
                        "smoke run.")


if __name__ == "__main__":
    import sys

    from retool_adapters.scripts import run

    asynchronous = "--async" in sys.argv  # chosen before parsing: the two trainers have their own config classes
    run(main_async if asynchronous else main, make_parser(asynchronous), [a for a in sys.argv[1:] if a != "--async"])
