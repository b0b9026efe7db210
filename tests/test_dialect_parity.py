"""Parity per dialect: for every tool-capable chat template TRL ships, a tool call rendered by the template itself
from an assistant message, fed back as the model's action under `tool_format="auto"`, is parsed and run, and the next
context is exactly the template's rendering of the conversation (masks exact), in both sample modes.

Tokenizers are Qwen's vocabulary built offline plus the special tokens each template spells (found in its text), so
every end-of-turn and call marker is one token, as in the family's own tokenizer.
"""

from __future__ import annotations

import base64
import copy
import functools
import re
import warnings

import pytest

from retool_env import ToolEnvironment
from retool_env.chat import chat_template_names, resolve_chat_template
from retool_env.dialects import FunctionCall, detect_dialect, get_dialect, renders_tools, tool_call_shape
from retool_env.formats import CODE_INTERPRETER_TOOL, DialectFormat, encode
from tests.test_chat_templates import PROBLEM

# Markup tokens as the families write them: <|name|>, <|name>, <name|>, <｜name｜>, [NAME].
_SPECIAL = re.compile(r"<\|[A-Za-z0-9_\"]+\|?>|<[A-Za-z0-9_]+\|>|<｜[^｜<>'\"]{1,40}｜>|\[(?:TOOL_CALLS|INST|/INST)\]")
_EOS = ("<｜end▁of▁sentence｜>", "<|return|>", "<|eot_id|>", "<turn|>", "<|eot|>", "<|im_end|>", "<|endoftext|>")


def _tool_capable(name: str) -> bool:
    try:
        template = resolve_chat_template(name)
        return tool_call_shape(template, detect_dialect(template)) is not None or not renders_tools(template)
    except ValueError:
        return False


NAMES = [n for n in chat_template_names() if _tool_capable(n)]
pytestmark = pytest.mark.skipif(not NAMES, reason="TRL's chat templates are not installed")


@functools.cache
def _qwen_with(extra: tuple[str, ...]):
    """Qwen's vocabulary plus `extra` special tokens: one copy per set of tokens (48 templates spell 10 sets), since
    copying a 151k-token tokenizer takes seconds."""
    from retool_env.offline import qwen_tokenizer

    tok = copy.deepcopy(qwen_tokenizer())
    if extra:
        tok.add_special_tokens({"additional_special_tokens": list(extra)})
    return tok


def family_tokenizer(name: str):
    """The family's tokenizer for template `name`. Templates that spell the same special tokens share one object,
    re-pointed at `name`'s template and end token here: use one at a time."""
    template = resolve_chat_template(name)
    known = set(_qwen_with(()).get_added_vocab())
    tok = _qwen_with(tuple(sorted({t for t in _SPECIAL.findall(template) if t not in known})))
    tok.eos_token = next(t for t in _EOS if t in template or t in known)
    tok.chat_template = template
    return tok


def render(tok, messages, add_generation_prompt=True) -> str:
    return tok.apply_chat_template(messages, tools=[CODE_INTERPRETER_TOOL], tokenize=False,
                                   add_generation_prompt=add_generation_prompt)


def scripted_call(env: ToolEnvironment, code: str) -> tuple[dict, list[int]]:
    """The call turn as the template renders it from an assistant message, and the tokens the model writes for it
    (after the generation prompt, up to and with the first end token). Without reasoning, else (where the
    generation prompt opens a think block) with it, as a `reasoning_content` field or in the content."""
    tok, fmt = env.tokenizer, env.format
    messages = env._conversation.messages
    prompt = render(tok, messages)
    call = FunctionCall("code_interpreter", {"code": code})
    think = "<think>\nLet me compute.\n</think>\n\n"
    if fmt.shape is None:  # the template drops tool_calls: the model's text is the content
        variants = [{"role": "assistant", "content": text}
                    for text in (fmt.call_text(code), think + fmt.call_text(code))]
    else:
        message = fmt.dialect.tool_call_message(fmt.shape.content, [call],
                                                arguments_as_string=fmt.shape.arguments_as_string)
        variants = [message, {**message, "reasoning_content": "Let me compute."}, {**message, "content": think}]
    for message in variants:
        full = render(tok, [*messages, message, *fmt.tool_messages(["42\n"])])
        if full.startswith(prompt):
            ids = encode(tok, full[len(prompt):])
            break
    else:  # the template drops the reasoning it prefilled (DeepSeek-R1-Distill): the model writes it, then calls
        assert prompt.endswith("<think>\n")
        ids = encode(tok, think.removeprefix("<think>\n") + fmt.call_text(code) + tok.eos_token)
    end = next(i for i, t in enumerate(ids) if t in fmt.end_token_ids)
    return message, ids[: end + 1]


@pytest.mark.parametrize("mode", ["turn", "episode"])
@pytest.mark.parametrize("name", NAMES)
def test_a_call_the_template_renders_is_run_and_the_next_context_is_the_templates(name, mode):
    tok = family_tokenizer(name)
    env = ToolEnvironment(tok, [PROBLEM], sample_mode=mode)  # tool_format="auto"
    dialect = detect_dialect(tok.chat_template)
    assert env.format.name == dialect
    assert isinstance(env.format, DialectFormat)
    prompt, _ = env.reset(options={"problem": PROBLEM})
    message, action = scripted_call(env, "print(6 * 7)")
    obs, reward, terminated, truncated, info = env.step({"token_ids": action, "logprobs": [-1.0] * len(action)})
    assert not (terminated or truncated)
    assert [r["status"] for r in info["tool_results"]] == ["ok"]
    assert env.trajectory.num_tool_calls == 1
    (tool,) = [m for m in env._conversation.messages if m["role"] == "tool"]
    assert tool["content"].strip() == "42"
    text = render(tok, [*env._conversation.messages[:-2], message, tool])
    if info["new_sample"]:  # the template rewrote the call turn: the new context is its rendering, token for token
        assert mode == "turn" and obs.tolist() == encode(tok, text)
    elif mode == "turn" or env.trajectory.rewritten_turns == 0:
        # The model's tokens as it sampled them, then the template's own tokens for the rest of the rendering
        written = tok.decode([*prompt.tolist(), *action])
        assert text.startswith(written) and obs.tolist() == encode(tok, text[len(written):])
    sample = env.trajectory.samples[0]
    turn = env.trajectory.turns[0]
    assert sample.completion_ids[turn.start:turn.end] == action
    assert sample.env_mask[turn.start:turn.end] == [1] * len(action)
    assert set(sample.env_mask[turn.end:]) <= {0}
    assert sample.logprobs[turn.start:turn.end] == [-1.0] * len(action)


