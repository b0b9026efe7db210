"""verl adapter: the server-manager generator everywhere, and the registered agent loop where verl installs.

The server manager is a stand-in with the signature of verl's `LLMServerClient.generate(request_id, *, prompt_ids,
sampling_params, ...) -> TokenOutput` (verl 0.9.1, verl/workers/rollout/llm_server.py), scripted to play the shared
episodes; it returns verl's real `TokenOutput` when verl is installed (scripts/setup_frameworks.sh), else a
dataclass with TokenOutput's fields (`token_ids`, `log_probs`, `stop_reason`: 'completed' | 'aborted' | None, from
verl/workers/rollout/replica.py). With verl installed, `ReToolAgentLoop` is built the way verl's AgentLoopWorker
builds it (`hydra.utils.instantiate` of the registry entry) and returns verl's real `AgentLoopOutput`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from retool_adapters.generators import LogprobsMismatchError
from retool_adapters.verl import VerlServerGenerator, agent_loop_fields, problem_from_row
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


def test_problem_from_row():
    assert problem_from_row(ROW) == PROBLEM.__class__(PROBLEM.question, PROBLEM.answer, id="0")


# ------------------------------------------------------------------------------------ with verl's real classes
def make_agent_loop(tok, manager, prompt_length=1024, **env_kwargs):
    pytest.importorskip("verl.experimental.agent_loop.agent_loop",
                        reason="verl is not installed here; run scripts/test_frameworks.sh (.venv-frameworks)")
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry

    import retool_adapters.verl as adapter

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm", "prompt_length": prompt_length,
                                                                 "response_length": 2048}}, "data": {}})
    entry = OmegaConf.create({**_agent_loop_registry[adapter.AGENT_NAME], "env_kwargs": env_kwargs})
    return hydra.utils.instantiate(entry, trainer_config=DictConfigWrap(config), server_manager=manager,
                                   tokenizer=tok, processor=None, dataset_cls=None,
                                   data_config=DictConfigWrap(config.data))


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_registered_agent_loop_returns_verls_output(qwen_tok, script):
    manager = ServerManager(ScriptedEngine(action_ids(qwen_tok, script)))
    loop = make_agent_loop(qwen_tok, manager, tool_format=script.split("_")[0], tool_timeout=10.0)
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    output = asyncio.run(loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, **ROW))
    assert isinstance(output, AgentLoopOutput)
    assert record(output.model_dump()) == local_reference(qwen_tok, script, max_completion_tokens=2048)
    assert output.metrics.tool_calls >= 0 and output.extra_fields["aborted"] is False
    fields = output.as_dict()  # verl's own conversion to tensors, reward on the last response token
    assert fields["rm_scores"][-1] == output.reward_score and fields["rollout_log_probs"].shape[0] == len(
        output.response_ids)


def test_registered_agent_loop_aborts_in_verls_shape(qwen_tok):
    manager = ServerManager(ScriptedEngine(action_ids(qwen_tok, "hermes_correct")), log_probs="none")
    loop = make_agent_loop(qwen_tok, manager)
    output = asyncio.run(loop.run({"temperature": 1.0, "logprobs": True}, **ROW))
    assert output.response_ids == [] and output.response_mask == [] and output.response_logprobs == []
    assert output.extra_fields["aborted"] is True and output.prompt_ids
    assert output.reward_score == 0.0 and output.num_turns == 0


def test_a_prompt_longer_than_verls_prompt_length_is_refused(qwen_tok):
    manager = ServerManager(ScriptedEngine(action_ids(qwen_tok, "hermes_correct")))
    loop = make_agent_loop(qwen_tok, manager, prompt_length=16)
    with pytest.raises(ValueError, match=r"rollout\.prompt_length"):
        asyncio.run(loop.run({"temperature": 1.0, "logprobs": True}, **ROW))
