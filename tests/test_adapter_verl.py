"""verl adapter: the server-manager generator everywhere, and the registered agent loop where verl installs.

The generator tests' server manager is a stand-in with the signature of verl's `LLMServerClient.generate(request_id,
*, prompt_ids, sampling_params, ...) -> TokenOutput` (verl 0.9.1, verl/workers/rollout/llm_server.py), scripted to
play the shared episodes; it returns verl's real `TokenOutput` when verl is installed (scripts/setup_frameworks.sh),
else a dataclass with TokenOutput's fields. With verl installed, `ReToolAgentLoop` is built the way verl's
AgentLoopWorker builds it (`hydra.utils.instantiate` of the registry entry), generates through verl's real
`LLMServerClient` (which tags each turn with the weights' `global_steps`) over a scripted server actor, and its output
goes through verl's own post-processing: the legacy `AgentLoopWorker` and the v1 trainer's `AgentLoopWorkerTQ`,
`compute_advantage_for_multi_trajectories` and `PPOTrainer._compute_metrics`. What cannot run here is a stand-in,
each named where it is defined: Ray's actor handles (a `.remote` that returns the coroutine) and TransferQueue's
key-value store (in memory: `tq.init()` needs Ray actors).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from retool_adapters.generators import LogprobsMismatchError
from retool_adapters.verl import VerlServerGenerator, agent_loop_fields, problem_from_row
from retool_env.data import Problem
from retool_env.rollout import EpisodeAborted, run_episode

from .test_adapter_scripted import PROBLEM, SCRIPTS, Record, ScriptedEngine, action_ids, local_reference
from .test_adapter_scripted import make_env as make_local_env

try:
    from verl.workers.rollout.replica import TokenOutput
except ImportError:

    @dataclass
    class TokenOutput:  # verl/workers/rollout/replica.py's fields
        token_ids: list[int]
        log_probs: list[float] | None = None
        stop_reason: str | None = None


class ServerManager:
    """Stand-in for verl's LLMServerClient, answering from a script and recording every call."""

    def __init__(self, engine: ScriptedEngine, stop_reason: str = "completed", log_probs: str = "ok") -> None:
        self.engine, self.stop_reason, self.log_probs = engine, stop_reason, log_probs
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None, **kw):
        self.calls.append({"request_id": request_id, "prompt_ids": prompt_ids, "sampling_params": sampling_params})
        turn = self.engine.next(prompt_ids)
        log_probs = {"ok": turn.logprobs, "none": None, "short": turn.logprobs[:-1]}[self.log_probs]
        return TokenOutput(token_ids=turn.token_ids, log_probs=log_probs, stop_reason=self.stop_reason)


ROW = {"raw_prompt": [{"role": "user", "content": PROBLEM.question}], "reward_model": {"ground_truth": PROBLEM.answer},
       "extra_info": {"index": 0}, "data_source": "test", "index": 0}


def record(fields: dict) -> Record:
    return Record(fields["prompt_ids"], fields["response_ids"], fields["response_mask"], fields["response_logprobs"],
                  fields["reward_score"])


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_generator_episode_equals_the_local_env(qwen_tok, script):
    manager = ServerManager(ScriptedEngine(action_ids(qwen_tok, script)))
    generator = VerlServerGenerator(manager, base_params={"logprobs": True, "repetition_penalty": 1.0})
    traj = asyncio.run(run_episode(make_local_env(qwen_tok, script), generator, problem=PROBLEM,
                                   require_logprobs=True))
    assert record(agent_loop_fields(traj, with_logprobs=True)) == local_reference(qwen_tok, script)
    # One request id per episode (verl's sticky session), the env's budget and stops, verl's own params kept.
    assert len({call["request_id"] for call in manager.calls}) == 1
    params = manager.calls[0]["sampling_params"]
    assert params["logprobs"] is True and params["repetition_penalty"] == 1.0
    assert params["include_stop_str_in_output"] is True and params["max_tokens"] > 0
    assert qwen_tok.convert_tokens_to_ids("<|im_end|>") in params["stop_token_ids"]


def test_turn_counts_and_extra_fields(qwen_tok):
    manager = ServerManager(ScriptedEngine(action_ids(qwen_tok, "hermes_wrong")))
    traj = asyncio.run(run_episode(make_local_env(qwen_tok, "hermes_wrong"), VerlServerGenerator(manager),
                                   problem=PROBLEM))
    fields = agent_loop_fields(traj, with_logprobs=False)
    assert fields["num_turns"] == 1 + 3 + 2  # the user prompt, three assistant turns, two tool responses
    assert fields["response_logprobs"] is None and fields["extra_fields"]["num_tool_calls"] == 1


