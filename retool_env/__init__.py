"""ReTool-Env: a token-level gym environment for LLMs that solve math with a code interpreter.

`import retool_env` registers the environment ids with gymnasium and stays light: the public names below are
imported on first use, and nothing here imports torch, trl or vllm.
"""

from __future__ import annotations

import importlib
from typing import Any

from gymnasium.envs.registration import register

__version__ = "0.1.0"

_EXPORTS = {
    "EnvConfig": "retool_env.config",
    "ToolEnvironment": "retool_env.env",
    "make_env_factory": "retool_env.env",
    "Trajectory": "retool_env.trajectory",
    "Problem": "retool_env.data",
    "load_problems": "retool_env.data",
    "grade": "retool_env.grading",
    "extract_answer": "retool_env.grading",
    "is_equivalent": "retool_env.grading",
    "get_reward_fn": "retool_env.rewards",
    "LocalSandbox": "retool_env.sandbox",
    "make_sandbox": "retool_env.sandbox",
    "run_episode": "retool_env.rollout",
    "run_episodes": "retool_env.rollout",
    # Extension points (docs/extending.md): what a generation backend, a template or a prompt reader builds on.
    "EpisodeAborted": "retool_env.rollout",
    "Generation": "retool_env.rollout",
    "Generator": "retool_env.rollout",
    "SamplingParams": "retool_env.rollout",
    "Conversation": "retool_env.chat",
    "with_chat_template": "retool_env.chat",
    "message_text": "retool_env.data",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'retool_env' has no attribute {name!r}")


# DAPO-Math-17k, the ReTool recipe's RL data (needs the dataset locally when offline: pass dataset=path); with no
# tokenizer and no dataset, Qwen's vocabulary rebuilt offline and the packaged `math-sample` (retool_env.defaults).
register(id="ReTool-Math-v0", entry_point="retool_env.defaults:make_env_with_defaults",
         kwargs={"default_dataset": "dapo"})
# Procedural arithmetic where running code beats mental arithmetic; offline, for tests and the miniature.
register(id="ReTool-Arith-v0", entry_point="retool_env.defaults:make_env_with_defaults", kwargs={"dataset": "arith"})
