"""GRPO with a Python interpreter in the loop (ReTool's RL stage), on TRL's GRPOTrainer and ReTool-Env.

Each prompt of a batch is played as one multi-turn episode of `ToolEnvironment`: the policy writes, calls the code
interpreter, reads its output (tokens with no loss), and answers; the environment grades the answer and its reward
is GRPO's reward. Generation uses the trainer's own vLLM (colocate or server mode) or, with `use_vllm: false`,
Hugging Face `generate` on the policy.

    # Offline CPU smoke run: a tiny random Qwen2 on procedural arithmetic (training/configs/grpo_tiny_cpu.yaml)
    accelerate launch --cpu --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
        training/grpo_trl.py

    # The recipe: Qwen3-4B-Instruct-2507 on DAPO-Math-17k, evaluated on AIME 2024, 8 GPUs, vLLM colocated
    accelerate launch --config_file training/configs/accelerate/zero3.yaml \
        training/grpo_trl.py --config training/configs/grpo_qwen3_4b_dapo_colocate.yaml

Arguments come from three dataclasses, read from a YAML file (`--config`) and the command line alike:
`EnvArguments` below, TRL's `GRPOConfig` and TRL's `ModelConfig` (LoRA with `--use_peft`).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

TINY_CPU_CONFIG = Path(__file__).parent / "configs" / "grpo_tiny_cpu.yaml"


@dataclass
class EnvArguments:
    """The environment's side: data, tool format, reward, budgets, sandbox."""

    dataset: str = field(default="arith", metadata={
        "help": "Training problems: a name (arith, dapo, dapo-processed, aime24, aime25, math500), a local "
                "parquet/jsonl file or folder, or a Hub id; read by retool_env.data.load_problems."})
    dataset_split: str = field(default="train", metadata={"help": "Split of `dataset`."})
    dataset_limit: int | None = field(default=None, metadata={"help": "Use at most this many training problems."})
    eval_dataset: str | None = field(default=None, metadata={
        "help": "Evaluation problems (for example aime24), played with the same environment; needs eval_strategy."})
    eval_split: str | None = field(default=None, metadata={"help": "Split of `eval_dataset` (arith: test)."})
    eval_limit: int | None = field(default=None, metadata={"help": "Use at most this many evaluation problems."})
    tool_format: str = field(default="hermes", metadata={
        "help": "hermes (<tool_call> JSON, tool turns through the chat template) or retool (the paper's <code>)."})
    prompt: str | None = field(default=None, metadata={
        "help": "Prompt template (retool, dapo, slime, plain); default: the tool format's own."})
    reward: str = field(default="retool", metadata={
        "help": "Reward scheme: retool (+1 correct; wrong: min(-0.6, -1 + 0.1 * tool calls)) or paper (+-1)."})
    reward_kwargs: str | None = field(default=None, metadata={
        "help": "Keyword arguments of the reward scheme, as JSON (a mapping in YAML)."})
    max_tool_calls: int = field(default=8, metadata={"help": "Executed tool calls allowed per episode."})
    max_completion_tokens: int | None = field(default=None, metadata={
        "help": "Token budget of an episode after the prompt, model and interpreter tokens together; default: "
                "max_completion_length."})
    max_observation_tokens: int = field(default=512, metadata={
        "help": "Tokens of one interpreter output shown to the model (head and tail kept)."})
    max_turn_tokens: int | None = field(default=None, metadata={"help": "Tokens the model may write per turn."})
    tool_timeout: float = field(default=5.0, metadata={"help": "Seconds one tool call may run."})
    stateful: bool = field(default=False, metadata={
        "help": "Keep variables between an episode's tool calls (Jupyter-like)."})
    sandbox: str = field(default="local", metadata={
        "help": "local (the embedded fork-server sandbox) or a SandboxFusion /run_code URL."})
    concurrency: int = field(default=256, metadata={"help": "Episodes run at once per process."})
    episode_timeout: float | None = field(default=None, metadata={
        "help": "Seconds an episode may take; a slower one is dropped from training (zero advantage, no loss)."})


def main(env_args: EnvArguments, training_args, model_args) -> None:
    # Heavy imports here, so that `--help` is instant.
    from transformers import AutoTokenizer
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from retool_adapters.trl import REWARD_FUNCS, REWARD_WEIGHTS, ReToolRollout, problems_to_dataset
    from retool_env.data import load_problems

    # 1. The policy. Without a model, build a tiny random Qwen2 (offline, seconds) so the script runs anywhere.
    if model_args.model_name_or_path is None:
        from retool_adapters.offline_models import build_tiny_qwen

        model_args.model_name_or_path = str(build_tiny_qwen(Path(training_args.output_dir) / "tiny-model"))
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    }

    # 2. The problems. TRL passes the rollout only the `prompt` column, the raw question it maps back to a problem.
    train_problems = load_problems(env_args.dataset, split=env_args.dataset_split, limit=env_args.dataset_limit)
    eval_problems = []
    if env_args.eval_dataset is not None:
        eval_problems = load_problems(env_args.eval_dataset, split=env_args.eval_split, limit=env_args.eval_limit)

    # 3. The rollout: one environment episode per prompt, generated by the trainer's engine (vLLM or HF generate).
    reward_kwargs = env_args.reward_kwargs
    if isinstance(reward_kwargs, str):
        reward_kwargs = json.loads(reward_kwargs)
    budgets = {} if env_args.max_completion_tokens is None else {"max_completion_tokens": env_args.max_completion_tokens}
    rollout = ReToolRollout(
        train_problems + eval_problems,
        tokenizer=tokenizer,
        concurrency=env_args.concurrency,
        episode_timeout=env_args.episode_timeout,
        tool_format=env_args.tool_format,
        prompt=env_args.prompt,
        sandbox=env_args.sandbox,
        reward=env_args.reward,
        reward_kwargs=reward_kwargs,
        max_tool_calls=env_args.max_tool_calls,
        max_observation_tokens=env_args.max_observation_tokens,
        max_turn_tokens=env_args.max_turn_tokens,
        tool_timeout=env_args.tool_timeout,
        stateful=env_args.stateful,
        **budgets,
    )

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
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)

    # 6. Save the policy (the LoRA adapter under --use_peft) and the log history.
    trainer.save_model(training_args.output_dir)
    trainer.save_state()
    trainer.accelerator.print(f"Model and trainer_state.json saved to {training_args.output_dir}.")
    trainer.end()


def make_parser():
    from trl import GRPOConfig, ModelConfig, TrlParser

    return TrlParser((EnvArguments, GRPOConfig, ModelConfig))


if __name__ == "__main__":
    # No arguments at all: the offline CPU smoke run.
    argv = sys.argv[1:] or ["--config", str(TINY_CPU_CONFIG)]
    env_args, training_args, model_args = make_parser().parse_args_and_config(argv)
    main(env_args, training_args, model_args)