@pytest.mark.parametrize(("stop_reason", "log_probs", "error"), [("aborted", "ok", EpisodeAborted),
                                                                  ("abort", "ok", EpisodeAborted),  # SGLang's
                                                                  ("completed", "none", EpisodeAborted),
                                                                  ("completed", "short", LogprobsMismatchError)])
def test_aborted_or_missing_logprobs_never_zero_filled(qwen_tok, stop_reason, log_probs, error):
    manager = ServerManager(ScriptedEngine(action_ids(qwen_tok, "hermes_correct")), stop_reason, log_probs)
    with pytest.raises(error):
        asyncio.run(run_episode(make_local_env(qwen_tok, "hermes_correct"), VerlServerGenerator(manager),
                                problem=PROBLEM, require_logprobs=True))


def test_length_is_told_apart_from_stop(qwen_tok):
    """verl reports 'completed' for both; a full turn without a stop token was cut off."""
    ids = action_ids(qwen_tok, "hermes_correct")[1]
    manager = ServerManager(ScriptedEngine([ids[:-1]]))
    generation = asyncio.run(VerlServerGenerator(manager).generate([1, 2], max_tokens=len(ids) - 1,
                                                                   stop_token_ids=[ids[-1]]))
    assert generation.finish_reason == "length"


DAPO_PROMPT = ("Solve the following math problem step by step. The last line of your response should be of the form "
               "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n" + PROBLEM.question
               + '\n\nRemember to put your answer on its own line after "Answer:".')


def test_problem_from_row():
    assert problem_from_row(ROW) == Problem(PROBLEM.question, PROBLEM.answer, id="0")
    # DAPO-Math-17k's verl parquet: the instruction wrapper goes, as load_problems strips it (the environment
    # renders its own instruction; keeping DAPO's would template the problem twice).
    dapo = {**ROW, "raw_prompt": [{"role": "user", "content": DAPO_PROMPT}], "extra_info": {"index": 0}}
    assert problem_from_row(dapo).question == PROBLEM.question
    assert problem_from_row({**dapo, "extra_info": {"question": DAPO_PROMPT}}).question == PROBLEM.question


# ------------------------------------------------------------------------------------ with verl's real classes
def verl_config(prompt_length=1024, **rollout):
    pytest.importorskip("verl.experimental.agent_loop.agent_loop",
                        reason="verl is not installed here; run scripts/test_frameworks.sh (.venv-frameworks)")
    from omegaconf import OmegaConf

    return OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm", "prompt_length": prompt_length,
                                                               "response_length": 2048, **rollout}, "model": {}},
                             "data": {}, "trainer": {"use_v1": True}})


def make_agent_loop(tok, manager, prompt_length=1024, config=None, abort_retries=2, **env_kwargs):
    pytest.importorskip("verl.experimental.agent_loop.agent_loop",
                        reason="verl is not installed here; run scripts/test_frameworks.sh (.venv-frameworks)")
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry

    import retool_adapters.verl as adapter

    config = config if config is not None else verl_config(prompt_length)
    entry = OmegaConf.create({**_agent_loop_registry[adapter.AGENT_NAME], "env_kwargs": env_kwargs,
                              "abort_retries": abort_retries})
    return hydra.utils.instantiate(entry, trainer_config=DictConfigWrap(config), server_manager=manager,
                                   tokenizer=tok, processor=None, dataset_cls=None,
                                   data_config=DictConfigWrap(config.data))


class Remote:
    """A Ray actor method's `.remote` without Ray: calling it returns the coroutine the caller awaits."""

    def __init__(self, fn):
        self.remote = fn


