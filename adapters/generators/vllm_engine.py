"""An in-process vLLM engine as a Generator: `AsyncLLM` (true concurrency) or `vllm.LLM` (batched in a thread)."""

from __future__ import annotations

import uuid
from typing import Any

from vllm import LLM, TokensPrompt
from vllm import SamplingParams as VLLMSamplingParams
from vllm.outputs import CompletionOutput
from vllm.sampling_params import RequestOutputKind

from retool_env.rollout import Generation, SamplingParams

from .base import LogprobsMismatchError, ThreadBatcher, TurnGenerator


class VLLMEngineGenerator(TurnGenerator):
    """Generates with an in-process vLLM engine from token-id prompts, one logprob per generated token.

    With an `AsyncLLM` (`vllm.AsyncLLMEngine`) every call is its own request and vLLM's scheduler batches them
    continuously. A `vllm.LLM` (what TRL's colocate mode holds) blocks, so calls arriving within `batch_window_ms` go
    to one `LLM.generate` in a worker thread. The logprobs are whatever the engine's `logprobs_mode` says (vLLM's
    default "raw_logprobs": the model's log-softmax before temperature, top-k and top-p). An `AsyncLLM` serves the
    event loop it was first used from: create it, and run every episode, under one `asyncio.run`.
    """

    def __init__(self, engine: Any, *, batch_window_ms: float = 5.0, max_batch_size: int = 256) -> None:
        self.engine = engine
        self._batcher = (
            ThreadBatcher(self._generate_batch, window_s=batch_window_ms / 1000, max_batch_size=max_batch_size)
            if isinstance(engine, LLM)
            else None
        )

    async def _generate(
        self, prompt_ids: list[int], max_tokens: int, stop_token_ids: list[int], stop: list[str],
        sampling: SamplingParams,
    ) -> Generation:
        """Generate one turn; stop strings and stop tokens stay in the returned ids."""
        prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
        params = VLLMSamplingParams(
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=max(sampling.top_k, 0),
            seed=sampling.seed,
            stop=list(stop),
            stop_token_ids=list(stop_token_ids),
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            logprobs=0,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        if self._batcher is not None:
            return await self._batcher.submit((prompt, params))
        final = None
        async for output in self.engine.generate(prompt, params, request_id=uuid.uuid4().hex):
            final = output
        if final is None:
            return Generation(token_ids=[], logprobs=None, finish_reason="abort")
        return _to_generation(final.outputs[0])

    def _generate_batch(self, requests: list[tuple[TokensPrompt, VLLMSamplingParams]]) -> list[Generation]:
        outputs = self.engine.generate([p for p, _ in requests], [s for _, s in requests], use_tqdm=False)
        return [_to_generation(output.outputs[0]) for output in outputs]


def _to_generation(output: CompletionOutput) -> Generation:
    token_ids = list(output.token_ids)
    if output.logprobs is None or len(output.logprobs) != len(token_ids):
        got = "no" if output.logprobs is None else len(output.logprobs)
        raise LogprobsMismatchError(f"vLLM returned {got} logprobs for {len(token_ids)} tokens")
    # Each position maps token id -> Logprob; with logprobs=0 it holds just the sampled token.
    logprobs = [position[token].logprob for token, position in zip(token_ids, output.logprobs, strict=True)]
    finish_reason = output.finish_reason if output.finish_reason in ("stop", "length") else "abort"
    return Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason)
