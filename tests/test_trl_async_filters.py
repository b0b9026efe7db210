"""The accuracy filter and RoC down-sampling in `ReToolRolloutWorker`: scripted groups through the real environment
and sandbox, TRL's real `RolloutSample`; what the worker queues, the advantages it gives, its metrics and records.

The asynchronous worker has no fixed batch, so it oversamples for real: a group the filters take out is not queued
(the next group takes its place), and RoC queues n of 2n with advantages over those n alone.
"""

from __future__ import annotations

import asyncio

import pytest

from retool_adapters.trl.async_worker import ReToolRolloutWorker, group_advantages
from retool_env.records import read_records, regrade

from .test_trl import SIX_SEVENS, ScriptedGenerator, call

CLEAN_RIGHT = [call("print(6*7)"), "So the answer is \\boxed{42}."]
FIXED_RIGHT = [call("print(6*"), call("print(6*7)"), "So the answer is \\boxed{42}."]  # one failed call first
WRONG = ["It is \\boxed{41}."]
WRONG_AFTER_CALL = [call("print(1)"), "It is \\boxed{41}."]


def play(tok, tmp_path, scripts, group_id=0, **options):
    """One group of len(scripts) episodes through `_play_group`: (queued samples, records, pushed metrics)."""
    worker = ReToolRolloutWorker([SIX_SEVENS], tok, ScriptedGenerator(tok, scripts), num_generations=len(scripts),
                                 tool_format="hermes", max_tool_calls=3, max_completion_tokens=512,
                                 records_path=str(tmp_path / f"records{group_id}.jsonl"), **options)
    asyncio.run(worker._play_group(SIX_SEVENS, group_id=group_id))
    queued = [worker.rollout_buffer.get_nowait() for _ in range(worker.rollout_buffer.qsize())]
    return queued, list(read_records(tmp_path / f"records{group_id}.jsonl")), worker.metrics_queue.get_nowait()


def text(tok, sample, record):
    return tok.decode(sample.input_ids[len(record["prompt_ids"]):].tolist())


def test_the_accuracy_filter_queues_no_group_outside_its_range(qwen_tok, tmp_path):
    queued, records, metrics = play(qwen_tok, tmp_path, [CLEAN_RIGHT, FIXED_RIGHT, CLEAN_RIGHT, FIXED_RIGHT],
                                    accuracy_filter=(0.1, 0.9))
    assert queued == [] and [r["filtered"] for r in records] == [["accuracy"]] * 4  # all right: no signal
    assert all(r["trained_reward"] is None and r["env_mask"] == [0] * len(r["completion_ids"]) for r in records)
    assert metrics["retool/filtered_groups"] == (1.0, 1)

    mixed = [CLEAN_RIGHT, WRONG, WRONG, WRONG]  # accuracy 0.25: inside, queued as without the filter
    queued, records, metrics = play(qwen_tok, tmp_path, mixed, group_id=1, accuracy_filter=(0.1, 0.9))
    plain, _, _ = play(qwen_tok, tmp_path, mixed, group_id=2)
    assert [s.advantage for s in queued] == pytest.approx([s.advantage for s in plain]) and len(queued) == 4
    assert [r["filtered"] for r in records] == [[]] * 4 and metrics["retool/filtered_groups"] == (0.0, 1)
    assert regrade(records).reward_mismatches == 0


def test_roc_queues_n_of_2n_with_advantages_over_the_kept_and_rejects_equal_groups(qwen_tok, tmp_path):
    queued, records, metrics = play(qwen_tok, tmp_path, [FIXED_RIGHT, CLEAN_RIGHT, WRONG, WRONG_AFTER_CALL],
                                    roc_down_sample=2)
    # One positive of two (the one without a failed call), one negative of two: 2 queued, advantages +-1.
    assert [r["correct"] for r in records] == [True, True, False, False]
    assert records[0]["filtered"] == ["roc"] and records[1]["filtered"] == []
    assert sorted(map(tuple, (r["filtered"] for r in records[2:]))) == [(), ("roc",)]
    kept = [r for r in records if not r["filtered"]]
    assert len(queued) == 2 and [text(qwen_tok, s, r) for s, r in zip(queued, kept, strict=True)] == [
        qwen_tok.decode(r["completion_ids"]) for r in kept]
    rewards = [r["reward"] for r in kept]
    assert [s.advantage for s in queued] == pytest.approx(group_advantages(rewards).tolist())
    assert [s.advantage for s in queued] == pytest.approx([1.0, -1.0], abs=1e-6)
    assert [r["trained_reward"] for r in records] == [None, rewards[0], *(
        r["reward"] if not r["filtered"] else None for r in records[2:])]
    assert metrics["retool/roc_dropped"] == (2.0, 4) and metrics["retool/roc_rejected_groups"] == (0.0, 1)
    assert regrade(records).reward_mismatches == 0

    queued, records, metrics = play(qwen_tok, tmp_path, [WRONG] * 4, group_id=1, roc_down_sample=2)
    assert queued == [] and [r["filtered"] for r in records] == [["roc_equal_reward"]] * 4
    assert metrics["retool/roc_rejected_groups"] == (1.0, 1)


def test_the_worker_checks_the_filter_options():
    with pytest.raises(ValueError, match="roc_down_sample"):
        ReToolRolloutWorker([SIX_SEVENS], None, None, roc_down_sample=1)
    with pytest.raises(ValueError, match="accuracy_filter"):
        ReToolRolloutWorker([SIX_SEVENS], None, None, accuracy_filter=(0.9, 0.1))