class Replica:
    """Stand-in for one verl rollout server actor (`vLLMHttpServer.generate.remote`), answering from a script with
    what verl's servers put in a `TokenOutput`: `num_preempted` and the weights' `global_steps` in `extra_fields`.
    `aborts` calls are answered with `stop_reason` first (verl's vLLM says "aborted", SGLang "abort")."""

    def __init__(self, engine: ScriptedEngine, global_steps=(3,), aborts: int = 0, stop_reason: str = "aborted"):
        self.engine, self.global_steps, self.aborts, self.stop_reason = engine, list(global_steps), aborts, stop_reason
        self.calls: list[dict] = []
        self.generate = Remote(self._generate)

    async def _generate(self, *, request_id, prompt_ids, sampling_params, image_data=None, video_data=None, **kw):
        self.calls.append({"request_id": request_id, "prompt_ids": prompt_ids, "kwargs": kw})
        steps = self.global_steps[min(len(self.calls), len(self.global_steps)) - 1]
        if self.aborts:
            self.aborts -= 1
            return TokenOutput(token_ids=[], log_probs=[], stop_reason=self.stop_reason, num_preempted=1,
                               extra_fields={"global_steps": steps})
        turn = self.engine.next(prompt_ids)
        return TokenOutput(token_ids=turn.token_ids, log_probs=turn.logprobs, stop_reason="completed",
                           num_preempted=0, extra_fields={"global_steps": steps})


def llm_client(config, replica):
    """verl's real `LLMServerClient` over one replica; the load balancer actor is a stand-in (Ray is not started)."""
    from verl.workers.rollout.llm_server import LLMServerClient

    async def no_fields():
        return []

    async def acquire(request_id, **fields):
        return "server-0", replica

    balancer = SimpleNamespace(require_acquire_fields=Remote(no_fields), require_release_fields=Remote(no_fields),
                               acquire_server=Remote(acquire), release_server=Remote(lambda **kw: None))
    return LLMServerClient(config, load_balancer_handle=balancer)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_registered_agent_loop_returns_verls_output(qwen_tok, script):
    manager = ServerManager(ScriptedEngine(action_ids(qwen_tok, script)))
    loop = make_agent_loop(qwen_tok, manager, tool_format=script.split("_")[0], tool_timeout=10.0)
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    output = asyncio.run(loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, **ROW))
    assert isinstance(output, AgentLoopOutput)
    assert record(output.model_dump()) == local_reference(qwen_tok, script, max_completion_tokens=2048)
    assert output.metrics.tool_calls >= 0 and output.extra_fields["aborted"] is False
    info = output.extra_fields["reward_extra_info"]
    assert info["acc"] == float(script.endswith("correct")) and info["score"] == output.reward_score
    fields = output.as_dict()  # verl's own conversion to tensors, reward on the last response token
    assert fields["rm_scores"][-1] == output.reward_score and fields["rollout_log_probs"].shape[0] == len(
        output.response_ids)


@pytest.mark.parametrize("stop_reason", ["aborted", "abort"])
def test_an_aborted_episode_is_replayed_then_raises_never_scored(qwen_tok, stop_reason):
    """No invented reward_score=0.0 for an abort (verl's GRPO would average it into the group): the episode is
    played again from its prompt, and when it keeps aborting the loop raises (v1: the group is evicted)."""
    config = verl_config()
    replica = Replica(ScriptedEngine(action_ids(qwen_tok, "hermes_correct")), aborts=1, stop_reason=stop_reason)
    output = asyncio.run(make_agent_loop(qwen_tok, llm_client(config, replica), config=config).run(
        {"temperature": 1.0, "logprobs": True}, **ROW))
    assert record(output.model_dump()) == local_reference(qwen_tok, "hermes_correct", max_completion_tokens=2048)
    replica = Replica(ScriptedEngine(action_ids(qwen_tok, "hermes_correct")), aborts=99, stop_reason=stop_reason)
    with pytest.raises(EpisodeAborted, match="aborted 3 times"):
        asyncio.run(make_agent_loop(qwen_tok, llm_client(config, replica), config=config).run(
            {"temperature": 1.0, "logprobs": True}, **ROW))
    assert len(replica.calls) == 3
    manager = ServerManager(ScriptedEngine(action_ids(qwen_tok, "hermes_correct")), log_probs="none")
    with pytest.raises(EpisodeAborted, match="no logprobs"):  # logprobs verl asked for are never invented
        asyncio.run(make_agent_loop(qwen_tok, manager, abort_retries=0).run(
            {"temperature": 1.0, "logprobs": True}, **ROW))


