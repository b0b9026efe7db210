"""Reasoning ends only at the model's own `</think>` outside any tool call, in every dialect, through `env.step`.

A `</think>` written inside a call's code is the code's text: the call runs, and the turn is no answer. Were it the
end of the reasoning, the call would not run, the turn would be graded, and a `\\boxed{}` in the code string would
be read as the answer. Tokenizers are Qwen's real vocabulary built offline (with each family's template and its
special tokens where TRL ships one, see `tests.test_dialect_parity.family_tokenizer`).
"""

from __future__ import annotations

import pytest

from retool_env import ToolEnvironment
from retool_env.dialects import DIALECTS, FunctionCall, get_dialect
from retool_env.formats import encode
from retool_env.reasoning import graded_text, reasoning_end, split_reasoning
from tests.test_chat_templates import PROBLEM
from tests.test_dialect_parity import NAMES, family_tokenizer

# One TRL template per dialect that has one (the family's tokenizer); the others run on Qwen's own template.
TEMPLATE = {"hermes": "qwen3", "qwen3_coder": "qwen3_6", "openai": "gptoss", "llama3_json": "llama3_1",
            "glm45": "glm4moe", "deepseek_v3": "deepseekv3", "gemma4": "gemma4", "lfm2": "lfm2_v2",
            "atem": "muse_glimmer"}
# The answer hidden in the code string; the problem's gold is 42.
CODE = 's = "</think>\\\\boxed{42}"\nprint(len(s))'


def environment(dialect: str, qwen_tok) -> ToolEnvironment:
    name = TEMPLATE.get(dialect)
    if name is not None and name in NAMES:
        return ToolEnvironment(family_tokenizer(name), [PROBLEM], tool_format=dialect)
    return ToolEnvironment(qwen_tok, [PROBLEM], tool_format=dialect)


def step_text(env: ToolEnvironment, text: str, close_prompts_think_block: bool = False):
    env.reset(options={"problem": PROBLEM})
    if close_prompts_think_block and env._thinking:  # the generation prompt opened a think block (R1, Qwen3.5)
        text = "Let me run it.\n</think>\n\n" + text
    end = env.format.turn_end_id
    return env.step([*encode(env.tokenizer, text), end])


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_a_think_end_inside_the_code_neither_skips_the_call_nor_is_graded(dialect, qwen_tok):
    env = environment(dialect, qwen_tok)
    text = get_dialect(dialect).call_text([FunctionCall("code_interpreter", {"code": CODE})])
    obs, reward, terminated, truncated, info = step_text(env, text, close_prompts_think_block=True)
    assert not (terminated or truncated), f"the call was read as the answer (reward {reward})"
    assert [r["status"] for r in info["tool_results"]] == ["ok"]
    assert env.trajectory.tool_calls[0].code == CODE


@pytest.mark.parametrize("dialect", sorted(d for d in DIALECTS if get_dialect(d).think_tags))
def test_reasoning_left_open_around_a_call_is_never_graded(dialect, qwen_tok):
    """The model opens its reasoning, writes a call whose code holds `</think>\\boxed{42}`, and ends its turn
    without a `</think>` of its own: the turn is all reasoning, no answer (a call inside reasoning is not run)."""
    env = environment(dialect, qwen_tok)
    text = "<think>\nLet me try.\n" + get_dialect(dialect).call_text([FunctionCall("code_interpreter",
                                                                                    {"code": CODE})])
    obs, reward, terminated, truncated, info = step_text(env, text)
    assert terminated and info["tool_results"] == [] and not env.trajectory.correct
    assert env.trajectory.graded_text == "" and reward < 0


@pytest.mark.parametrize("dialect", sorted(d for d in DIALECTS if get_dialect(d).think_tags))
def test_a_call_left_open_inside_reasoning_makes_the_rest_of_the_turn_reasoning(dialect, qwen_tok):
    """The model starts a call inside its reasoning and never closes it, then writes `</think>` and an answer: the
    `</think>` may be the call's text, so the turn is all reasoning, no answer (vLLM's reasoning parsers end the
    reasoning there and read the answer; docs/environment.md's table says why the environment does not)."""
    env = environment(dialect, qwen_tok)
    call = get_dialect(dialect).call_text([FunctionCall("code_interpreter", {"code": "print(6 * 7)"})])
    text = f"<think>\nI could run {call[:call.index('print(6') + 5]}\n</think>\n\nThe answer is \\boxed{{42}}."
    obs, reward, terminated, truncated, info = step_text(env, text)
    assert terminated and info["tool_results"] == [] and env.trajectory.graded_text == "" and reward < 0


# Mistral's `[TOOL_CALLS]` runs to the end of the turn: a `</think>` after it is the call's text.
@pytest.mark.parametrize("dialect", sorted(d for d in DIALECTS if get_dialect(d).think_tags and d != "mistral"))
def test_the_models_own_think_end_after_a_call_still_ends_its_reasoning(dialect, qwen_tok):
    env = environment(dialect, qwen_tok)
    call = get_dialect(dialect).call_text([FunctionCall("code_interpreter", {"code": "print(1)"})])
    obs, reward, terminated, truncated, info = step_text(env, f"<think>\n{call}\n</think>\n\nThe answer is "
                                                              "\\boxed{42}.")
    assert terminated and env.trajectory.correct and reward > 0


