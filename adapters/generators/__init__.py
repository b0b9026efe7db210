"""Generation backends implementing `retool_env.rollout.Generator`, one module each.

Imports are lazy: `OpenAICompletionsGenerator` needs only httpx, so a driver talking to a server never loads torch.

- `HFGenerator` (hf.py): Hugging Face `generate`, batched; the CPU path and the reference.
- `VLLMEngineGenerator` (vllm_engine.py): an in-process `vllm.LLM` or `AsyncLLM`.
- `OpenAICompletionsGenerator` (openai_completions.py): any OpenAI-compatible `/v1/completions` server taking
  token-id prompts (vLLM, SGLang).
- `TRLVLLMClientGenerator` (trl_client.py): TRL's `VLLMClient`, as GRPOTrainer's server mode holds it.

A new backend subclasses `TurnGenerator` (base.py, the public base: `generate` checks the budget once, the backend
writes `_generate`); `sampling_from_mapping` reads a framework's sampling dict. See docs/extending.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import LogprobsMismatchError, ThreadBatcher, TurnGenerator, sampling_from_mapping

if TYPE_CHECKING:
    from .hf import HFGenerator
    from .openai_completions import OpenAICompletionsGenerator
    from .trl_client import TRLVLLMClientGenerator
    from .vllm_engine import VLLMEngineGenerator

_MODULES = {
    "HFGenerator": ".hf",
    "VLLMEngineGenerator": ".vllm_engine",
    "OpenAICompletionsGenerator": ".openai_completions",
    "TRLVLLMClientGenerator": ".trl_client",
}

__all__ = ["HFGenerator", "LogprobsMismatchError", "OpenAICompletionsGenerator", "TRLVLLMClientGenerator",
           "ThreadBatcher", "TurnGenerator", "VLLMEngineGenerator", "sampling_from_mapping"]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
