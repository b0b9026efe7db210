"""Hugging Face `generate` as a Generator: the CPU path for training and the reference the other backends match."""

from __future__ import annotations

import contextlib
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

from ._common import GREEDY_TEMPERATURE, ThreadBatcher, TurnGenerator

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
    vLLM's order: temperature, then top-k, then top-p. A `sampling.seed` makes a request reproducible: it runs alone,
    under that seed. Logprobs are those of the sampled tokens, as vLLM's `logprobs_mode` names them:
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
    ) -> None:
        self.model = model.eval() if device is None else model.to(device).eval()
        self.device = next(model.parameters()).device
        self.tokenizer = tokenizer
        self.logprobs_mode = logprobs_mode
        eos = model.generation_config.eos_token_id
        self.eos_token_ids = frozenset([eos] if isinstance(eos, int) else eos or []) | {tokenizer.eos_token_id}
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else tokenizer.eos_token_id
        self._batcher = ThreadBatcher(
            self._generate_batch, window_s=batch_window_ms / 1000, max_batch_size=max_batch_size, key=_batch_key
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

    def _generate_batch(self, requests: list[_Request]) -> list[Generation]:
        sampling = requests[0].sampling
        greedy = sampling.temperature < GREEDY_TEMPERATURE
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.tensor([[self.pad_token_id] * (width - len(r.prompt_ids)) + r.prompt_ids for r in requests])
        attention_mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in requests])
        warpers = [] if greedy else _warpers(sampling)
        capture = _SampledLogprobs()
        processors = [capture, *warpers] if self.logprobs_mode == "raw_logprobs" else [*warpers, capture]
        stops = _RowStops(requests, self.tokenizer, prompt_width=width)
        # Neutral values keep the model's generation_config defaults out (Qwen ships top_k=20, repetition_penalty=1.05);
        # the warpers above do the sampling, in vLLM's order.
        neutral = {} if greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
        config = GenerationConfig(
            max_new_tokens=max(r.max_tokens for r in requests),
            do_sample=not greedy,
            repetition_penalty=1.0,
            eos_token_id=sorted(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
            **neutral,
        )
        seeded = torch.random.fork_rng(devices=[]) if sampling.seed is not None else contextlib.nullcontext()
        with seeded, torch.inference_mode():
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            sequences = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                generation_config=config,
                logits_processor=LogitsProcessorList(processors),
                stopping_criteria=StoppingCriteriaList([stops]),
            )
        logprobs = capture.sampled_logprobs(sequences).tolist()
        completions = sequences[:, width:].tolist()
        return [
            Generation(token_ids=ids[:length], logprobs=row_logprobs[:length], finish_reason=reason)
            for ids, row_logprobs, (length, reason) in zip(completions, logprobs, stops.ends, strict=True)
        ]


def _batch_key(request: _Request) -> object:
    """Requests batch together when they sample alike; a seeded request runs alone so its result is reproducible."""
    if request.sampling.seed is not None:
        return id(request)
    if request.sampling.temperature < GREEDY_TEMPERATURE:
        return "greedy"
    return request.sampling


def _warpers(sampling: SamplingParams) -> list[LogitsProcessor]:
    warpers: list[LogitsProcessor] = []
    if sampling.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k > 0:
        warpers.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(sampling.top_p))
    return warpers


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

    def __init__(self, requests: list[_Request], tokenizer: PreTrainedTokenizerBase, *, prompt_width: int) -> None:
        self.requests = requests
        self.tokenizer = tokenizer
        self.prompt_width = prompt_width
        # A stop string of n UTF-8 bytes spans at most n tokens, so the last n tokens hold it.
        self.windows = [max((len(s.encode()) for s in r.stop), default=0) for r in requests]
        self.ends: list[tuple[int, str] | None] = [None] * len(requests)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        generated = input_ids[:, self.prompt_width :].tolist()
        for row, (request, ids) in enumerate(zip(self.requests, generated, strict=True)):
            if self.ends[row] is None:
                if ids[-1] in request.stop_token_ids or self._completes_stop_string(row, ids):
                    self.ends[row] = (len(ids), "stop")
                elif len(ids) >= request.max_tokens:
                    self.ends[row] = (len(ids), "length")
        return torch.tensor([end is not None for end in self.ends], device=input_ids.device)

    def _completes_stop_string(self, row: int, ids: list[int]) -> bool:
        if not self.windows[row]:
            return False
        tail = self.tokenizer.decode(ids[-self.windows[row] :], skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
        return any(s in tail for s in self.requests[row].stop)
