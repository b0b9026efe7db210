"""Check TRL's AsyncGRPOTrainer with ReToolRolloutWorker on a GPU: the part the CPU tests cannot reach.

AsyncGRPOTrainer needs CUDA to be built (it reads the device's peak FLOPs) and to train (its packed attention is
FlashAttention-3, fetched by `kernels` from the Hub's kernels-community/flash-attn3, so the machine needs the Hub or
a warm kernels cache). This script trains the tiny Qwen2 taught to call the interpreter for a few steps, generating
with Hugging Face `generate` on a second copy of the policy; the trainer's NCCL push to a vLLM server is replaced by
copying its weights into that copy (the same `WeightTransferProtocol` calls, in one process). It asserts the run
trained, synced weights, tagged samples with versions and logged `retool/*`.

    .venv/bin/python scripts/check_async_grpo_gpu.py      # about a minute on one GPU
"""

from __future__ import annotations

import math
import os
import sys
import tempfile

import torch


class CopyWeights:
    """`WeightTransferProtocol` in one process: the generator's model receives the trainer's weights."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = dict(model.named_parameters())
        self.syncs = 0

    def init_weight_transfer(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def send_weights(self, iterator) -> None:
        with torch.no_grad():
            for name, tensor in iterator:
                self.params[name.removeprefix("module.")].copy_(tensor)
        self.syncs += 1

    def resume(self) -> None:
        pass

    def destroy(self) -> None:
        pass


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: AsyncGRPOTrainer cannot be built here", file=sys.stderr)
        return 2
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from retool_adapters.generators import HFGenerator
    from retool_adapters.trl import problems_to_dataset
    from retool_adapters.trl.async_worker import ReToolRolloutWorker
    from retool_adapters.trl.testing import build_tool_calling_qwen
    from retool_env.data import load_problems

    work = tempfile.mkdtemp(prefix="async-grpo-check-")
    problems = load_problems("arith", split="train", limit=2)
    model_dir = build_tool_calling_qwen(os.path.join(work, "model"), problems)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy_copy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to("cuda")
    transfer = CopyWeights(policy_copy)
    worker = ReToolRolloutWorker(problems, tokenizer, HFGenerator(policy_copy, tokenizer), num_generations=4,
                                 max_completion_tokens=128, max_tool_calls=2, max_staleness=2)
    args = AsyncGRPOConfig(output_dir=os.path.join(work, "run"), max_steps=4, per_device_train_batch_size=8,
                           num_generations=4, max_completion_length=128, learning_rate=1e-4, logging_steps=1,
                           token_budget=0, max_staleness=2, weight_sync_steps=1, report_to="none", save_strategy="no")
    trainer = AsyncGRPOTrainer(model=str(model_dir), args=args, train_dataset=problems_to_dataset(problems),
                               processing_class=tokenizer, rollout_worker=worker, weight_transfer=transfer)
    try:
        trainer.train()
    finally:
        worker.stop()
    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    print(steps)
    assert len(steps) == 4 and all(math.isfinite(entry["loss"]) for entry in steps)
    assert transfer.syncs >= 4 and worker.model_version >= 4
    assert any("retool/tool_calls_per_episode" in entry for entry in trainer.state.log_history)
    assert any("sample/staleness_max" in entry for entry in trainer.state.log_history)
    print("AsyncGRPOTrainer with ReToolRolloutWorker: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
