"""TRL's `VLLMClient` (GRPOTrainer's server mode: `trainer.vllm_generation.vllm_client`) as a Generator."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from retool_env.rollout import Generation, SamplingParams

from .base import LogprobsMismatchError, TurnGenerator


class TRLVLLMClientGenerator(TurnGenerator):
    """Generates through `trl.generation.vllm_client.VLLMClient.generate`, one blocking call per turn in a thread.

    Stop strings and stop ids travel in `generation_kwargs`. The client returns the top logprobs per token sorted by
    probability, so the sampled token's value is looked up by id rather than taken first. The client does not return
    a finish reason: a turn shorter than `max_tokens`, or ending in a stop id or one of `eos_token_ids`, is "stop";
    otherwise "length" (a stop string completed by exactly the last allowed token is reported as "length").

    The client blocks, so each turn waits in a thread of the generator's own pool of `concurrency` threads (asyncio's
    default pool would cap the turns in flight at min(32, cores + 4), whatever the rollout's concurrency); `close()`
    ends them. The client's requests have no read timeout, so a turn waits at most `timeout_s` for the server, then
    raises `TimeoutError` (its episode is aborted; the stuck request keeps its thread until the server answers).
    """

    def __init__(self, client: Any, *, eos_token_ids: Sequence[int] = (), concurrency: int = 64,
                 timeout_s: float | None = 600.0) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.client = client
        self.eos_token_ids = frozenset(eos_token_ids)
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="trl-vllm-client")

    def close(self) -> None:
        """End the pool's threads, without waiting for stuck requests."""
        self._executor.shutdown(wait=False, cancel_futures=True)

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
        call = functools.partial(
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
        request = asyncio.get_running_loop().run_in_executor(self._executor, call)
        try:
            output = await asyncio.wait_for(request, self.timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the vLLM server gave no answer in {self.timeout_s} s") from None
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
