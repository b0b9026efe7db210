"""Hugging Face `generate` as a Generator: the CPU path for training and the reference the other backends match."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from retool_env.rollout import Generation, SamplingParams

from .base import GREEDY_TEMPERATURE, ThreadBatcher, TurnGenerator

LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]


@dataclass
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    stop_token_ids: frozenset[int]
    stop: tuple[str, ...]
    sampling: SamplingParams


class HFGenerator(TurnGenerator):
    """Generates with `model.generate`, batching the calls that arrive together into one left-padded batch.

    Stopping follows vLLM: the model's EOS ids, `stop_token_ids`, and stop strings end a turn (finish_reason "stop")
    and their tokens are kept; a stop string ends the turn at the token that completes it; `max_tokens` ends it with
    "length". Only `SamplingParams` shape sampling (the model's `generation_config` sampling defaults are ignored), in
    vLLM's order: temperature, then top-k, then top-p. A `sampling.seed` makes a request reproducible whatever it is
    batched with: its tokens are drawn with Gumbel noise keyed by (seed, position in the sequence), as vLLM's
    per-request seeds are independent of the batch, and its logits are computed with the same shapes in any batch
    (CPU and GPU matrix kernels round differently for different shapes): its prompt is left-padded to a width that
    depends on its own length only (a multiple of `pad_multiple`), and the batch is filled up to `max_batch_size` rows.
    Logprobs are those of the sampled tokens, as vLLM's `logprobs_mode` names them:
    "raw_logprobs" (vLLM's default) is the log-softmax of the model's logits; "processed_logprobs" is that of the
    distribution actually sampled from, after temperature, top-k and top-p. Greedy decoding gives the same numbers in
    both modes.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        device: str | torch.device | None = None,
        batch_window_ms: float = 5.0,
        max_batch_size: int = 64,
        logprobs_mode: LogprobsMode = "raw_logprobs",
        pad_multiple: int = 64,
    ) -> None:
        self.model = model.eval() if device is None else model.to(device).eval()
        self.device = next(model.parameters()).device
        self.tokenizer = tokenizer
        self.logprobs_mode = logprobs_mode
        self.pad_multiple = pad_multiple
        eos = model.generation_config.eos_token_id
        self.eos_token_ids = frozenset([eos] if isinstance(eos, int) else eos or []) | {tokenizer.eos_token_id}
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else tokenizer.eos_token_id
        self._batcher = ThreadBatcher(
            self._generate_batch, window_s=batch_window_ms / 1000, max_batch_size=max_batch_size, key=self._batch_key
        )

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> HFGenerator:
        """Load a model folder (such as one `build_tiny_qwen` wrote) with its tokenizer."""
        return cls(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), **kwargs)

    async def _generate(
        self, prompt_ids: list[int], max_tokens: int, stop_token_ids: list[int], stop: list[str],
        sampling: SamplingParams,
    ) -> Generation:
        """Generate one turn; concurrent calls within `batch_window_ms` share a `model.generate` call."""
        request = _Request(list(prompt_ids), max_tokens, frozenset(stop_token_ids) | self.eos_token_ids,
                           tuple(stop), sampling)
        return await self._batcher.submit(request)

    def _batch_key(self, request: _Request) -> object:
        """Requests batch together when they sample alike; seeded ones also need the same padded width."""
        sampling = request.sampling
        if sampling.seed is not None:
            return dataclasses.replace(sampling, seed=0), self._padded_width(len(request.prompt_ids))
        if sampling.temperature < GREEDY_TEMPERATURE:
            return "greedy"
        return sampling

    def _padded_width(self, length: int) -> int:
        return -(-length // self.pad_multiple) * self.pad_multiple

    def _generate_batch(self, requests: list[_Request]) -> list[Generation]:
        sampling = requests[0].sampling
        greedy = sampling.temperature < GREEDY_TEMPERATURE
        keyed = sampling.seed is not None and not greedy
        width = max(len(r.prompt_ids) for r in requests)
        rows = requests
        if sampling.seed is not None:  # shapes that do not depend on the batch: see the class docstring
            width = self._padded_width(width)  # the same for every request of the batch (the batch key)
            rows = requests + requests[:1] * (self._batcher.max_batch_size - len(requests))
        input_ids = torch.tensor([[self.pad_token_id] * (width - len(r.prompt_ids)) + r.prompt_ids for r in rows])
        attention_mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in rows])
        warpers = [] if greedy else _warpers(sampling)
        capture = _SampledLogprobs()
        processors = [capture, *warpers] if self.logprobs_mode == "raw_logprobs" else [*warpers, capture]
        if keyed:  # argmax of the processed scores plus Gumbel noise samples from their softmax
            processors.append(_KeyedGumbel([int(r.sampling.seed or 0) for r in rows], [len(r.prompt_ids) for r in rows],
                                           prompt_width=width))
        stops = _RowStops(requests, self.tokenizer, prompt_width=width, filler_rows=len(rows) - len(requests))
        # Neutral values keep the model's generation_config defaults out (Qwen ships top_k=20, repetition_penalty=1.05);
        # the warpers above do the sampling, in vLLM's order.
        neutral = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
        config = GenerationConfig(
            max_new_tokens=max(r.max_tokens for r in requests),
            do_sample=not greedy and not keyed,
            repetition_penalty=1.0,
            eos_token_id=sorted(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
            **({} if greedy or keyed else neutral),
        )
        with torch.inference_mode():
            sequences = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                generation_config=config,
                logits_processor=LogitsProcessorList(processors),
                stopping_criteria=StoppingCriteriaList([stops]),
            )
        logprobs = capture.sampled_logprobs(sequences)[: len(requests)].tolist()
        completions = sequences[: len(requests), width:].tolist()
        return [  # type: ignore[misc]  # every row has ended (stops.ends is set) once generate returns
            Generation(token_ids=ids[:length], logprobs=row_logprobs[:length], finish_reason=reason)
            for ids, row_logprobs, (length, reason) in zip(completions, logprobs, stops.ends, strict=True)
        ]


