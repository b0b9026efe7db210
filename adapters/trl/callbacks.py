"""Trainer callbacks for GRPO with sparse rewards."""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback


class SkipStepsWithoutSignal(TrainerCallback):
    """No learning signal, no update.

    GRPO gives zero advantage to a group whose rewards are all equal; when every group of a step is so (and no KL
    term pulls), the gradient is exactly zero. Adam still moves the weights then: its momentum carries the last
    signal on, divided by a second moment that has decayed, so a policy that sees a signal once in many steps (a
    text-only model on problems it cannot solve, say) takes sign-like steps of a full learning rate long after it.
    This callback clears such all-zero gradients before the optimizer step, which then leaves every parameter, and
    Adam's state, as it was (PyTorch optimizers skip parameters without a gradient; the learning-rate schedule goes on).

    Works where the Trainer steps a PyTorch optimizer on whole gradients (one process, DDP); not under FSDP or
    DeepSpeed, whose ranks each hold a shard.
    """

    def __init__(self) -> None:
        self.skipped = 0

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if grads and not torch.stack([grad.ne(0).any() for grad in grads]).any():  # one device sync, not one each
            for parameter in model.parameters():
                parameter.grad = None
            self.skipped += 1

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        """Steps skipped so far, in the log history (trainer_state.json) beside the loss."""
        if logs is not None and "loss" in logs and state.log_history:
            state.log_history[-1]["retool/skipped_steps"] = self.skipped
