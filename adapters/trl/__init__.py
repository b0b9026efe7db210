"""TRL adapters, one module per way of plugging ReTool-Env into TRL's GRPOTrainer:

- `rollout`: `ReToolRollout`, GRPOTrainer's `rollout_func` (token in, token out; every tool format), and the reward
  functions that read the episode's reward (`env_reward`, `correctness`);
- `environment`: `CodeInterpreterEnvironment`, for TRL's own tool loop (`environment_factory`);
- `async_worker`: `ReToolRolloutWorker`, for TRL's `AsyncGRPOTrainer`;
- `callbacks`: `SkipStepsWithoutSignal`;
- `testing`: a tiny tool-calling Qwen built offline, for tests and examples;
- `internals`: the TRL internals the others read, with the TRL version they were checked against.

The names below are the ones `from retool_adapters.trl import ...` has always given.
"""

from retool_adapters.trl.environment import CodeInterpreterEnvironment, grade_final_answers
from retool_adapters.trl.rollout import (
    REWARD_FUNCS,
    REWARD_WEIGHTS,
    ReToolRollout,
    TRLEndTokens,
    correctness,
    env_reward,
    episode_metrics,
    has_void_turn,
    index_problems,
    log_sandbox_metrics,
    problems_to_dataset,
    question_of,
    roc_penalty,
    roc_select,
    sampling_from_config,
    trl_end_tokens,
)

__all__ = [
    "REWARD_FUNCS",
    "REWARD_WEIGHTS",
    "CodeInterpreterEnvironment",
    "ReToolRollout",
    "TRLEndTokens",
    "correctness",
    "env_reward",
    "episode_metrics",
    "grade_final_answers",
    "has_void_turn",
    "index_problems",
    "log_sandbox_metrics",
    "problems_to_dataset",
    "question_of",
    "roc_penalty",
    "roc_select",
    "sampling_from_config",
    "trl_end_tokens",
]
