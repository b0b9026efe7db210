"""verl: the trajectory filters and episode records on verl's real classes (verl 0.9.1, .venv-frameworks).

Scripted episodes run through `ReToolAgentLoop` (built as verl's worker builds it, generating through verl's real
`LLMServerClient`) and verl v1's `AgentLoopWorkerTQ._agent_loop_postprocess`; `ReToolReplayBuffer` is verl's own
`ReplayBuffer.sample` loop (eviction, refill, selection) with the filters' decisions. TransferQueue's store is held
in memory (`tq.init()` needs Ray actors), as in tests/test_adapter_verl.py; the trainer's `refill_fn` is the
test's, submitting scripted groups.
"""

from __future__ import annotations

import asyncio

import pytest

from retool_env.records import read_records, regrade

from .test_adapter_scripted import ScriptedEngine, tool_call
from .test_adapter_verl import ROW, Replica, TransferQueueStore, llm_client, v1_advantages, v1_worker, verl_config

RIGHT = [tool_call("print(123 * 456)") + "<|im_end|>", "So the answer is \\boxed{56088}.<|im_end|>"]
RIGHT_AFTER_ERROR = ["<tool_call>\n{not json}\n</tool_call><|im_end|>", tool_call("print(123 * 456)") + "<|im_end|>",
                     "So the answer is \\boxed{56088}.<|im_end|>"]
WRONG = ["It is \\boxed{4}.<|im_end|>"]
WRONG_AFTER_CALL = [tool_call("print(2 + 2)") + "<|im_end|>", "It is \\boxed{4}.<|im_end|>"]
VOID = ["I am not sure.<|im_end|>"]  # an answer turn with nothing to extract: SimpleTIR's void turn


def agent_loop(tok, manager, config, **loop_kwargs):
    """`ReToolAgentLoop` from verl's registry entry plus the options, as verl's AgentLoopWorker instantiates it."""
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry

    import retool_adapters.verl as adapter

    entry = OmegaConf.create({**_agent_loop_registry[adapter.AGENT_NAME],
                              "env_kwargs": {"tool_format": "hermes", "tool_timeout": 10.0}, **loop_kwargs})
    return hydra.utils.instantiate(entry, trainer_config=DictConfigWrap(config), server_manager=manager,
                                   tokenizer=tok, processor=None, dataset_cls=None,
                                   data_config=DictConfigWrap(config.data))


def play(tok, config, script, **loop_kwargs):
    replica = Replica(ScriptedEngine([tok.encode(t, add_special_tokens=False) for t in script]))
    loop = agent_loop(tok, llm_client(config, replica), config, **loop_kwargs)
    return asyncio.run(loop.run({"temperature": 1.0, "logprobs": True}, **{**ROW, "uid": "p0", "global_steps": 4}))


def test_void_turns_are_masked_with_their_reward_kept_and_every_episode_is_recorded(qwen_tok, tmp_path):
    config = verl_config()
    path = tmp_path / "records.jsonl"
    void = play(qwen_tok, config, VOID, mask_void_turns=True, records_path=str(path))
    plain = play(qwen_tok, config, VOID)
    right = play(qwen_tok, config, RIGHT, mask_void_turns=True, records_path=str(path))
    assert void.response_mask == [0] * len(void.response_ids) and any(plain.response_mask)
    assert void.reward_score == plain.reward_score == -1.0  # still in its group's advantages
    assert void.extra_fields["reward_extra_info"]["retool/void_turn_ratio"] == 1.0
    assert right.response_mask == plain_mask(qwen_tok, config, RIGHT) and any(right.response_mask)
    assert right.extra_fields["reward_extra_info"]["retool/void_turn_ratio"] == 0.0
    (written,) = tmp_path.glob("records.*-*.jsonl")  # one file per process
    records = list(read_records(written))
    assert [r["filtered"] for r in records] == [["void_turn"], []]
    assert records[0]["env_mask"] == [0] * len(records[0]["completion_ids"]) and records[0]["pred"] is None
    assert records[1]["completion_ids"] == right.response_ids and records[1]["env_mask"] == right.response_mask
    assert [r["group"] for r in records] == ["p0", "p0"] and [r["policy_version"] for r in records] == [3, 3]
    assert [r["reward"] for r in records] == [void.reward_score, right.reward_score]
    assert regrade(records).reward_mismatches == 0 and regrade(records).regraded == 2


def plain_mask(tok, config, script):
    return play(tok, config, script).response_mask


class Store(TransferQueueStore):
    """The in-memory TransferQueue, with the prompt tags and `kv_list` / `kv_clear` the replay buffer reads."""

    def __init__(self):
        super().__init__()
        self.prompts: dict[str, dict] = {}

    def kv_list(self):
        return {"train": {**self.prompts, **self.tags}}

    def kv_clear(self, *, partition_id, keys):
        for key in keys:
            for table in (self.rows, self.tags, self.prompts):
                table.pop(key, None)


