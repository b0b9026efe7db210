"""SkipStepsWithoutSignal, with a real PyTorch Adam and a real Trainer's callback handler."""

from __future__ import annotations

import types

import torch
from transformers import TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import CallbackHandler

from retool_adapters.trl.callbacks import SkipStepsWithoutSignal


def adam_after_a_signal() -> tuple[torch.nn.Linear, torch.optim.Adam]:
    """A model whose optimizer has seen one real gradient, so it carries momentum."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def zero_gradient_step(model, optimizer, callback=None) -> list[torch.Tensor]:
    """One optimizer step on an exactly zero gradient (every GRPO group had equal rewards); the weights after it."""
    optimizer.zero_grad(set_to_none=False)
    (0.0 * model(torch.ones(1, 4)).sum()).backward()
    if callback is not None:
        handler = CallbackHandler([callback], model, None, optimizer, None)
        handler.on_pre_optimizer_step(TrainingArguments("unused", report_to="none"), TrainerState(), TrainerControl())
    optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_a_zero_gradient_moves_adam_but_not_with_the_callback():
    model, optimizer = adam_after_a_signal()
    before = [p.detach().clone() for p in model.parameters()]
    moved = zero_gradient_step(model, optimizer)
    assert any(not torch.equal(a, b) for a, b in zip(before, moved, strict=True))  # momentum carried the weights

    model, optimizer = adam_after_a_signal()
    callback = SkipStepsWithoutSignal()
    state_before = {k: v["exp_avg"].clone() for k, v in enumerate(optimizer.state.values())}
    kept = zero_gradient_step(model, optimizer, callback)
    assert all(torch.equal(a, b) for a, b in zip(before, kept, strict=True)) and callback.skipped == 1
    assert all(torch.equal(state_before[k], v["exp_avg"]) for k, v in enumerate(optimizer.state.values()))


def test_a_real_gradient_is_stepped_and_the_count_is_logged():
    model, optimizer = adam_after_a_signal()
    callback = SkipStepsWithoutSignal()
    optimizer.zero_grad()
    model(torch.ones(1, 4)).sum().backward()
    callback.on_pre_optimizer_step(None, None, None, model=model)
    assert callback.skipped == 0 and all(p.grad is not None for p in model.parameters())

    state = types.SimpleNamespace(log_history=[{"loss": 0.1, "step": 1}])
    callback.skipped = 3
    callback.on_log(None, state, None, logs={"loss": 0.1})
    assert state.log_history[-1]["retool/skipped_steps"] == 3
