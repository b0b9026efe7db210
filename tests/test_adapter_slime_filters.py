"""slime: the trajectory filters and episode records, on scripted groups through slime's `generate_and_rm_group`
against a real HTTP server speaking SGLang's `/generate` (the stand-ins of tests/slime_standin.py: slime is not on
PyPI), its dynamic filter call and its training-data conversion (`remove_sample` zeroes a sample's loss mask)."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

import pytest

from retool_adapters import slime
from retool_env.records import read_records, regrade

from .slime_standin import DynamicFilterOutput, Sample, dynamic_filter_keeps, generate_and_rm_group, to_train_data
from .test_adapter_scripted import PROBLEM, tool_call
from .test_adapter_slime import Engine, engine_args

RIGHT = [tool_call("print(123 * 456)") + "<|im_end|>", "So the answer is \\boxed{56088}.<|im_end|>"]
RIGHT_AFTER_ERROR = ["<tool_call>\n{not json}\n</tool_call><|im_end|>", tool_call("print(123 * 456)") + "<|im_end|>",
                     "So the answer is \\boxed{56088}.<|im_end|>"]
WRONG = ["It is \\boxed{4}.<|im_end|>"]
WRONG_AFTER_CALL = [tool_call("print(2 + 2)") + "<|im_end|>", "It is \\boxed{4}.<|im_end|>"]
VOID = ["I am not sure.<|im_end|>"]  # an answer turn with nothing to extract: SimpleTIR's void turn


@pytest.fixture(scope="module")
def tok_path(qwen_tok, tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen-tokenizer")
    qwen_tok.save_pretrained(path)
    return str(path)


@pytest.fixture(autouse=True)
def slime_filter_types(monkeypatch):
    """slime's `DynamicFilterOutput` (not importable here), so a drop carries its reason."""
    monkeypatch.setitem(sys.modules, "slime.rollout.filter_hub.base_types",
                        SimpleNamespace(DynamicFilterOutput=DynamicFilterOutput))


def play_group(qwen_tok, tok_path, scripts, group_index=0, **overrides):
    """One group through `generate_and_rm_group`, an engine per sample replaying its script."""
    engines = [Engine("sglang", [qwen_tok.encode(t, add_special_tokens=False) for t in s]) for s in scripts]
    args = engine_args(engines[0], tok_path, "hermes", **overrides)
    group = [Sample(group_index=group_index, index=i, prompt=PROBLEM.question, label=PROBLEM.answer)
             for i in range(len(scripts))]

    async def generate(args, sample, params, evaluation=False):
        per_sample = SimpleNamespace(**{**vars(args), "retool_router_url": engines[sample.index].url})
        return await slime.generate(per_sample, sample, params, evaluation=evaluation)

    try:
        return asyncio.run(generate_and_rm_group(args, group, generate, slime.reward_func)), args
    finally:
        for engine in engines:
            engine.close()


def test_void_turns_leave_the_loss_with_their_reward_and_every_episode_is_recorded(qwen_tok, tok_path, tmp_path):
    samples, args = play_group(qwen_tok, tok_path, [VOID, RIGHT], retool_mask_void_turns=True,
                               retool_records_path=str(tmp_path / "records.jsonl"))
    void, right = samples
    assert void.remove_sample and void.loss_mask == [0] * void.response_length and void.reward == -1.0
    assert not right.remove_sample and any(right.loss_mask) and right.reward == 1.0
    assert void.metadata["retool"]["void_turn"] and not right.metadata["retool"]["void_turn"]
    train = to_train_data(args, samples)  # slime's conversion: the void sample trains on nothing, scored still
    assert train["loss_masks"][0] == [0] * void.response_length and train["rewards"] == [-1.0, 1.0]
    (written,) = tmp_path.glob("records.*-*.jsonl")  # one file per process
    records = list(read_records(written))
    assert [r["filtered"] for r in records] == [["void_turn"], []] and [r["group"] for r in records] == [0, 0]
    assert records[1]["completion_ids"] == right.tokens[-right.response_length:]
    assert records[1]["env_mask"] == right.loss_mask and records[0]["env_mask"] == void.loss_mask
    assert [r["policy_version"] for r in records] == ["v1", "v1"]  # SGLang's weight_version of the first turn
    assert regrade(records).reward_mismatches == 0 and regrade(records).regraded == 2

    plain, _ = play_group(qwen_tok, tok_path, [VOID])
    assert not plain[0].remove_sample and any(plain[0].loss_mask)  # off by default


def test_the_accuracy_filter_drops_groups_outside_its_range(qwen_tok, tok_path):
    right, args = play_group(qwen_tok, tok_path, [RIGHT, RIGHT_AFTER_ERROR], retool_accuracy_filter=[0.1, 0.9])
    assert dynamic_filter_keeps(slime.drop_aborted_groups, args, right) == (False, "accuracy")
    mixed, args = play_group(qwen_tok, tok_path, [RIGHT, WRONG], retool_accuracy_filter=[0.1, 0.9])
    assert dynamic_filter_keeps(slime.drop_aborted_groups, args, mixed) == (True, None)
    args.retool_accuracy_filter = None
    assert dynamic_filter_keeps(slime.drop_aborted_groups, args, right) == (True, None)


def test_roc_keeps_n_of_each_2n_normalised_among_themselves(qwen_tok, tok_path):
    samples, args = play_group(qwen_tok, tok_path, [RIGHT_AFTER_ERROR, RIGHT, WRONG, WRONG_AFTER_CALL],
                               retool_roc_down_sample=2)
    assert dynamic_filter_keeps(slime.drop_aborted_groups, args, samples) == (True, None)
    raw, advantages = slime.roc_rewards(args, samples)
    assert raw == [1.0, 1.0, -1.0, -0.9]
    kept = [i for i, s in enumerate(samples) if not s.remove_sample]
    # Of the positives the one without a failed call; one negative of two, drawn; advantages over the two kept.
    assert len(kept) == 2 and kept[0] == 1 and kept[1] in (2, 3)
    assert advantages[1] == pytest.approx(0.7071, abs=1e-3) and advantages[kept[1]] == pytest.approx(-0.7071, abs=1e-3)
    for i in {0, 1, 2, 3} - set(kept):
        assert advantages[i] == 0.0 and samples[i].loss_mask == [0] * samples[i].response_length
    assert to_train_data(args, samples)["loss_masks"][0] == [0] * samples[0].response_length

    equal, args = play_group(qwen_tok, tok_path, [WRONG] * 4, group_index=1, retool_roc_down_sample=2)
    assert dynamic_filter_keeps(slime.drop_aborted_groups, args, equal) == (False, "roc_equal_reward")
    args.retool_roc_down_sample = None
    with pytest.raises(ValueError, match="retool_roc_down_sample"):
        slime.roc_rewards(args, equal)