def put_group(tok, config, worker, store, uid, scripts, global_steps):
    """One prompt's finished group in the store, as `AgentLoopWorkerTQ._run_prompt` leaves it."""
    for session_id, script in enumerate(scripts):
        replica = Replica(ScriptedEngine([tok.encode(t, add_special_tokens=False) for t in script]))
        loop = agent_loop(tok, llm_client(config, replica), config)
        kwargs = {**ROW, "uid": uid, "global_steps": global_steps}
        output = asyncio.run(loop.run({"temperature": 1.0, "logprobs": True}, **kwargs))
        asyncio.run(worker._agent_loop_postprocess(output, False, session_id=session_id, **kwargs))
    store.prompts[uid] = {"is_prompt": True, "status": "finished", "global_steps": global_steps}


def replay_buffer(monkeypatch, store, refill, **sampler_kwargs):
    from verl.trainer.ppo.v1 import replay_buffer as module

    from retool_adapters.verl import ReToolReplayBuffer

    monkeypatch.setattr(module.tq, "kv_list", store.kv_list)
    monkeypatch.setattr(module.tq, "kv_clear", store.kv_clear)
    return ReToolReplayBuffer("sync", {}, None, "drop", sampler_kwargs, poll_interval=0.01, refill_fn=refill)


def test_the_accuracy_filter_evicts_groups_outside_its_range_and_refills_twice_over(qwen_tok, monkeypatch):
    config = verl_config(n=2)
    store = Store()
    worker = v1_worker(qwen_tok, config, monkeypatch, store)
    put_group(qwen_tok, config, worker, store, "p0", [RIGHT, RIGHT_AFTER_ERROR], global_steps=1)  # all right
    put_group(qwen_tok, config, worker, store, "p1", [RIGHT, WRONG], global_steps=1)
    refills = []

    def refill(count):  # the trainer submits `count` new prompts; the test's arrive finished
        refills.append(count)
        for i in range(count):
            put_group(qwen_tok, config, worker, store, f"r{len(refills)}{i}", [WRONG, RIGHT], global_steps=2 + i)

    buffer = replay_buffer(monkeypatch, store, refill, accuracy_filter=[0.1, 0.9], train_batch_size=2,
                           max_inflight_gen_batches=2)
    batch, metrics = buffer.sample(global_steps=2, partition_id="train", batch_size=2)
    assert refills == [2]  # one group evicted: twice as many new prompts, as verl's DAPO filter refills
    assert sorted(batch.keys) == ["p1_0_0", "p1_1_0", "r10_0_0", "r10_1_0"]  # r11 is the discarded surplus
    assert metrics["training/filter_groups/evicted_samples"] == 1
    assert not any(key.startswith("p0") for key in store.rows)  # cleared from TransferQueue
    with pytest.raises(ValueError, match="train_batch_size"):
        replay_buffer(monkeypatch, store, refill, accuracy_filter=[0.1, 0.9])
    with pytest.raises(ValueError, match="sync"):
        from retool_adapters.verl import ReToolReplayBuffer

        ReToolReplayBuffer("async", {}, None, "drop", {"roc_down_sample": 2, "train_batch_size": 1})


def test_roc_keeps_n_of_each_2n_and_verls_grpo_scores_the_kept_alone(qwen_tok, monkeypatch):
    config = verl_config(n=4)
    store = Store()
    worker = v1_worker(qwen_tok, config, monkeypatch, store)
    put_group(qwen_tok, config, worker, store, "p0", [RIGHT_AFTER_ERROR, RIGHT, WRONG, WRONG_AFTER_CALL],
              global_steps=1)
    put_group(qwen_tok, config, worker, store, "p1", [WRONG] * 4, global_steps=1)  # equal scores: rejected
    buffer = replay_buffer(monkeypatch, store, lambda count: None, roc_down_sample=2, train_batch_size=1)
    batch, metrics = buffer.sample(global_steps=2, partition_id="train", batch_size=1)
    # Of the positives the one without a failed call; one negative of two, drawn.
    assert len(batch.keys) == 2 and "p0_1_0" in batch.keys and {"p0_2_0", "p0_3_0"} & set(batch.keys)
    assert sorted(store.rows) == sorted(batch.keys)  # the dropped half cleared, the rejected group evicted
    assert metrics["training/retool/roc_dropped"] == 0.5 and metrics["training/filter_groups/evicted_samples"] == 1
    advantages = v1_advantages(store)  # verl's GRPO over what RoC kept: one right, one wrong
    assert advantages["p0_1_0"].unique().tolist() == pytest.approx([0.7071], abs=1e-3)
    (negative,) = {"p0_2_0", "p0_3_0"} & set(batch.keys)
    assert advantages[negative].unique().tolist() == pytest.approx([-0.7071], abs=1e-3)