def _warpers(sampling: SamplingParams) -> list[LogitsProcessor]:
    warpers: list[LogitsProcessor] = []
    if sampling.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k > 0:
        warpers.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(sampling.top_p))
    return warpers


_SPLITMIX = tuple(c - (1 << 64) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))  # as int64


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x >> bits) & ((1 << (64 - bits)) - 1)  # logical: int64 `>>` is arithmetic


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    """A stateless 64-bit hash (SplitMix64's finalizer), computed with wrapping int64 arithmetic."""
    _, m1, m2 = _SPLITMIX
    x = (x ^ _shift_right(x, 30)) * m1
    x = (x ^ _shift_right(x, 27)) * m2
    return x ^ _shift_right(x, 31)


def keyed_gumbel(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel noise of shape (rows, vocab_size), a pure function of each row's (seed, position) and the token id:
    what a row samples does not depend on the rows it is batched with or on the order of requests."""
    gamma = _SPLITMIX[0]
    row = _splitmix64(_splitmix64(seeds) + positions * gamma)
    tokens = torch.arange(1, vocab_size + 1, device=seeds.device, dtype=torch.int64) * gamma
    bits = _shift_right(_splitmix64(row[:, None] + tokens), 11)  # 53 random bits
    uniform = (bits.double() + 0.5) / float(1 << 53)  # in (0, 1)
    return -torch.log(-torch.log(uniform))


class _KeyedGumbel(LogitsProcessor):
    """Adds each row's keyed Gumbel noise to the final scores; greedy decoding then samples from their softmax."""

    def __init__(self, seeds: list[int], prompt_lengths: list[int], *, prompt_width: int) -> None:
        self.seeds = torch.tensor([seed & ((1 << 63) - 1) for seed in seeds], dtype=torch.int64)
        self.prompt_lengths = torch.tensor(prompt_lengths, dtype=torch.int64)
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        positions = self.prompt_lengths + (input_ids.shape[1] - self.prompt_width)  # of the token being drawn
        noise = keyed_gumbel(self.seeds.to(scores.device), positions.to(scores.device), scores.shape[-1])
        return scores + noise.to(scores.dtype)


class _SampledLogprobs(LogitsProcessor):
    """Keeps the log-softmax of one step at a time and picks the sampled token's entry at the next step.

    Storing every step's full distribution (`output_scores=True`) costs steps x batch x vocabulary floats, gigabytes
    for a Qwen vocabulary; this keeps one step.
    """

    def __init__(self) -> None:
        self._picked: list[torch.Tensor] = []
        self._last: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._last is not None:
            self._picked.append(self._last.gather(1, input_ids[:, -1:]))
        self._last = scores.float().log_softmax(-1)
        return scores

    def sampled_logprobs(self, sequences: torch.Tensor) -> torch.Tensor:
        """Logprobs of every generated token, shape (batch, steps)."""
        if self._last is None:
            return sequences.new_zeros((sequences.shape[0], 0), dtype=torch.float32)
        return torch.cat([*self._picked, self._last.gather(1, sequences[:, -1:])], dim=1).cpu()


class _RowStops(StoppingCriteria):
    """Each row's own stop ids, stop strings and max_tokens; records where and why each row ended."""

    def __init__(self, requests: list[_Request], tokenizer: PreTrainedTokenizerBase, *, prompt_width: int,
                 filler_rows: int = 0) -> None:
        self.requests = requests
        self.filler_rows = filler_rows  # rows after the requests that only fill the batch: done from the start
        self.tokenizer = tokenizer
        self.prompt_width = prompt_width
        # A stop string of n UTF-8 bytes spans at most n tokens, so the last n tokens hold it.
        self.windows = [max((len(s.encode()) for s in r.stop), default=0) for r in requests]
        self.ends: list[tuple[int, str] | None] = [None] * len(requests)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        generated = input_ids[: len(self.requests), self.prompt_width :].tolist()
        for row, (request, ids) in enumerate(zip(self.requests, generated, strict=True)):
            if self.ends[row] is None:
                if ids[-1] in request.stop_token_ids or self._completes_stop_string(row, ids):
                    self.ends[row] = (len(ids), "stop")
                elif len(ids) >= request.max_tokens:
                    self.ends[row] = (len(ids), "length")
        done = [end is not None for end in self.ends] + [True] * self.filler_rows
        return torch.tensor(done, device=input_ids.device)

    def _completes_stop_string(self, row: int, ids: list[int]) -> bool:
        if not self.windows[row]:
            return False
        tail = self.tokenizer.decode(ids[-self.windows[row] :], skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
        return any(s in tail for s in self.requests[row].stop)
