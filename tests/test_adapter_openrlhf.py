"""OpenRLHF adapter against the real `openrlhf` package (installed with --no-deps: `openrlhf.utils.agent` imports
only torch, transformers, sympy, pylatexenc and aiohttp; its trainer needs deepspeed, vLLM and GPUs).

The episode runs through OpenRLHF's own `MultiTurnAgentExecutor.execute`, which tokenizes the prompt and each
feedback text alone. Only the vLLM engine is a stand-in (`ScriptedVLLMEngine`: vLLM v1's `RequestOutput` shape:
`token_ids` end with the stop token `<|im_end|>`, `text` is decoded without it, other special tokens kept as
OpenRLHF's `skip_special_tokens=False` asks); the action mask is built as OpenRLHF's
`SamplesGenerator._process_response_into_experience` builds it (0.11.2).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

pytest.importorskip("openrlhf.utils.agent", reason="openrlhf is not installed here; run scripts/test_frameworks.sh")

from openrlhf.utils.agent import AgentExecutorBase, AgentInstanceBase

from retool_adapters.openrlhf import ReToolAgentInstance, agent_executor

from .test_adapter_scripted import LOGPROB, PROBLEM, Record, action_ids, local_reference, tool_call


class ScriptedVLLMEngine:
    """OpenRLHF's `llm_engine.generate(prompt_token_ids, sampling_params)`, playing a script, recording prompts. As
    vLLM v1: a turn that ends on a stop token keeps it in `token_ids` and leaves its text out of `text`
    (`stop_in_text=True`: an engine that keeps it in both)."""

    def __init__(self, tok, actions: list[list[int]], stop_in_text: bool = False) -> None:
        self.tok, self.actions, self.prompts, self.stop_in_text = tok, actions, [], stop_in_text
        self.stop_ids = {tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id}

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        ids = self.actions[len(self.prompts)]
        self.prompts.append(list(prompt_token_ids))
        logprobs = [{t: SimpleNamespace(logprob=LOGPROB)} for t in ids]
        stopped = bool(ids) and ids[-1] in self.stop_ids
        shown = ids[:-1] if stopped and not self.stop_in_text else ids
        output = SimpleNamespace(token_ids=ids, text=self.tok.decode(shown, skip_special_tokens=False),
                                 finish_reason="stop", logprobs=logprobs)
        return SimpleNamespace(outputs=[output])


def openrlhf_episode(tok, actions: list[list[int]], max_length: int = 4096, stop_in_text: bool = False,
                     **env_kwargs):
    executor = agent_executor(tool_timeout=10.0, **env_kwargs)()
    engine = ScriptedVLLMEngine(tok, actions, stop_in_text)
    response = asyncio.run(executor.execute(PROBLEM.question, PROBLEM.answer,
                                            SimpleNamespace(max_tokens=None, logprobs=1), max_length, tok, engine))
    return response, engine


def action_mask(response) -> list[int]:
    mask = [0] * len(response["observation_tokens"])
    for start, end in response["action_ranges"]:
        mask[start:end] = [1] * (end - start)
    return mask


@pytest.mark.parametrize("stop_in_text", [False, True], ids=["vllm_v1", "stop_in_text"])
@pytest.mark.parametrize("script", ["hermes_correct", "hermes_wrong"])
def test_openrlhf_tokens_mask_reward_equal_the_local_env(qwen_tok, script, stop_in_text):
    response, engine = openrlhf_episode(qwen_tok, action_ids(qwen_tok, script), stop_in_text=stop_in_text)
    ref = local_reference(qwen_tok, script)
    n = len(ref.prompt_ids)
    assert response["observation_tokens"] == ref.prompt_ids + ref.completion_ids  # re-tokenized == env's ids
    assert action_mask(response) == [0] * n + ref.env_mask  # the mask only on the model's tokens
    assert response["reward"] == ref.reward == (1.0 if script.endswith("correct") else -0.9)
    assert response["scores"] == ref.reward
    assert response["rollout_log_probs"] == [0.0] * n + [LOGPROB if m else 0.0 for m in ref.env_mask]
    # the tool output is in the next input the engine got
    output = "56088" if script.endswith("correct") else "4"
    assert output in qwen_tok.decode(engine.prompts[-1][len(engine.prompts[-2]):])
    assert response["extra_logs"]["feedback_retokenized_mismatch"] == 0.0
    assert response["extra_logs"]["correct"] == float(script.endswith("correct"))
    assert response["extra_logs"]["num_tool_calls"] == 1.0


def test_clipped_tool_outputs_retokenize_to_the_environment_ids(qwen_tok):
    """The environment clips the output's text, then the chat template encodes it: OpenRLHF's re-encoding agrees."""
    for code in ["print('x' * 5000 + ' end')", "print('\\u00e9\\u65e5\\u672c' * 800)", "print(' a' * 999)"]:
        actions = [qwen_tok.encode(tool_call(code) + "<|im_end|>", add_special_tokens=False),
                   qwen_tok.encode("\\boxed{56088}<|im_end|>", add_special_tokens=False)]
        response, engine = openrlhf_episode(qwen_tok, actions, max_observation_tokens=16)
        seen = engine.prompts[1][len(engine.prompts[0]) + len(actions[0]):]
        assert "tokens omitted" in qwen_tok.decode(seen)
        assert seen == _env_observation_ids(qwen_tok, actions[0], max_observation_tokens=16)
        assert response["extra_logs"]["feedback_retokenized_mismatch"] == 0.0 and response["reward"] == 1.0


def test_non_canonical_action_ids_are_trained_as_generated(qwen_tok):
    """The environment records the engine's ids, as OpenRLHF trains on them, not the text's canonical encoding."""
    canonical = action_ids(qwen_tok, "hermes_correct")
    split = [t for text in ["S", "o", " the", " ans", "wer", " is", " \\", "boxed", "{", "5", "6", "0", "8", "8", "}."]
             for t in qwen_tok.encode(text, add_special_tokens=False)] + [qwen_tok.convert_tokens_to_ids("<|im_end|>")]
    assert split != canonical[1] and qwen_tok.decode(split) == qwen_tok.decode(canonical[1])
    made = []

    class Recorded(ReToolAgentInstance):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    executor = agent_executor(tool_timeout=10.0)()
    executor.agent_instance_cls = Recorded
    response = asyncio.run(executor.execute(PROBLEM.question, PROBLEM.answer, SimpleNamespace(max_tokens=None,
                                            logprobs=1), 4096, qwen_tok, ScriptedVLLMEngine(qwen_tok, [canonical[0],
                                                                                                      split])))
    traj = made[0].env.trajectory
    assert response["observation_tokens"][-len(split):] == split and response["reward"] == 1.0
    assert response["observation_tokens"] == traj.prompt_ids + traj.completion_ids
    assert response["rollout_log_probs"] == [0.0] * len(traj.prompt_ids) + traj.logprobs


def _env_observation_ids(tok, action, **env_kwargs) -> list[int]:
    from retool_env import ToolEnvironment

    env = ToolEnvironment(tok, [PROBLEM], tool_format="hermes", tool_timeout=10.0, **env_kwargs)
    env.reset(options={"problem": PROBLEM})
    obs_ids = env.step(action)[0].tolist()
    env.close()
    return obs_ids


def test_agent_file_contract(tmp_path):
    """What OpenRLHF's `_load_agent_executor` checks of the file named by --train.agent_func_path."""
    import importlib.util

    path = tmp_path / "retool_agent.py"
    path.write_text("from retool_adapters.openrlhf import agent_executor\n"
                    "AgentExecutor = agent_executor(tool_format='hermes', max_tool_calls=8)\n")
    spec = importlib.util.spec_from_file_location("agent_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert issubclass(module.AgentExecutor, AgentExecutorBase)
    executor = module.AgentExecutor()
    assert executor.agent_instance_cls is ReToolAgentInstance and issubclass(ReToolAgentInstance, AgentInstanceBase)
    assert executor.env_kwargs == {"tool_format": "hermes", "max_tool_calls": 8}


def test_an_episode_cut_by_max_length_closes_its_sandbox_session(qwen_tok):
    """OpenRLHF breaks out of its loop when the context reaches max_length; the executor still closes the env."""
    made = []

    class Recorded(ReToolAgentInstance):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    actions = action_ids(qwen_tok, "hermes_correct")
    ref = local_reference(qwen_tok, "hermes_correct")
    first = len(ref.prompt_ids) + ref.env_mask.index(0) + ref.env_mask[ref.env_mask.index(0):].index(1)
    executor = agent_executor(tool_timeout=10.0, stateful=True)()  # an interpreter session per episode
    executor.agent_instance_cls = Recorded
    response = asyncio.run(executor.execute(PROBLEM.question, PROBLEM.answer, SimpleNamespace(max_tokens=None,
                                            logprobs=1), first, qwen_tok, ScriptedVLLMEngine(qwen_tok, actions)))
    assert len(response["action_ranges"]) == 1 and response["reward"] == 0  # OpenRLHF's own total: no env reward
    assert made[0].env.trajectory.num_tool_calls == 1 and made[0].env._session is None


def test_instance_outside_the_executor_raises():
    with pytest.raises(RuntimeError, match="ReToolAgentExecutor"):
        ReToolAgentInstance()


def test_max_tool_calls_zero_ends_on_the_first_call(qwen_tok):
    response, _ = openrlhf_episode(qwen_tok, action_ids(qwen_tok, "hermes_correct"), max_tool_calls=0)
    assert len(response["action_ranges"]) == 1 and response["extra_logs"]["env_truncated"] == 1.0
    assert response["reward"] == -1.0
    got = Record(response["observation_tokens"], [], [], None, response["reward"])
    assert got.prompt_ids[-len(action_ids(qwen_tok, "hermes_correct")[0]):] == action_ids(qwen_tok,
                                                                                       "hermes_correct")[0]