def test_the_template_check_runs_once_per_process(qwen_tok, caplog, monkeypatch):
    import retool_adapters.verl as adapter

    calls = []
    monkeypatch.setattr(adapter, "training_env_kwargs", lambda tok, kw: calls.append(kw) or dict(kw))
    monkeypatch.setattr(adapter, "_training_kwargs", {})
    for _ in range(20):  # verl builds the loop for every sample
        make_agent_loop(qwen_tok, ServerManager(ScriptedEngine([])), tool_format="hermes")
    make_agent_loop(qwen_tok, ServerManager(ScriptedEngine([])), tool_format="retool")
    assert len(calls) == 2


def test_priority_and_full_determinism_reach_the_server(qwen_tok):
    config = verl_config(full_determinism=True)
    replica = Replica(ScriptedEngine(action_ids(qwen_tok, "hermes_correct")))
    asyncio.run(make_agent_loop(qwen_tok, llm_client(config, replica), config=config).run(
        {"temperature": 1.0, "logprobs": True}, priority=7, **ROW))
    # verl's own loops: request id det-{priority} under full determinism (passed through to vLLM), priority sent.
    assert {c["request_id"] for c in replica.calls} == {"det-7"}
    assert all(c["kwargs"].get("priority") == 7 for c in replica.calls)


def test_a_prompt_longer_than_verls_prompt_length_is_refused(qwen_tok):
    manager = ServerManager(ScriptedEngine(action_ids(qwen_tok, "hermes_correct")))
    loop = make_agent_loop(qwen_tok, manager, prompt_length=16)
    with pytest.raises(ValueError, match=r"rollout\.prompt_length"):
        asyncio.run(loop.run({"temperature": 1.0, "logprobs": True}, **ROW))


# ------------------------------------------------------------- verl's v1 (TransferQueue) trainer, its default
class TransferQueueStore:
    """TransferQueue's key-value store (`tq.async_kv_batch_put`, `tq.kv_batch_get`) held in memory: `tq.init()`
    starts its controller and storage units as Ray actors (it did not come up within 5 minutes on this 2-core
    machine). Rows are what verl's own `list_of_dict_to_tensordict` built in the worker."""

    def __init__(self):
        self.rows: dict[str, dict] = {}
        self.tags: dict[str, dict] = {}

    async def async_kv_batch_put(self, *, keys, fields, tags, partition_id):
        for i, key in enumerate(keys):
            row = fields[i]
            self.rows[key] = {name: row[name] for name in fields.keys()}  # noqa: SIM118 (a TensorDict iterates rows)
            self.tags[key] = tags[i]

    def kv_batch_get(self, *, keys, partition_id, select_fields):
        """The selected fields of `keys`: tensors as jagged nested tensors (TransferQueue's layout for
        per-sample lengths), everything else as a NonTensorStack."""
        import torch
        from tensordict import NonTensorStack, TensorDict

        out = {}
        for name in select_fields:
            values = [self.rows[k][name] for k in keys if name in self.rows[k]]
            if len(values) != len(keys):
                continue
            if all(isinstance(v, torch.Tensor) for v in values):
                out[name] = torch.nested.as_nested_tensor(values, layout=torch.jagged)
            else:
                out[name] = NonTensorStack(*values)
        return TensorDict(out, batch_size=[len(keys)])


def v1_worker(tok, config, monkeypatch, store):
    """verl's `AgentLoopWorkerTQ` without its Ray actor wrapper and `__init__` (which starts TransferQueue)."""
    agent_loop_tq = pytest.importorskip("verl.trainer.ppo.v1.agent_loop_tq",
                                        reason="verl's v1 trainer needs transferqueue (scripts/setup_frameworks.sh)")
    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", store.async_kv_batch_put)
    monkeypatch.setattr(agent_loop_tq.tq, "kv_batch_get", store.kv_batch_get)
    cls = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__
    worker = cls.__new__(cls)
    worker.config, worker.tokenizer, worker.processor = config, tok, None
    worker.reward_loop_worker_handles, worker.distillation_enabled = None, False
    return worker