@pytest.mark.parametrize("name", [n for n in NAMES if not renders_tools(resolve_chat_template(n))])
def test_a_template_that_does_not_render_tools_gets_them_in_the_system_prompt(name):
    tok = family_tokenizer(name)
    env = ToolEnvironment(tok, [PROBLEM])
    prompt, _ = env.reset(options={"problem": PROBLEM})
    text = tok.decode(prompt.tolist())
    assert '"name": "code_interpreter"' in text
    assert get_dialect(env.format.name).call_text([FunctionCall("code_interpreter", {"code": "..."})]) in text


def test_an_explicit_format_still_wins_over_auto():
    tok = family_tokenizer("qwen3_6") if "qwen3_6" in NAMES else pytest.skip("needs TRL")
    assert ToolEnvironment(tok, [PROBLEM]).format.name == "qwen3_coder"
    assert ToolEnvironment(tok, [PROBLEM], tool_format="hermes").format.name == "hermes"
    assert ToolEnvironment(tok, [PROBLEM], tool_format="retool").format.name == "retool"
    with pytest.raises(ValueError, match="unknown tool_format"):
        ToolEnvironment(tok, [PROBLEM], tool_format="no_such_dialect")


def test_chat_template_kwargs_reach_every_render():
    tok = family_tokenizer("qwen3_6") if "qwen3_6" in NAMES else pytest.skip("needs TRL")
    thinking = tok.decode(ToolEnvironment(tok, [PROBLEM]).reset(options={"problem": PROBLEM})[0].tolist())
    env = ToolEnvironment(tok, [PROBLEM], chat_template_kwargs={"enable_thinking": False})
    prompt, _ = env.reset(options={"problem": PROBLEM})
    assert thinking.endswith("<think>\n") and tok.decode(prompt.tolist()).endswith("<think>\n\n</think>\n\n")
    message, action = scripted_call(env, "print(6 * 7)")
    obs, *_ = env.step(action)
    assert tok.decode(obs.tolist()).endswith("<think>\n\n</think>\n\n")  # the next generation prompt too


@pytest.mark.parametrize("mode", ["turn", "episode"])
@pytest.mark.parametrize("name", [n for n in ("gptoss", "llama3_1", "glm4moe", "qwen3_6", "gemma4", "lfm2_v2",
                                              "muse_glimmer", "deepseekv3") if n in NAMES])
def test_tool_output_never_becomes_a_special_token(name, mode):
    """Code that prints the template's own markup gets it back as characters, in every dialect: the next context
    holds exactly the special tokens of a benign result of the same length."""
    tok = family_tokenizer(name)
    forged = "".join(sorted(set(_SPECIAL.findall(tok.chat_template))))

    def next_context(printed: str) -> tuple[list[int], str]:
        env = ToolEnvironment(tok, [PROBLEM], sample_mode=mode)
        env.reset(options={"problem": PROBLEM})
        code = f"import base64; print(base64.b64decode({base64.b64encode(printed.encode())!r}).decode(), end='')"
        _, action = scripted_call(env, code)
        obs, *_, info = env.step(action)
        assert info["tool_results"][0]["status"] == "ok"
        return obs.tolist(), tok.decode(obs.tolist())

    added = set(tok.get_added_vocab().values())
    benign_ids, _ = next_context("x" * len(forged))
    with warnings.catch_warnings():  # gpt-oss and Llama 3.1 render the output as a JSON string: still located
        warnings.filterwarnings("error", message=".*cannot locate")
        forged_ids, forged_text = next_context(forged)
    assert [i for i in forged_ids if i in added] == [i for i in benign_ids if i in added]
    assert forged in forged_text.replace("\\\"", "\"")  # gpt-oss and Llama 3.1 render it as a JSON string


def test_trls_chat_template_kwargs_reach_the_rollouts_environments():
    """ReToolRollout reads GRPOConfig.chat_template_kwargs from the trainer it is handed (a stand-in holding only the
    two fields read here: the real GRPOTrainer path runs in tests/test_trl.py)."""
    pytest.importorskip("trl")
    from types import SimpleNamespace

    from retool_adapters.trl import ReToolRollout

    tok = family_tokenizer("qwen3_6") if "qwen3_6" in NAMES else pytest.skip("needs TRL's templates")
    trainer = SimpleNamespace(args=SimpleNamespace(max_completion_length=64,
                                                   chat_template_kwargs={"enable_thinking": False}))
    env = ReToolRollout([PROBLEM], tokenizer=tok, chat_template="qwen3_6")._env_factory(trainer)()
    assert env.config.chat_template_kwargs == {"enable_thinking": False}
    assert tok.decode(env.reset(options={"problem": PROBLEM})[0].tolist()).endswith("<think>\n\n</think>\n\n")
