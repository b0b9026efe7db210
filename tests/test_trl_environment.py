"""TRL's `environment_factory` path: `CodeInterpreterEnvironment` against the token-level environment on scripted
episodes, and inside TRL's real GRPOTrainer on CPU (the tiny Qwen2 taught to call the interpreter, the real
sandbox, TRL's own tool loop). Nothing is mocked.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import pickle
from collections import defaultdict

import pytest
from transformers import AutoTokenizer

from retool_adapters.trl import CodeInterpreterEnvironment, grade_final_answers, problems_to_dataset
from retool_adapters.trl.testing import build_tool_calling_qwen
from retool_env import Problem, ToolEnvironment
from retool_env.data import load_problems
from retool_env.formats import CODE_INTERPRETER_TOOL

GOLD = "42"
# (tool calls, the final answer, environment settings): each call in its own turn, as a model writes them.
EPISODES = {
    "correct after one call": (["print(6 * 7)"], "So the answer is \\boxed{42}.", {}),
    "wrong after an error, a timeout and an echo": (
        ["1 / 0", "while True:\n    pass", "x = 3\nx * 2"], "\\boxed{6}", {"tool_timeout": 0.5}),
    "a boxed answer printed by the interpreter earns nothing": (["print('\\\\boxed{42}')"], "I am not sure.", {}),
    "a long output clipped in tokens": (["print('ab ' * 3000)"], "\\boxed{42}", {"max_observation_tokens": 64}),
    "a session keeps variables": (["x = 6 * 7", "print(x)"], "\\boxed{42}", {"stateful": True}),
    "fences stripped, empty code refused": (["```python\nprint(2)\n```", "   "], "\\boxed{2}", {}),
    "no tool call": ([], "\\boxed{42}", {}),
}
REWARDS = {"retool": {}, "paper": {}, "retool_slime": {"tool_call_cost": 0.05}}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


def tool_call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


def token_level_episode(tokenizer, codes, final, **config) -> tuple[list[str], float]:
    """The outputs the model is shown and the reward, played through `ToolEnvironment` token by token."""
    env = ToolEnvironment(tokenizer, [Problem("What is 6 * 7?", GOLD)], **config)
    end = env.format.end_token_ids[0]
    env.reset(options={"index": 0})
    outputs = []
    for code in codes:
        _, _, done, _, info = env.step(tokenizer.encode(tool_call(code), add_special_tokens=False) + [end])
        assert not done
        outputs += [result["output"] for result in info["tool_results"]]
    _, reward, terminated, _, _ = env.step(tokenizer.encode(final, add_special_tokens=False) + [end])
    assert terminated
    env.close()
    return outputs, reward


def trl_episode(tokenizer, codes, final, **config) -> tuple[list[str], float, CodeInterpreterEnvironment]:
    """The same episode as TRL's tool loop plays it: reset with the row, one tool call per turn, then the reward
    functions (grade_final_answers before the environment's own column)."""
    env = CodeInterpreterEnvironment(tokenizer, **config)
    env.reset(prompt=[{"role": "user", "content": "What is 6 * 7?"}], answer=GOLD, problem_id="p")
    completion, outputs = [], []
    for code in codes:
        call = {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}
        outputs.append(env.code_interpreter(code))
        completion += [{"role": "assistant", "content": "", "tool_calls": [call]},
                       {"role": "tool", "name": "code_interpreter", "content": outputs[-1]}]
    completion.append({"role": "assistant", "content": final})
    (correct,) = grade_final_answers([completion], environments=[env])
    assert correct == float(env.grade.correct)
    return outputs, env.get_reward(), env


@pytest.mark.parametrize("reward", sorted(REWARDS))
@pytest.mark.parametrize("name", list(EPISODES))
def test_scripted_episodes_earn_what_they_earn_in_the_token_level_environment(tiny_tok, name, reward):
    codes, final, config = EPISODES[name]
    config = {**config, "reward": reward, "reward_kwargs": REWARDS[reward]}
    expected_outputs, expected_reward = token_level_episode(tiny_tok, codes, final, **config)
    outputs, got, env = trl_episode(tiny_tok, codes, final, **config)
    assert outputs == expected_outputs  # the same sandbox, echo, session, clipping and error messages
    assert got == pytest.approx(expected_reward)
    assert env.num_turns == len(codes) + 1


def test_the_scripts_cover_every_outcome(tiny_tok):
    _, _, env = trl_episode(tiny_tok, *EPISODES["wrong after an error, a timeout and an echo"][:2], tool_timeout=0.5)
    assert [str(call.status) for call in env.tool_calls] == ["error", "timeout", "ok"]
    assert env._episode_stats().num_tool_calls == 3 and env.get_reward() == pytest.approx(-0.7)
    _, reward, env = trl_episode(tiny_tok, *EPISODES["fences stripped, empty code refused"][:2])
    assert [str(call.status) for call in env.tool_calls] == ["ok", "invalid"] and reward == pytest.approx(-0.9)
    # 64: room for the marker, which the budget counts (about 26 tokens with the tiny tokenizer)
    outputs, _, _ = trl_episode(tiny_tok, *EPISODES["a long output clipped in tokens"][:2], max_observation_tokens=64)
    assert "tokens omitted" in outputs[0]


def test_trl_prompts_match_the_token_level_environment(any_tok):
    """TRL renders the prompt with `code_interpreter` as the tool: the schema and tokens ToolEnvironment uses."""
    from transformers.utils import get_json_schema

    assert get_json_schema(CodeInterpreterEnvironment.code_interpreter) == CODE_INTERPRETER_TOOL
    problem = Problem("What is 6 * 7?", GOLD)
    (row,) = problems_to_dataset([problem], prompt="slime")
    env = CodeInterpreterEnvironment(any_tok)
    trl_ids = any_tok.apply_chat_template(row["prompt"], tools=[env.code_interpreter], add_generation_prompt=True,
                                          tokenize=True, return_dict=False)
    assert list(trl_ids) == ToolEnvironment(any_tok, [problem]).reset(options={"index": 0})[0].tolist()


def test_calls_past_the_budget_are_refused_not_run(tiny_tok):
    """Where ToolEnvironment ends the episode, TRL keeps generating: the model is told to answer, and the refused
    call neither runs nor counts."""
    outputs, reward, env = trl_episode(tiny_tok, ["print(6 * 7)", "print(1)"], "\\boxed{41}", max_tool_calls=1)
    assert outputs[0] == "42\n" and "budget of 1 tool calls is spent" in outputs[1]
    assert env._episode_stats().num_tool_calls == 1 and env._episode_stats().truncated
    assert reward == pytest.approx(-0.9)  # wrong with one executed call


def test_a_factory_pickles_and_misuse_says_what_to_do(tiny_tok):
    factory = pickle.loads(pickle.dumps(functools.partial(CodeInterpreterEnvironment, tiny_tok, stateful=True)))
    env = factory()
    env.reset(answer="1")
    assert env.code_interpreter("y = 5") == "(no output)" and env.code_interpreter("y") == "5\n"
    with pytest.raises(RuntimeError, match="grade_final_answers"):
        env.get_reward()
    with pytest.raises(KeyError, match="answer"):
        env.reset(prompt="no answer column")
    with pytest.raises(ValueError, match="ReToolRollout"):
        CodeInterpreterEnvironment(tiny_tok, tool_format="retool")
    with pytest.raises(ValueError, match="environment_factory"):
        grade_final_answers(["\\boxed{1}"])
    assert grade_final_answers(["\\boxed{1}"], environments=[object()]) == [None]  # another environment's rollout


@pytest.mark.parametrize(("template", "accepted"), [("qwen3_6", True), ("llama3_1", True), ("lfm2_v2", False)])
def test_the_dialects_trls_parser_reads_are_accepted_and_the_others_refused(tiny_tok, template, accepted):
    from retool_env.chat import resolve_chat_template

    tok = copy.deepcopy(tiny_tok)
    try:
        tok.chat_template = resolve_chat_template(template)
    except ValueError:
        pytest.skip("TRL's chat templates are not installed")
    if accepted:
        assert CodeInterpreterEnvironment(tok).tools is not None
    else:  # TRL cuts LFM2's quoted code short: training on it would run code the model never wrote
        with pytest.raises(ValueError, match=r"'lfm2'.*ReToolRollout"):
            CodeInterpreterEnvironment(tok)


# ---------------------------------------------------------------------------------------- the real GRPOTrainer
@pytest.fixture(scope="module")
def problems() -> list[Problem]:
    return load_problems("arith", split="train", limit=2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, problems):
    return build_tool_calling_qwen(tmp_path_factory.mktemp("tool_qwen"), problems)


class Recording(CodeInterpreterEnvironment):
    """The real environment, keeping every finished episode's tool calls and reward for the test to compare."""

    episodes: list = []  # noqa: RUF012 (shared by the instances TRL makes)

    def get_reward(self) -> float:
        reward = super().get_reward()
        Recording.episodes.append((type(self).__name__, self.config.stateful, list(self.tool_calls), self.grade,
                                   reward))
        return reward


def grpo_trainer(model_dir, dataset, environment_factory, tmp_path, **config):
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(**{
        "output_dir": str(tmp_path), "use_cpu": True, "bf16": False, "seed": 0, "max_steps": 2,
        "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 128, "temperature": 0.7,
        "learning_rate": 1e-4, "logging_steps": 1, "save_strategy": "no", "report_to": "none", "disable_tqdm": True,
        "reward_weights": [0.0], **config})
    return GRPOTrainer(model=str(model_dir), reward_funcs=[grade_final_answers], args=args, train_dataset=dataset,
                       processing_class=AutoTokenizer.from_pretrained(model_dir),
                       environment_factory=environment_factory)


def test_grpo_trainer_trains_with_the_environment_factory(model_dir, problems, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    Recording.episodes = []
    trainer = grpo_trainer(model_dir, problems_to_dataset(problems, prompt="slime"),
                           functools.partial(Recording, tokenizer, max_tool_calls=2), tmp_path)
    trainer.train()

    episodes = Recording.episodes
    assert len(episodes) == 16  # two steps of 8 rollouts, each scored by its environment
    # The taught model calls the interpreter through TRL's loop; the sandbox runs print(6 * 7).
    assert sum(len(calls) > 0 for _, _, calls, _, _ in episodes) >= 8
    assert all(call.output == "42\n" for _, _, calls, _, _ in episodes for call in calls if call.code == "print(6 * 7)")
    for _, _, calls, grade, reward in episodes:  # ToolEnvironment's ReTool reward for the same grade and calls
        executed = sum(str(call.status) not in ("invalid", "skipped") for call in calls)
        assert reward == pytest.approx(1.0 if grade.correct else min(-0.6, -1 + 0.1 * executed))
    logged = [entry for entry in trainer.state.log_history if "rewards/Recording/mean" in entry]
    assert len(logged) == 2
    for entry in logged:
        assert entry["tools/call_frequency"] > 0 and math.isfinite(entry["loss"])
        assert entry["rewards/grade_final_answers/mean"] == 0.0  # the arithmetic answers are not 42
        assert entry["rewards/Recording/mean"] < -0.5
    for step, entry in enumerate(logged):
        rewards = [reward for *_, reward in episodes[8 * step : 8 * step + 8]]
        assert entry["reward"] == pytest.approx(sum(rewards) / 8, abs=1e-5)  # weight 0 on the grade, 1 on the env


def test_a_dict_of_environments_routes_each_example(model_dir, problems, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    Recording.episodes = []
    rows = problems_to_dataset(problems, prompt="slime")
    rows = rows.add_column("environment", ["stateless", "stateful"])
    factories = {"stateless": functools.partial(Recording, tokenizer),
                 "stateful": functools.partial(Recording, tokenizer, stateful=True)}
    grpo_trainer(model_dir, rows, factories, tmp_path, max_steps=1).train()

    by_config = defaultdict(int)
    for _, stateful, *_ in Recording.episodes:
        by_config[stateful] += 1
    assert by_config == {False: 4, True: 4}  # each problem's four rollouts in the environment its row names


def test_the_tool_rounds_of_trls_messages_shape_the_reward(tiny_tok):
    """Four calls in one assistant message are one round (-0.9 when wrong), in TRL's loop as in the environment."""
    env = CodeInterpreterEnvironment(tiny_tok, reward="retool")
    env.reset(prompt=[{"role": "user", "content": "What is 6 * 7?"}], answer=GOLD)
    calls = []
    for code in ("1", "2", "3", "4"):
        env.code_interpreter(code)
        calls.append({"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}})
    completion = [{"role": "assistant", "content": "", "tool_calls": calls},
                  *({"role": "tool", "name": "code_interpreter", "content": "1"} for _ in calls),
                  {"role": "assistant", "content": "\\boxed{41}"}]
    grade_final_answers([completion], environments=[env])
    assert env.num_tool_rounds == 1 and env.get_reward() == pytest.approx(-0.9)
    # Messages that do not account for the calls: the rounds are unknown, one call per round is assumed.
    assert env._count_tool_rounds([1, 1]) is None and env._count_tool_rounds([2, 2, 0, 1]) == 2
