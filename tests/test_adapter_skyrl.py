"""SkyRL-gym adapter against the real `skyrl-gym` package (registry, `make`, `BaseTextEnv`).

SkyRL's generator (the `skyrl` trainer package, which needs Ray and an inference engine) is replayed here as its
source does it (NovaSky-AI/SkyRL, skyrl/train/generators/skyrl_gym_generator.py at a9564572eb8e): the prompt is
`apply_chat_template(env.init(prompt), add_generation_prompt=True, **chat_template_kwargs)`, the turn's text goes to
`env.step`, and observation messages become tokens by the "fixed base" rule (`use_conversation_multi_turn=true`:
`apply_chat_template(base + obs)[len(base ids cut after the last EOS):]`) or by encoding each message's content
(`use_conversation_multi_turn=false`). The tokens and mask SkyRL would train on must equal the local environment's.
"""

from __future__ import annotations

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym", reason="skyrl-gym is not installed here; run scripts/test_frameworks.sh")

from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

from retool_adapters.skyrl import CHAT_TEMPLATE_KWARGS, ENV_ID, ReToolTextEnv  # noqa: E402

from .test_adapter_scripted import PROBLEM, SCRIPTS, Record, action_ids, local_reference  # noqa: E402

BASE = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "I am a user."}]


def skyrl_episode(tok, script: str, env_config: dict, max_turns: int = 8) -> tuple[Record, BaseTextEnv]:
    """SkyRL's agent loop with one scripted engine, token bookkeeping as skyrl_gym_generator.py does it."""
    multi_turn = script.startswith("hermes")
    kwargs = CHAT_TEMPLATE_KWARGS if multi_turn else {}
    env = skyrl_gym.make(ENV_ID, env_config=env_config,
                         extras={"reward_spec": {"method": "rule", "ground_truth": PROBLEM.answer},
                                 "max_turns": max_turns})
    chat_history, _ = env.init([{"role": "user", "content": PROBLEM.question}])
    prompt_ids = tok.apply_chat_template(chat_history, add_generation_prompt=True, tokenize=True, return_dict=False,
                                         **kwargs)
    base_ids = tok.apply_chat_template(BASE, add_generation_prompt=False, tokenize=True, return_dict=False, **kwargs)
    if tok.eos_token_id in base_ids:
        base_ids = base_ids[: len(base_ids) - base_ids[::-1].index(tok.eos_token_id)]
    response_ids, loss_mask, reward = [], [], 0.0
    for output_ids in action_ids(tok, script):
        output = tok.decode(output_ids, skip_special_tokens=True)  # engines return text without <|im_end|>
        step = env.step(output)
        if multi_turn and step["observations"]:
            obs_ids = tok.apply_chat_template([*BASE, *step["observations"]], add_generation_prompt=not step["done"],
                                              tokenize=True, return_dict=False, **kwargs)[len(base_ids):]
        else:
            obs_ids = [t for obs in step["observations"] for t in tok.encode(obs["content"], add_special_tokens=False)]
        response_ids += output_ids + obs_ids
        loss_mask += [1] * len(output_ids) + [0] * len(obs_ids)
        reward = step["reward"]
        if step["done"]:
            break
    return Record(list(prompt_ids), response_ids, loss_mask, None, reward), env


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_skyrl_tokens_mask_reward_equal_the_local_env(qwen_tok, script):
    got, env = skyrl_episode(qwen_tok, script, {"tokenizer": qwen_tok, "tool_format": script.split("_")[0],
                                                "tool_timeout": 10.0})
    ref = local_reference(qwen_tok, script)
    assert got == Record(ref.prompt_ids, ref.completion_ids, ref.env_mask, None, ref.reward)
    observed = qwen_tok.decode([t for t, m in zip(got.completion_ids, got.env_mask, strict=True) if m == 0])
    assert ("56088" if script.endswith("correct") else "4") in observed  # the interpreter really ran
    assert isinstance(env, ReToolTextEnv) and isinstance(env, BaseTextEnv)
    metrics = env.get_metrics()
    assert metrics["correct"] == float(ref.reward == 1.0) and metrics["num_tool_calls"] == 1
    assert ReToolTextEnv.aggregate_metrics([metrics, metrics])["num_tool_calls"] == 1
    env.close()


def test_registered_and_made_by_id():
    assert ENV_ID in skyrl_gym.registry
    assert skyrl_gym.registry[ENV_ID].entry_point == "retool_adapters.skyrl:ReToolTextEnv"


def test_max_turns_caps_tool_calls(qwen_tok):
    """SkyRL's generator.max_turns reaches the env as extras; one turn leaves no room for a tool call."""
    got, env = skyrl_episode(qwen_tok, "hermes_correct", {"tokenizer": qwen_tok}, max_turns=1)
    assert env.env.trajectory.finish_reason == "max_tool_calls" and env.env.trajectory.truncated
    assert got.reward == -1.0 and got.env_mask == [1] * len(got.completion_ids)


def test_tokenizer_is_required():
    with pytest.raises(ValueError, match="tokenizer"):
        skyrl_gym.make(ENV_ID, env_config={}, extras={"reward_spec": {"ground_truth": "1"}})


def test_a_dialect_formats_results_are_tool_turns(qwen_tok):
    """Any format whose results are chat turns (`tool_turns`) hands SkyRL tool messages, not only hermes: the
    adapter asks the format, never its name."""
    from retool_env.formats import format_class

    env = skyrl_gym.make(ENV_ID, env_config={"tokenizer": qwen_tok, "tool_format": "qwen3_coder"},
                         extras={"reward_spec": {"method": "rule", "ground_truth": "42"}})
    env.init([{"role": "user", "content": "What is 6 * 7?"}])
    assert env.env.format.tool_turns and env.env.format.name != "hermes"
    step = env.step(format_class("qwen3_coder").call_text("print(6 * 7)"))
    assert [(m["role"], m["content"]) for m in step["observations"]] == [("tool", "42\n")]
    env.close()