def play_v1_group(tok, monkeypatch, scripts, *, per_turn=False, global_steps=(3,)):
    """One prompt's group through the adapter and `AgentLoopWorkerTQ._agent_loop_postprocess`, as `_run_prompt`
    calls it (session_id per rollout, the dataset row's kwargs, `uid` and `global_steps`)."""
    from .test_adapter_scripted import TURN_TEMPLATE, turn_action_ids

    config = verl_config(n=len(scripts))
    store = TransferQueueStore()
    worker = v1_worker(tok, config, monkeypatch, store)
    env_kwargs = {"tool_format": "hermes", "tool_timeout": 10.0}
    if per_turn:
        env_kwargs.update(chat_template=TURN_TEMPLATE, sample_mode="turn")
    outputs = []
    for session_id, script in enumerate(scripts):
        actions = turn_action_ids(tok, script) if per_turn else action_ids(tok, script)
        replica = Replica(ScriptedEngine(actions, append_only=not per_turn), global_steps=global_steps)
        loop = make_agent_loop(tok, llm_client(config, replica), config=config, **env_kwargs)
        kwargs = {**ROW, "uid": "p0", "global_steps": 4}
        output = asyncio.run(loop.run({"temperature": 1.0, "logprobs": True}, **kwargs))
        outputs.append(output)
        asyncio.run(worker._agent_loop_postprocess(output, False, session_id=session_id, **kwargs))
    return store, outputs, config


def v1_advantages(store):
    """verl v1's GRPO: `compute_advantage_for_multi_trajectories` on the stored rows, written back to the store."""
    import numpy as np
    from verl.protocol import DataProto
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    keys = list(store.rows)
    data = store.kv_batch_get(keys=keys, partition_id="train", select_fields=["responses", "response_mask",
                                                                               "rm_scores"]).to_padded_tensor()
    batch = DataProto.from_dict(tensors={"responses": data["responses"], "response_mask": data["response_mask"],
                                         "token_level_rewards": data["rm_scores"]},
                                non_tensors={"uid": np.array([k.rsplit("_", 2)[0] for k in keys], dtype=object)})
    batch = compute_advantage_for_multi_trajectories(batch, keys, AdvantageEstimator.GRPO)
    for i, key in enumerate(keys):
        n = int(store.rows[key]["response_mask"].shape[0])
        store.rows[key]["advantages"] = batch.batch["advantages"][i, :n]
        store.rows[key]["returns"] = batch.batch["returns"][i, :n]
    return {key: batch.batch["advantages"][i][batch.batch["response_mask"][i].bool()] for i, key in enumerate(keys)}


def v1_metrics(store, config, global_steps=4):
    """verl's `PPOTrainer._compute_metrics` over the stored rows (the trainer object without its `__init__`, which
    builds Ray worker groups)."""
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    trainer = PPOTrainerSync.__new__(PPOTrainerSync)
    trainer.config, trainer.use_critic = config, False
    trainer._rollout_moe_lb_metrics_accumulator = None
    trainer._get_n_gpus_for_throughput = lambda: 1
    keys = list(store.rows)
    metrics = {}
    trainer._compute_metrics(KVBatchMeta(keys=keys, tags=[store.tags[k] for k in keys], partition_id="train"),
                             metrics, {"step": 1.0, "gen": 0.5}, global_steps=global_steps, epoch=0)
    return metrics


def test_v1_postprocessing_and_metrics_on_the_adapters_output(qwen_tok, monkeypatch):
    store, outputs, config = play_v1_group(qwen_tok, monkeypatch, ["hermes_correct", "hermes_wrong"],
                                           global_steps=(2, 3, 3))
    assert sorted(store.rows) == ["p0_0_0", "p0_1_0"]
    for key, script, output in zip(["p0_0_0", "p0_1_0"], ["hermes_correct", "hermes_wrong"], outputs, strict=True):
        row, tag = store.rows[key], store.tags[key]
        ref = local_reference(qwen_tok, script, max_completion_tokens=2048)
        assert row["prompts"].tolist() == ref.prompt_ids and row["responses"].tolist() == ref.completion_ids
        assert row["loss_mask"].tolist() == ref.env_mask and row["rm_scores"][-1].item() == pytest.approx(ref.reward)
        assert row["rollout_log_probs"].tolist() == pytest.approx(ref.logprobs)
        # The staleness tags verl's LLMServerClient sets: first turn's weights, last turn's weights.
        assert tag["min_global_steps"] == 2 and tag["max_global_steps"] == 3 and tag["global_steps"] == 4
        assert output.metrics.num_preempted == 0
        assert row["extra_fields"]["reward_extra_info"]["acc"] == float(script == "hermes_correct")
    advantages = v1_advantages(store)
    assert advantages["p0_0_0"].unique().tolist() == pytest.approx([0.7071], abs=1e-3)
    assert advantages["p0_1_0"].unique().tolist() == pytest.approx([-0.7071], abs=1e-3)
    metrics = v1_metrics(store, config)
    assert metrics["training/off_policy/trajectory_spans/max"] == 2  # weights 2..3
    assert metrics["training/off_policy/trajectory_staleness/mean"] == 0  # (4 - 1) - 3
    assert metrics["critic/score/mean"] == pytest.approx((1.0 - 0.9) / 2)
    assert metrics["training/num_turns/max"] == outputs[1].num_turns


