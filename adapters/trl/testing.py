"""A tiny offline policy that really calls the interpreter, so tests and demos of the TRL path see multi-turn episodes.

A random tiny model never writes a well-formed `<tool_call>`, so its episodes hold no interpreter tokens and a test of
the loss mask could not fail. `build_tool_calling_qwen` teaches `build_tiny_qwen`'s model, in a few seconds of Adam
on CPU, the two turns of one episode played through the real environment: a call that prints 6 * 7, then the answer
`\\boxed{42}`. Its episodes then have model tokens, interpreter tokens (mask 0) and model tokens again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from retool_adapters.offline_models import build_tiny_qwen
from retool_env.data import Problem

TOOL_CALL = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
ANSWER = "The answer is \\boxed{42}."


def build_tool_calling_qwen(out_dir: str | Path, problems: Sequence[Problem], *, tool_format: str = "hermes",
                            steps: int = 30, learning_rate: float = 3e-3, seed: int = 0) -> Path:
    """Save to `out_dir` a tiny Qwen2 that, prompted with one of `problems`, calls the interpreter once then answers."""
    from retool_env.env import ToolEnvironment

    path = build_tiny_qwen(out_dir, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    env = ToolEnvironment(tokenizer, list(problems), tool_format=tool_format, max_tool_calls=1)
    end = env.format.end_token_ids[0]
    turns = [tokenizer.encode(text, add_special_tokens=False) + [end] for text in (TOOL_CALL, ANSWER)]
    rows = []
    for problem in problems:
        env.reset(options={"problem": problem})
        for turn in turns:
            env.step(turn)
        traj = env.trajectory
        assert traj is not None
        labels = [-100] * len(traj.prompt_ids) + [t if m else -100 for t, m in zip(traj.completion_ids, traj.env_mask,
                                                                                   strict=True)]
        rows.append((traj.prompt_ids + traj.completion_ids, labels))
    env.close()
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    attention_mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(steps):  # the model's own turns only: it learns to write, never to predict the interpreter
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.save_pretrained(path)
    return path
