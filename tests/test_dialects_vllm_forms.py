"""Forms vLLM 0.32's tool parsers read that the dialects refused or read otherwise (issue 46), read as vLLM reads them
now; and the ones refused on purpose (docs/environment.md's table), refused with a message. The same turns are
compared with vLLM's real parsers in tests/vllm/test_tool_parser_parity.py; these run without vLLM.
"""

from __future__ import annotations

import pytest

from retool_env import Problem, ToolEnvironment
from retool_env.dialects import get_dialect
from retool_env.formats import encode
from tests.vllm.tool_parser_cases import TOOLS

Q = "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n{}</function>\n</tool_call>"
READ = [
    ("qwen3_coder", Q.format("<parameter=page>\n5\n</parameter>\n"), [("search", {"query": "q", "page": 5})]),
    ("qwen3_coder", Q.format("<parameter=page>\nnull\n</parameter>\n"), [("search", {"query": "q", "page": None})]),
    ("qwen3_coder", Q.format("<parameter=ratio>\n0.5\n</parameter>\n"), [("search", {"query": "q", "ratio": 0.5})]),
    ("qwen3_coder", "<tool_call>\n<function=search>\n<parameter=query>\nDallas\n<parameter=limit>\n3\n</parameter>\n"
                    "</function>\n</tool_call>", [("search", {"query": "Dallas", "limit": 3})]),
    ("qwen3_coder", "<tool_call>\n<function=code_interpreter>\n<parameter=code>\nprint('</tool_call>')\n"
                    "</parameter>\n</function>\n</tool_call>",
     [("code_interpreter", {"code": "print('</tool_call>')"})]),
    ("glm45", "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>q</arg_value>\n<arg_key>page</arg_key>\n"
              "<arg_value>7</arg_value>\n</tool_call>", [("search", {"query": "q", "page": 7})]),
    ("hermes", '<tool_call>\n{"name": "search", "arguments": {"query": "q"}}', [("search", {"query": "q"})]),
    ("llama3_json", 'Here it is: {"name": "search", "parameters": {"query": "q"}}', [("search", {"query": "q"})]),
    ("mistral", '[TOOL_CALLS]search{"query": "q"}', [("search", {"query": "q"})]),
    ("mistral", '[TOOL_CALLS]search[ARGS]{"query": "q"} then text', [("search", {"query": "q"})]),
    ("mistral", '[TOOL_CALLS]{"name": "search", "arguments": {"query": "q"}}', [("search", {"query": "q"})]),
    ("pythonic", "[search(query='q', tags={'urgent', 'bug'})]",
     [("search", {"query": "q", "tags": ["urgent", "bug"]})]),
    ("lfm2", "<|tool_call_start|>[search(query='a\x00b')]<|tool_call_end|>", [("search", {"query": "a\x00b"})]),
    ("gemma4", '<|tool_call>:search{query:<|"|>q<|"|>}<tool_call|>', [("search", {"query": "q"})]),
    ("lfm2", "<|tool_call_start|>[code_interpreter(code='x = f('a', 'b')\nprint(x)')]<|tool_call_end|>",
     [("code_interpreter", {"code": "x = f('a', 'b')\nprint(x)"})]),  # LFM2.5's first template: raw quotes
    ("lfm2", "<|tool_call_start|>[search(query='sed -n '1,9p' f.py', limit=07)]<|tool_call_end|>",
     [("search", {"query": "sed -n '1,9p' f.py", "limit": 7})]),
    ("lfm2", "<|tool_call_start|>[search(query=\"say \"hi\"\", tags=['a', 'b'], limit=008)]<|tool_call_end|>",
     [("search", {"query": 'say "hi"', "tags": ["a", "b"], "limit": 8})]),
    ("openai", ' to=search<|channel|>commentary json<|message|>{"query": "q"}<|call|>', [("search", {"query": "q"})]),
    ("openai", '<|channel|>commentary to=functions.search <|constrain|>json<|message|>{"query": "q"}<|call|>',
     [("search", {"query": "q"})]),
]
REFUSED = [
    ("openai", " to=python<|channel|>commentary code<|message|>print(6 * 7)<|call|>", "built-in tool"),
    ("openai", '<|channel|>commentary to=browser.search json<|message|>{"query": "q"}<|call|>', "built-in tool"),
    ("openai", ' to=container.exec<|channel|>commentary json<|message|>{"cmd": ["ls"]}<|call|>', "built-in tool"),
    ("openai", ' to=functions.<|channel|>commentary json<|message|>{"query": "q"}<|call|>', "not a function"),
    ("pythonic", "[search(query=b'q')]", "no JSON form"),
    ("pythonic", "[search(query='q', filters={1: 2})]", "not a string"),
    ("lfm2", "<|tool_call_start|>[search(query='1'2', exact='3')]<|tool_call_end|>", "not closed"),  # two closes read
    ("kimi_k2", '<|tool_calls_section_begin|><|tool_call_begin|>functions.search.0<|tool_call_argument_begin|>'
                '{"query": "q"}<|tool_call_end|><|tool_calls_section_end|>', "functions.NAME:INDEX"),
]