def test_reasoning_end_skips_call_blocks_in_linear_time():
    blocks = [("<tool_call>", "</tool_call>"), ("[TOOL_CALLS]", None)]
    assert reasoning_end("a</think>b", blocks) == 1
    assert split_reasoning("<tool_call>x</think>y</tool_call>z</think>w", False, blocks)[1] == "w"
    assert split_reasoning("<tool_call>x</think>y", True, blocks) == ("<tool_call>x</think>y", "")
    assert split_reasoning("[TOOL_CALLS]f[ARGS]{}</think>x", False, blocks) == ("", "[TOOL_CALLS]f[ARGS]{}</think>x")
    assert graded_text("a</think>b") == "</think>a</think>b" and graded_text("answer") == "answer"
    import time

    for text in ("<tool_call></tool_call>" * 50_000 + "</think>", "<tool_call></think></tool_call>" * 50_000):
        started = time.perf_counter()
        reasoning_end(text, blocks)
        assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_the_reasoning_split_is_linear_on_hostile_text(dialect):
    """Repeated call openers (closed, unclosed, or not calls at all) before and between `</think>`s."""
    import time

    split = get_dialect(dialect).split_reasoning
    openers = [o if isinstance(o, str) else "[f(" for o, _ in get_dialect(dialect).call_blocks] or ["<tool_call>"]
    for opener in openers:
        for unit in (opener, opener + "</think>", '{"name": "f", "a": [', "[f(x, '", "{ ", "[0, 1) "):
            text = unit * (200_000 // len(unit)) + "</think>"
            started = time.perf_counter()
            split(text, True)
            assert time.perf_counter() - started < 1.0, (opener, unit)


def _qwen_call(code: str) -> str:
    return ("<tool_call>\n<function=code_interpreter>\n<parameter=code>\n" + code +
            "\n</parameter>\n</function>\n</tool_call>")


def test_the_history_ends_the_reasoning_where_the_step_does(qwen_tok):
    """The chat history rebuilt after a call splits the turn at the model's own `</think>`, not at one inside a
    call block within its reasoning: the template gives the turn back as the model wrote it (no rewrite)."""
    import warnings

    env = ToolEnvironment(qwen_tok, [PROBLEM], chat_template="qwen3_8")  # reads reasoning from its own field
    env.reset(options={"problem": PROBLEM})
    turn = "Maybe " + _qwen_call("print('</think>')") + " no.\n</think>\n\n" + _qwen_call("print(6 * 7)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "the chat template rewrote an earlier turn" would fail here
        *_, info = env.step([*encode(qwen_tok, turn), env.format.turn_end_id])
    assert [r["output"].strip() for r in info["tool_results"]] == ["42"]
    assert env._conversation.messages[-2]["reasoning_content"].endswith("</tool_call> no.")


@pytest.mark.filterwarnings("ignore:the chat template rewrote")
def test_a_think_tag_in_gpt_oss_analysis_is_plain_text_in_the_history():
    """gpt-oss marks reasoning with channels: a `</think>` in its analysis never splits the turn (its template
    raises on a message whose content holds harmony markup)."""
    if "gptoss" not in NAMES:
        pytest.skip("needs TRL's chat templates")
    env = ToolEnvironment(family_tokenizer("gptoss"), [PROBLEM])
    env.reset(options={"problem": PROBLEM})
    turn = ('<|channel|>analysis<|message|>A </think> in my notes.<|end|><|start|>assistant to=functions.'
            'code_interpreter<|channel|>commentary json<|message|>{"code": "print(6 * 7)"}<|call|>')
    *_, info = env.step(encode(env.tokenizer, turn))
    assert [r["output"].strip() for r in info["tool_results"]] == ["42"]


@pytest.mark.parametrize(("template", "turn"), [
    ("gptoss", "<|channel|>analysis<|message|>It is \\boxed{42}.<|end|><|start|>assistant<|channel|>final<|message|>I "
               "am not sure.<|return|>"),
    ("gptoss", "<|channel|>analysis<|message|>It is \\boxed{42}.<|end|>"),
    ("muse_glimmer", " to=self<|message|>It is \\boxed{42}.<|eom|><|start|>assistant to=user<|message|>I am not "
                     "sure.<|eot|>"),
])
def test_channel_reasoning_is_never_graded(template, turn):
    """gpt-oss's analysis channel and Muse Glimmer's messages to `self` are reasoning (vLLM gives gpt-oss's back as
    `reasoning`, not content): a box there earns nothing; only the answer message is graded."""
    if template not in NAMES:
        pytest.skip("needs TRL's chat templates")
    env = ToolEnvironment(family_tokenizer(template), [PROBLEM])
    env.reset(options={"problem": PROBLEM})
    *_, terminated, truncated, info = env.step(encode(env.tokenizer, turn))
    assert terminated and not env.trajectory.correct and "boxed" not in env.trajectory.graded_text
    assert env.format.split_reasoning(turn)[0] == "It is \\boxed{42}."
