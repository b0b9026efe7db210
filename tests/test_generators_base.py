"""The generators' public base: the names a new backend or a framework's engine client needs, and the mapping of a
framework's sampling dict to `SamplingParams`."""

from __future__ import annotations

import asyncio

import pytest

from retool_adapters.generators import TurnGenerator, sampling_from_mapping
from retool_env.rollout import Generation, SamplingParams


def test_the_base_is_public_and_the_old_private_name_still_imports():
    from retool_adapters.generators import _common, base

    assert _common.TurnGenerator is base.TurnGenerator is TurnGenerator
    assert _common.LogprobsMismatchError is base.LogprobsMismatchError
    assert set(base.__all__) <= set(dir(_common))


@pytest.mark.parametrize(("params", "expected"), [
    ({}, SamplingParams()),
    ({"temperature": 0.6, "top_p": 0.95, "top_k": 20}, SamplingParams(temperature=0.6, top_p=0.95, top_k=20)),
    ({"temperature": 1, "top_k": 0}, SamplingParams(temperature=1.0, top_k=-1)),  # TRL's and vLLM's "off"
    ({"top_k": -1, "seed": "7"}, SamplingParams(seed=7)),
    ({"sampling_seed": 3, "seed": 9}, SamplingParams(seed=3)),  # slime's per-sample seed wins
    ({"temperature": 0.7, "logprobs": True, "repetition_penalty": 1.0}, SamplingParams(temperature=0.7)),
])
def test_sampling_from_mapping_reads_a_frameworks_sampling_dict(params, expected):
    assert sampling_from_mapping(params) == expected


def test_a_turn_generator_asks_its_backend_nothing_when_the_budget_is_spent():
    calls = []

    class Counting(TurnGenerator):
        async def _generate(self, prompt_ids, max_tokens, stop_token_ids, stop, sampling):
            calls.append((prompt_ids, max_tokens, stop_token_ids, stop))
            return Generation(token_ids=[1] * max_tokens, logprobs=[0.0] * max_tokens, finish_reason="length")

    gen = Counting()
    assert asyncio.run(gen.generate((5, 6), max_tokens=0)).token_ids == []
    assert calls == []
    out = asyncio.run(gen.generate((5, 6), max_tokens=2, stop_token_ids=(9,), stop=("x",)))
    assert out.token_ids == [1, 1]
    assert calls == [([5, 6], 2, [9], ["x"])]  # plain lists for the backend