@pytest.mark.parametrize(("dialect", "text", "calls"), READ)
def test_a_form_vllm_reads_is_read_alike(dialect, text, calls):
    turn = get_dialect(dialect).parse(text, TOOLS)
    assert [(c.name, c.arguments, c.error) for c in turn.calls] == [(n, a, None) for n, a in calls]


@pytest.mark.parametrize(("dialect", "text", "why"), REFUSED)
def test_a_form_refused_on_purpose_says_why(dialect, text, why):
    (call,) = get_dialect(dialect).parse(text, TOOLS).calls
    assert call.arguments is None and why in call.error


def test_content_is_what_vllm_gives_back():
    assert get_dialect("mistral").parse('[TOOL_CALLS]search[ARGS]{"query": "q"} then text', TOOLS).content == (
        " then text")
    echoed = "<|tool_call_start|>[search(query='q')]<|tool_call_end|>[search(query='q')] Done."
    assert get_dialect("lfm2").parse(echoed, TOOLS).content == " Done."
    harmony = ("<|channel|>commentary<|message|>Running it.<|end|><|start|>assistant to=functions.search"
               '<|channel|>commentary json<|message|>{"query": "q"}<|call|>')
    assert get_dialect("openai").parse(harmony, TOOLS).content == "Running it."


def test_lfm2_repairs_stay_linear():
    """A broken string with thousands of possible closing quotes is refused after a bounded number of tries."""
    import time

    text = "<|tool_call_start|>[search(query='" + "x', " * 20_000 + "y')]<|tool_call_end|>"
    started = time.perf_counter()
    (call,) = get_dialect("lfm2").parse(text, TOOLS).calls
    assert call.error is not None and time.perf_counter() - started < 2.0


HARMONY_CONTENT = [  # (turn, the content vLLM's HarmonyParser gives back, its end token aside)
    ("<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>final<|message|>42<|return|>",
     "Let me check.\n42"),
    ("<|channel|>analysis<|message|>6 * 7<|end|><|start|>assistant<|channel|>final The answer is \\boxed{42}.",
     "<|start|>assistant<|channel|>final The answer is \\boxed{42}."),
    ("<|channel|>final The answer is \\boxed{42}.<|return|>", "<|channel|>final The answer is \\boxed{42}."),
    ("<|channel|>final<|message|>a<|end|>junk<|start|>assistant<|channel|>final<|message|>b<|return|>", "a\nb"),
    ("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary<|message|>I will run it.<|end|>"
     "<|start|>assistant to=python<|channel|>commentary code<|message|>print(1)<|call|>", "I will run it."),
]


@pytest.mark.parametrize(("text", "content"), HARMONY_CONTENT)
def test_harmony_content_is_what_vllm_gives_back(text, content):
    """Preambles are content, joined as vLLM joins messages; a header cut off before `<|message|>` keeps its text."""
    assert get_dialect("openai").parse(text, TOOLS).content == content


@pytest.mark.filterwarnings("ignore:the chat template rewrote")
def test_gpt_oss_builtin_tools_and_a_headerless_final_through_the_step():
    """On gpt-oss's own template: a call to the built-in `python` tool is answered (vLLM's chat completions would
    drop it), and a final message whose header never reaches `<|message|>` is graded on its text."""
    from tests.test_dialect_parity import NAMES, family_tokenizer

    if "gptoss" not in NAMES:
        pytest.skip("needs TRL's chat templates")
    env = ToolEnvironment(family_tokenizer("gptoss"), [Problem("What is 6 * 7?", "42", id="p")])
    for recipient in ("python", "browser.search"):
        env.reset(seed=0)
        turn = f"<|channel|>commentary to={recipient} code<|message|>print(6 * 7)<|call|>"
        obs, reward, terminated, truncated, info = env.step(encode(env.tokenizer, turn))
        assert not (terminated or truncated)
        (result,) = info["tool_results"]
        assert result["status"] == "invalid" and "to=functions.code_interpreter" in result["output"]
    env.reset(seed=0)
    turn = "<|channel|>analysis<|message|>6 * 7<|end|><|start|>assistant<|channel|>final The answer is \\boxed{42}."
    *_, terminated, truncated, info = env.step([*encode(env.tokenizer, turn), env.format.turn_end_id])
    assert terminated and info["reward"] == 1.0


def test_a_hermes_call_without_its_closing_tag_runs_through_the_step(qwen_tok):
    """The model ends its turn after the call's complete JSON without `</tool_call>`: run, as vLLM runs it."""
    env = ToolEnvironment(qwen_tok, [Problem("What is 6 * 7?", "42", id="p")], tool_format="hermes")
    env.reset(seed=0)
    text = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}'
    obs, reward, terminated, truncated, info = env.step([*encode(qwen_tok, text), env.format.turn_end_id])
    assert not (terminated or truncated)
    assert [(r["status"], r["output"].strip()) for r in info["tool_results"]] == [("ok", "42")]
