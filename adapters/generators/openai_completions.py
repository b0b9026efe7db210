"""Any OpenAI-compatible `/v1/completions` server taking token-id prompts (vLLM, SGLang) as a Generator."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx

from retool_env.rollout import Generation, SamplingParams

from .base import LogprobsMismatchError, TurnGenerator

_RETRY_STATUS = {429, 500, 502, 503, 504}


class OpenAICompletionsGenerator(TurnGenerator):
    """Posts each turn to `{base_url}/completions` with the prompt as token ids, and reads token ids back.

    The request asks for vLLM's token-level extensions: `return_token_ids`, `return_tokens_as_token_ids`,
    `include_stop_str_in_output`, `skip_special_tokens=False`, `stop_token_ids`, `top_k`; so the returned ids are
    exactly what the model sampled and need no re-tokenization. Token ids come from the choice's `token_ids`, else
    from `logprobs.tokens` ("token_id:N"). Missing logprobs, or not one per token, raise `LogprobsMismatchError`.
    Connection errors and 429/5xx answers are retried `max_retries` times with exponential backoff.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        client: httpx.AsyncClient | None = None,
        max_retries: int = 3,
        timeout_s: float = 600.0,
        max_connections: int = 256,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        base_url = base_url.rstrip("/")
        self.url = (base_url if base_url.endswith("/v1") else base_url + "/v1") + "/completions"
        self.model = model
        self.max_retries = max_retries
        self.extra_body = extra_body or {}
        self._given_client = client
        self._client_args: dict[str, Any] = {
            "timeout": httpx.Timeout(timeout_s, pool=None),  # wait for a free connection instead of failing
            "limits": httpx.Limits(max_connections=max_connections),
        }
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    def _client(self) -> httpx.AsyncClient:
        # An httpx client's connections belong to one event loop; keep one client per loop.
        if self._given_client is not None:
            return self._given_client
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            self._clients[loop] = httpx.AsyncClient(**self._client_args)
        return self._clients[loop]

    async def aclose(self) -> None:
        """Close the clients this generator opened (not one passed in)."""
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    async def _generate(
        self, prompt_ids: list[int], max_tokens: int, stop_token_ids: list[int], stop: list[str],
        sampling: SamplingParams,
    ) -> Generation:
        """Generate one turn with one HTTP request."""
        payload: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "max_tokens": max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "stop": list(stop),
            "stop_token_ids": list(stop_token_ids),
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            **({"seed": sampling.seed} if sampling.seed is not None else {}),
            **self.extra_body,
        }
        body = await self._post(payload)
        return parse_completion_choice(body["choices"][0])

    async def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(self.max_retries + 1):
            try:
                response = await self._client().post(self.url, json=payload)
                if response.status_code not in _RETRY_STATUS or attempt == self.max_retries:
                    response.raise_for_status()
                    return response.json()
            except httpx.TransportError:
                if attempt == self.max_retries:
                    raise
            await asyncio.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")


def parse_completion_choice(choice: dict[str, Any]) -> Generation:
    """Token ids, one logprob per token and the finish reason from one choice of a completions response."""
    logprobs = choice.get("logprobs") or {}
    tokens = logprobs.get("tokens")
    token_ids = choice.get("token_ids")
    if token_ids is None and tokens is not None:
        token_ids = [int(token.removeprefix("token_id:")) for token in tokens]
    if token_ids is None:
        raise ValueError("the server returned no token ids: it must support `return_token_ids` (vLLM >= 0.10.2)")
    values = logprobs.get("token_logprobs")
    if values is None or len(values) != len(token_ids):
        got = "no" if values is None else len(values)
        raise LogprobsMismatchError(f"the server returned {got} logprobs for {len(token_ids)} tokens")
    if tokens is not None and [f"token_id:{t}" for t in token_ids] != tokens:
        raise LogprobsMismatchError("the logprobs belong to other tokens than the returned token ids")
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        raise LogprobsMismatchError(f"the server returned non-finite or missing logprobs: {values}")
    finish_reason = choice.get("finish_reason")
    return Generation(
        token_ids=list(token_ids),
        logprobs=[float(v) for v in values],
        finish_reason=finish_reason if finish_reason in ("stop", "length") else "abort",
    )
