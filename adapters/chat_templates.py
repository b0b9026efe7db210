"""The chat template a trainer trains on: the tokenizer's own, or TRL's prefix-preserving training version of it.

Trainers that take one sample per episode (TRL's `rollout_func`, verl's agent loop) need a template that renders
earlier turns the same whatever follows them. Qwen3's and DeepSeek-R1-Distill's do not; TRL ships training versions
that do (`trl/chat_templates/*_training.jinja`). `training_env_kwargs` swaps one in and says so in the log; a
template the caller chose (`chat_template=`, e.g. "qwen3" to train on the template as deployed) and the `turn`
sample mode are left alone. TRL is imported here, never in `retool_env`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)


def training_env_kwargs(tokenizer: Any, env_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`env_kwargs` with `chat_template` set to TRL's training version of the tokenizer's template when no template
    was chosen, the episode is one sample (`sample_mode` "episode") and the tokenizer's template is not
    prefix-preserving. For a template TRL has no training version of, a warning says what to do."""
    env_kwargs = dict(env_kwargs)
    chosen = env_kwargs.get("chat_template") is not None or env_kwargs.get("sample_mode", "episode") != "episode"
    if chosen or not getattr(tokenizer, "chat_template", None):
        return env_kwargs
    try:
        from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving
    except ImportError:
        return env_kwargs
    if is_chat_template_prefix_preserving(tokenizer):
        return env_kwargs
    training = get_training_chat_template(tokenizer)
    if training is None:
        logger.warning("the chat template is not prefix-preserving and TRL has no training version of it: the "
                       "environment will count rewritten turns (trajectory.rewritten_turns); pass a "
                       "prefix-preserving chat_template or use sample_mode='turn' with a trainer that takes "
                       "several samples per episode")
        return env_kwargs
    logger.warning("the chat template is not prefix-preserving (it rewrites earlier turns); training on TRL's "
                   "prefix-preserving version of it instead (pass chat_template= to choose another)")
    return {**env_kwargs, "chat_template": training}