def test_v1_per_turn_samples_get_one_advantage_per_trajectory(qwen_tok, monkeypatch):
    """sample_mode='turn': a list of outputs per episode; verl's v1 GRPO takes each session's last output and
    broadcasts its advantage, so each trajectory counts once in the group, its samples all alike."""
    from .test_adapter_scripted import turn_reference

    store, outputs, config = play_v1_group(qwen_tok, monkeypatch, ["correct", "wrong"], per_turn=True)
    assert sorted(store.rows) == ["p0_0_0", "p0_0_1", "p0_1_0", "p0_1_1"]
    for session, script in enumerate(["correct", "wrong"]):
        refs = turn_reference(qwen_tok, script, max_completion_tokens=2048)
        assert isinstance(outputs[session], list) and len(outputs[session]) == len(refs) == 2
        for i, ref in enumerate(refs):
            row = store.rows[f"p0_{session}_{i}"]
            assert row["prompts"].tolist() == ref.prompt_ids and row["responses"].tolist() == ref.completion_ids
            assert row["loss_mask"].tolist() == ref.env_mask
            assert row["rm_scores"][-1].item() == pytest.approx(ref.reward)
    advantages = v1_advantages(store)
    # Two trajectories, +1 and -1: +-0.7071 each (GRPO over two), the same for both samples of a trajectory.
    assert {round(v, 3) for k in ("p0_0_0", "p0_0_1") for v in advantages[k].tolist()} == {0.707}
    assert {round(v, 3) for k in ("p0_1_0", "p0_1_1") for v in advantages[k].tolist()} == {-0.707}
    assert v1_metrics(store, config)["critic/score/mean"] == pytest.approx((1.0 - 0.9) / 2)


def test_per_turn_samples_are_refused_by_the_legacy_trainer(qwen_tok):
    config = verl_config()
    from hydra.errors import InstantiationException

    from .test_adapter_scripted import TURN_TEMPLATE

    config.trainer.use_v1 = False
    with pytest.raises(InstantiationException, match="use_v1"):  # hydra wraps the loop's ValueError
        make_agent_loop(qwen_tok, ServerManager(ScriptedEngine([])), config=config, chat_template=TURN_TEMPLATE,
                        sample_mode="turn")


def test_legacy_worker_postprocesses_the_adapters_output(qwen_tok):
    """The legacy `AgentLoopWorker` (trainer.use_v1=false): padding, rm_scores, reward_extra_keys, staleness tags."""
    config = verl_config()
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    worker = AgentLoopWorker.__new__(AgentLoopWorker)  # its __init__ connects to Ray's servers
    worker.config, worker.rollout_config, worker.tokenizer, worker.processor = (
        config, config.actor_rollout_ref.rollout, qwen_tok, None)
    worker.reward_loop_worker_handles, worker.distillation_enabled, worker.mm_processor_kwargs = None, False, None
    internal = []
    for script in ("hermes_correct", "hermes_wrong"):
        replica = Replica(ScriptedEngine(action_ids(qwen_tok, script)))
        output = asyncio.run(make_agent_loop(qwen_tok, llm_client(config, replica), config=config,
                                             tool_timeout=10.0).run({"temperature": 1.0, "logprobs": True}, **ROW))
        internal.append(asyncio.run(worker._agent_loop_postprocess(output, False, **ROW)))
    batch = worker._postprocess(internal)
    ref = local_reference(qwen_tok, "hermes_wrong", max_completion_tokens=2048)
    n = len(ref.completion_ids)
    assert batch.batch["responses"][1, :n].tolist() == ref.completion_ids
    assert batch.batch["response_mask"][1, :n].tolist() == ref.env_mask
    assert batch.batch["rm_scores"][1, n - 1].item() == pytest.approx(ref.reward)
    assert set(batch.meta_info["reward_extra_keys"]) >= {"acc", "score", "verl_strict_acc"}
    assert batch.non_tensor_batch["acc"].tolist() == [1.0, 0.0]
    assert batch.non_tensor_batch["min_global_steps"].tolist() == [3, 3]
