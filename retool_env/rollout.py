"""Rollout driver: runs episodes of the environment against a generation backend.

The environment never generates. A `Generator` turns prompt token ids into the policy's next action; the driver
below runs many episodes concurrently, each continuing as soon as its own tool call returns (no batch lockstep).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings every backend understands (vLLM conventions: top_k=-1 means off)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    """One turn of generated tokens, exactly as the backend produced them.

    `logprobs` has one float per token (the sampled token's log-probability) or is None when the backend cannot give
    them; a trainer that needs them must abort the episode rather than invent values. When a stop string or stop
    token ended the turn, its tokens are included (vLLM's `include_stop_str_in_output=True`).
    """

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str  # "stop" (EOS, stop token or stop string), "length" (max_tokens), or "abort"

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"{len(self.logprobs)} logprobs for {len(self.token_ids)} tokens")


@runtime_checkable
class Generator(Protocol):
    """A generation backend: Hugging Face `generate`, a vLLM engine, an OpenAI-compatible server, TRL's client."""

    async def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        stop_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        sampling: SamplingParams = SamplingParams(),
    ) -> Generation: ...
