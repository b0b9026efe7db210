"""TRL's `VLLMClient` (GRPOTrainer's server mode: `trainer.vllm_generation.vllm_client`) as a Generator."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from retool_env.rollout import Generation, SamplingParams

from ._common import LogprobsMismatchError, TurnGenerator


class TRLVLLMClientGenerator(TurnGenerator):
    """Generates through `trl.generation.vllm_client.VLLMClient.generate`, one blocking call per turn in a thread.

    Stop strings and stop ids travel in `generation_kwargs`. The client returns the top logprobs per token sorted by
    probability, so the sampled token's value is looked up by id rather than taken first. The client does not return
    a finish reason: a turn shorter than `max_tokens`, or ending in a stop id or one of `eos_token_ids`, is "stop";
    otherwise "length" (a stop string completed by exactly the last allowed token is reported as "length").
    """

    def __init__(self, client: Any, *, eos_token_ids: Sequence[int] = ()) -> None:
        self.client = client
        self.eos_token_ids = frozenset(eos_token_ids)

    async def _generate(
        self, prompt_ids: list[int], max_tokens: int, stop_token_ids: list[int], stop: list[str],
        sampling: SamplingParams,
    ) -> Generation:
        """Generate one turn; the server batches concurrent turns itself."""
        generation_kwargs: dict[str, Any] = {
            "stop": list(stop),
            "stop_token_ids": list(stop_token_ids),
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            **({"seed": sampling.seed} if sampling.seed is not None else {}),
        }
        output = await asyncio.to_thread(
            self.client.generate,
            prompts=[list(prompt_ids)],
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=max(sampling.top_k, 0),
            max_tokens=max_tokens,
            logprobs=0,
            generation_kwargs=generation_kwargs,
        )
        token_ids = list(output["completion_ids"][0])
        if output.get("logprobs") is None or output.get("logprob_token_ids") is None:
            raise LogprobsMismatchError("the vLLM server returned no logprobs")
        positions = list(zip(output["logprob_token_ids"][0], output["logprobs"][0], strict=True))
        if len(positions) != len(token_ids):
            raise LogprobsMismatchError(f"{len(positions)} logprob positions for {len(token_ids)} tokens")
        logprobs = []
        for token, (ids, values) in zip(token_ids, positions, strict=True):
            value = dict(zip(ids, values, strict=True)).get(token)
            if value is None:
                raise LogprobsMismatchError(f"no logprob for sampled token {token}")
            logprobs.append(float(value))
        ended_by_stop = bool(token_ids) and token_ids[-1] in set(stop_token_ids) | self.eos_token_ids
        finish_reason = "stop" if len(token_ids) < max_tokens or ended_by_stop else "length"
        return Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason)
