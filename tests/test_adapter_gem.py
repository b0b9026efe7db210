"""GEM adapter against the real `gem-llm` package: `gem.make`, and `gem.make_vec`'s sync and async vector envs with
their autoreset, played at GEM's text level and checked token for token against the local environment.
"""

from __future__ import annotations

import pytest

gem = pytest.importorskip("gem", reason="gem-llm is not installed here; run scripts/test_frameworks.sh")

from gem.utils.constants import TERMINAL_STATE  # noqa: E402

from retool_adapters.gem import ENV_ID, ReToolGemEnv  # noqa: E402

from .test_adapter_scripted import PROBLEM, SCRIPTS, Record, action_ids, local_reference, tool_format  # noqa: E402


def texts(tok, script: str) -> list[str]:
    """The turns as a text-level sampler returns them (special tokens kept, e.g. vLLM's skip_special_tokens=False)."""
    return [tok.decode(ids, skip_special_tokens=False) for ids in action_ids(tok, script)]


def tokens_of(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_gem_make_episode_equals_the_local_env(qwen_tok, script):
    env = gem.make(ENV_ID, tokenizer=qwen_tok, dataset=[PROBLEM], tool_format=tool_format(script), tool_timeout=10.0)
    assert isinstance(env, ReToolGemEnv) and isinstance(env, gem.Env)
    obs, info = env.reset()
    prompt_ids = tokens_of(qwen_tok, obs)
    assert prompt_ids == info["token_ids"]
    completion, mask, observations = [], [], []
    for action in texts(qwen_tok, script):
        obs, reward, terminated, truncated, info = env.step(action)
        completion += info["action_ids"]
        mask += [1] * len(info["action_ids"])
        if terminated or truncated:
            break
        obs_ids = tokens_of(qwen_tok, obs)  # GEM's loop tokenizes the observation text alone
        assert obs_ids == info["token_ids"]
        completion += obs_ids
        mask += [0] * len(obs_ids)
        observations.append(obs)
    assert obs == TERMINAL_STATE and terminated and not truncated
    ref = local_reference(qwen_tok, script)
    assert Record(prompt_ids, completion, mask, None, reward) == Record(ref.prompt_ids, ref.completion_ids,
                                                                        ref.env_mask, None, ref.reward)
    assert reward == (1.0 if script.endswith("correct") else -0.9)
    assert ("56088" if script.endswith("correct") else "4") in observations[-1]  # tool output in the next input
    assert info["correct"] == script.endswith("correct") and info["num_tool_calls"] == 1
    env.close()


@pytest.mark.parametrize("as_mapping", [False, True])
def test_a_loop_in_token_ids_steps_with_the_engines_ids_and_equals_the_local_env(qwen_tok, as_mapping):
    """An id-level loop under vLLM v1: the context is prompt ids + engine ids + `info["token_ids"]`, token for token
    the environment's trajectory (the text alone, without its `<|im_end|>`, would have the turn closed twice)."""
    env = ReToolGemEnv(qwen_tok, [PROBLEM], tool_format="hermes", tool_timeout=10.0)
    _, info = env.reset()
    context, mask = list(info["token_ids"]), []
    for ids in action_ids(qwen_tok, "hermes_correct"):
        obs, reward, terminated, truncated, info = env.step({"token_ids": ids, "finish_reason": "stop"} if as_mapping
                                                            else ids)
        assert info["action_ids"] == ids
        context += ids + info["token_ids"]
        mask += [1] * len(ids) + [0] * len(info["token_ids"])
        if terminated or truncated:
            break
    traj = env.env.trajectory
    assert context == traj.prompt_ids + traj.completion_ids and mask == traj.env_mask
    ref = local_reference(qwen_tok, "hermes_correct")
    assert context == ref.prompt_ids + ref.completion_ids and reward == ref.reward == 1.0
    env.close()


@pytest.mark.parametrize("async_mode", [False, True])
def test_make_vec_plays_a_right_and_a_wrong_episode_with_autoreset(qwen_tok, async_mode):
    envs = gem.make_vec([ENV_ID] * 2, async_mode=async_mode, seed=3, tokenizer=qwen_tok, dataset=[PROBLEM],
                        tool_format="hermes", tool_timeout=10.0)
    scripts = {0: texts(qwen_tok, "hermes_correct"), 1: texts(qwen_tok, "hermes_wrong")}
    obs, _ = envs.reset()
    first_prompts = list(obs)
    assert [e.seed for e in envs.envs] == [3, 4]
    rewards, turn = {}, 0
    while len(rewards) < 2:
        actions = {i: s[turn] for i, s in scripts.items() if i not in rewards}
        obs, reward, terminated, truncated, _ = envs.step(actions)
        for k, i in enumerate(actions):
            if terminated[k] or truncated[k]:
                rewards[i] = float(reward[k])
                assert obs[k] == first_prompts[i]  # GEM's same-step autoreset: the next episode's prompt
            else:
                assert reward[k] == 0.0 and "<tool_response>" in obs[k]
        turn += 1
    assert rewards == {0: 1.0, 1: -0.9}
    for env in envs.envs:
        env.close()


def test_reset_by_index_and_seeded_draws(qwen_tok):
    problems = [PROBLEM, {"question": "What is 2 + 2?", "answer": "4"}, {"question": "What is 3 + 5?", "answer": "8"}]
    env = ReToolGemEnv(qwen_tok, problems, seed=7, tool_format="hermes")
    assert "2 + 2" in env.reset(idx=1)[0]
    again = ReToolGemEnv(qwen_tok, problems, seed=11, tool_format="hermes")  # make_vec's seed: the first draw's
    draws = [env.reset(seed=11)[1]["problem_id"]] + [env.reset()[1]["problem_id"] for _ in range(5)]
    assert draws == [again.reset()[1]["problem_id"] for _ in range(6)] and len(set(draws)) > 1
    env.close()
    again.close()


def test_spawn_copies_the_configuration_not_the_episode(qwen_tok):
    env = gem.make(ENV_ID, tokenizer=qwen_tok, dataset=[PROBLEM], tool_format="retool", seed=5)
    child = env.spawn(max_tool_calls=0)
    assert isinstance(child, ReToolGemEnv) and child.seed == 5 and child.env.format.name == "retool"
    assert child.env.config.max_tool_calls == 0 and env.env.config.max_tool_calls != 0
    with pytest.raises(NotImplementedError, match="interpreter session"):
        env.spawn(same_state=True)
    env.close()
    child.close()
