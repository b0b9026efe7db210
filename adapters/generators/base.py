"""The base of every generation backend, public so a new backend (or a framework's engine client) needs no private
name: `TurnGenerator` (subclass it and write `_generate`), `LogprobsMismatchError`, `ThreadBatcher` (batches
blocking calls in a worker thread), and `sampling_from_mapping` (a framework's sampling dict to `SamplingParams`).

    from retool_adapters.generators.base import TurnGenerator

    class EchoGenerator(TurnGenerator):
        async def _generate(self, prompt_ids, max_tokens, stop_token_ids, stop, sampling):
            ...  # return a retool_env.rollout.Generation of at most max_tokens tokens

docs/extending.md ("A framework adapter") walks through one.
"""

from __future__ import annotations

import abc
import asyncio
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from retool_env.rollout import Generation, SamplingParams

Request = TypeVar("Request")
Result = TypeVar("Result")

# vLLM treats a temperature below this as greedy decoding (vllm/sampling_params.py); every backend here does too.
GREEDY_TEMPERATURE = 1e-5
# The protocol's default sampling settings, shared so no default argument is a call.
DEFAULT_SAMPLING = SamplingParams()

__all__ = ["DEFAULT_SAMPLING", "GREEDY_TEMPERATURE", "LogprobsMismatchError", "ThreadBatcher", "TurnGenerator",
           "sampling_from_mapping"]


def sampling_from_mapping(sampling_params: Mapping[str, Any]) -> SamplingParams:
    """The `SamplingParams` of a framework's vLLM-style sampling dict (verl's, slime's: `temperature`, `top_p`,
    `top_k`, and `sampling_seed` or `seed`); other keys are the caller's to check. A `top_k` of 0 or less means off
    (-1), as in vLLM and TRL."""
    seed = sampling_params.get("sampling_seed", sampling_params.get("seed"))
    top_k = int(sampling_params.get("top_k", -1))
    return SamplingParams(temperature=float(sampling_params.get("temperature", 1.0)),
                          top_p=float(sampling_params.get("top_p", 1.0)), top_k=top_k if top_k > 0 else -1,
                          seed=None if seed is None else int(seed))


def spent_budget_turn() -> Generation:
    """The turn of a spent token budget, answered without a request: engines reject `max_tokens=0`."""
    return Generation(token_ids=[], logprobs=[], finish_reason="length")


class TurnGenerator(abc.ABC):
    """The `Generator` protocol's `generate`, once: no request when the turn's budget is spent
    (`spent_budget_turn`), plain lists for the backend's `_generate`."""

    async def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        stop_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        sampling: SamplingParams = DEFAULT_SAMPLING,
    ) -> Generation:
        if max_tokens <= 0:
            return spent_budget_turn()
        return await self._generate(list(prompt_ids), max_tokens, list(stop_token_ids), list(stop), sampling)

    @abc.abstractmethod
    async def _generate(
        self, prompt_ids: list[int], max_tokens: int, stop_token_ids: list[int], stop: list[str],
        sampling: SamplingParams,
    ) -> Generation:
        """Generate one turn of at most `max_tokens` (at least 1) tokens."""


class LogprobsMismatchError(RuntimeError):
    """The backend returned no logprobs, or not exactly one per token: the episode must be aborted, never
    zero-filled."""


class ThreadBatcher(Generic[Request, Result]):
    """Gathers the requests awaited within `window_s` into batches for one blocking call, run in a worker thread.

    Requests whose `key` differs cannot share a call (for example different sampling settings) and go in separate
    batches. While a batch runs, new requests queue up and form the next batch, so batches grow with the load and the
    event loop stays free. Calls never overlap, even from several event loops: models are not thread-safe.
    """

    def __init__(
        self,
        run_batch: Callable[[list[Request]], list[Result]],
        *,
        window_s: float,
        max_batch_size: int,
        key: Callable[[Request], Hashable] = lambda request: None,
    ) -> None:
        self.run_batch = run_batch
        self.window_s = window_s
        self.max_batch_size = max_batch_size
        self.key = key
        self._pending: list[tuple[Request, asyncio.Future[Result]]] = []
        self._worker: asyncio.Task[None] | None = None
        self._lock = threading.Lock()

    async def submit(self, request: Request) -> Result:
        """Queue one request and wait for its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._pending.append((request, future))
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(self.window_s)
            pending, self._pending = self._pending, []
            groups: dict[Hashable, list[tuple[Request, asyncio.Future[Result]]]] = {}
            for item in pending:
                groups.setdefault(self.key(item[0]), []).append(item)
            for group in groups.values():
                for start in range(0, len(group), self.max_batch_size):
                    await self._run(group[start : start + self.max_batch_size])

    async def _run(self, batch: list[tuple[Request, asyncio.Future[Result]]]) -> None:
        try:
            results = await asyncio.to_thread(self._run_locked, [request for request, _ in batch])
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    def _run_locked(self, requests: list[Request]) -> list[Result]:
        with self._lock:
            return self.run_batch(requests)
