"""Tool-call dialects: every tool-capable chat template TRL ships renders a call that its detected dialect parses
back to the same call; each dialect reads what it writes, types arguments by the schema, explains malformed calls
in its own syntax, and stays linear on hostile text.

The templates are read from the installed TRL package's folder without importing TRL, and rendered by transformers'
`apply_chat_template` on the tiny offline tokenizer (rendering text needs no vocabulary of the model's own).
"""

from __future__ import annotations

import copy
import functools
import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retool_env.chat import resolve_chat_template, template_folders
from retool_env.dialects import (
    DIALECTS,
    FunctionCall,
    detect_dialect,
    get_dialect,
    renders_tool_calls,
    renders_tools,
    tool_call_shape,
    tool_system_prompt,
)
from retool_env.formats import CODE_INTERPRETER_TOOL
from retool_env.offline import tiny_tokenizer

TRL_TEMPLATES = sorted(p.stem for folder in template_folders()[1:] if folder.is_dir() for p in folder.glob("*.jinja"))
pytestmark = pytest.mark.skipif(not TRL_TEMPLATES, reason="TRL's chat templates are not installed")

# The dialect of every template TRL 1.16 ships that renders tool calls (its `_training` twin has the same one).
EXPECTED = {
    **dict.fromkeys(["qwen2_5", "qwen3", "qwen3_instruct_2507", "qwen3_vl"], "hermes"),
    **dict.fromkeys(["qwen3_5_think", "qwen3_5_nothink", "qwen3_6", "qwen3_8", "nemotron_3_nano",
                     "nemotron_3_super", "nemotron_3_ultra", "nemotron_3_5_lightning"], "qwen3_coder"),
    "gptoss": "openai",
    **dict.fromkeys(["llama3_1", "llama3_2"], "llama3_json"),
    "glm4moe": "glm45",
    **dict.fromkeys(["deepseekv3", "deepseek_r1_distill"], "deepseek_v3"),
    **dict.fromkeys(["gemma4", "gemma4_v2", "gemma4_v3", "gemma4_v4", "gemma4_v5", "diffusion_gemma"], "gemma4"),
    **dict.fromkeys(["lfm2", "lfm2_v2", "lfm2_2_5", "lfm2_2_5_v2", "lfm2_2_5_vl"], "lfm2"),
    "muse_glimmer": "atem",
}
NO_TOOLS = ["cohere", "cohere2", "gemma", "gemma3", "idefics3", "llama3", "llava_next", "phi3", "phi3_5",
            "qwen2_5_vl", "smolvlm"]
TOOL_TEMPLATES = [n for n in TRL_TEMPLATES if n.removesuffix("_training") in EXPECTED]
# Templates that quote string arguments raw ('...', no escaping): code with a quote or a backslash cannot survive.
RAW_QUOTING = {"lfm2_2_5", "lfm2_2_5_v2", "lfm2_2_5_vl"}
# Templates that render one call per assistant turn.
ONE_CALL = {"gptoss", "gptoss_training", "llama3_1", "llama3_2"}

CODE = 'print("6 * 7")\nx = "a\\\\b"  # a quote, a backslash, a newline\nprint(x)'
SIMPLE_CODE = "print(6 * 7)\nprint(7 * 6)"
TYPED_TOOL = {"type": "function", "function": {"name": "add", "description": "Add numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "scale": {"type": "number"},
                                     "exact": {"type": "boolean"}, "more": {"type": "array"}},
    "required": ["a"]}}}
TOOLS = [CODE_INTERPRETER_TOOL, TYPED_TOOL]


@functools.cache
def template_tokenizer(name: str):
    tok = copy.copy(tiny_tokenizer())
    tok.chat_template = resolve_chat_template(name)
    return tok


def rendered_assistant_text(name: str, calls: list[FunctionCall]) -> str:
    """What the model writes for `calls`, as the template renders it: the full conversation's text after the
    generation prompt (after the history alone where the prompt prefills text the render replaces, as R1's
    `<think>`)."""
    tok, dialect = template_tokenizer(name), get_dialect(detect_dialect(resolve_chat_template(name)))
    user = [{"role": "user", "content": "What is 6 * 7?"}]
    shape = tool_call_shape(tok.chat_template, dialect.name)
    if shape is not None:
        message = dialect.tool_call_message(shape.content, calls, arguments_as_string=shape.arguments_as_string)
    else:  # the template drops tool_calls: the model's calls stay in its content, as it wrote them
        message = {"role": "assistant", "content": dialect.call_text(calls)}
    prompt = tok.apply_chat_template(user, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    history = tok.apply_chat_template(user, tools=TOOLS, tokenize=False)
    full = tok.apply_chat_template([*user, message], tools=TOOLS, tokenize=False)
    return full[len(prompt if full.startswith(prompt) else history):]


@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_detect_dialect_of_every_trl_template(name):
    assert detect_dialect(resolve_chat_template(name)) == EXPECTED[name.removesuffix("_training")]


@pytest.mark.parametrize("name", [n for n in TRL_TEMPLATES if n.removesuffix("_training") in NO_TOOLS])
def test_templates_without_tool_calls_are_refused_with_the_choices(name):
    with pytest.raises(ValueError, match=r"name a dialect explicitly.*hermes"):
        detect_dialect(resolve_chat_template(name))


@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_renders_tools_only_deepseek_templates_need_the_system_prompt(name):
    assert renders_tools(resolve_chat_template(name)) == (not name.startswith("deepseek"))


@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_a_call_rendered_by_the_template_parses_back(name):
    dialect = get_dialect(detect_dialect(resolve_chat_template(name)))
    code = SIMPLE_CODE if name.removesuffix("_training") in RAW_QUOTING else CODE
    calls = [FunctionCall("code_interpreter", {"code": code})]
    if name not in ONE_CALL:
        calls.append(FunctionCall("code_interpreter", {"code": "print(2 ** 10)"}))
    text = rendered_assistant_text(name, calls)
    turn = dialect.parse(text, TOOLS)
    assert [(c.name, c.arguments, c.error) for c in turn.calls] == [(c.name, c.arguments, None) for c in calls], text
    assert not turn.unfinished
    assert "code_interpreter" not in turn.content


@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_typed_arguments_rendered_by_the_template_parse_to_their_schema_types(name):
    dialect = get_dialect(detect_dialect(resolve_chat_template(name)))
    arguments = {"a": 7, "scale": 2.5, "exact": True, "more": [1, 2]}
    text = rendered_assistant_text(name, [FunctionCall("add", arguments)])
    (call,) = dialect.parse(text, TOOLS).calls
    assert (call.name, call.arguments, call.error) == ("add", arguments, None), text


# --- Each dialect reads what it writes, for any code and typed values --------------------------------------------

# Text that would end a value early in some dialect (a closing tag inside XML-style values): such code cannot be
# written in that dialect at all, so the property excludes it.
MARKERS = ["</parameter>", "</function>", "</tool_call>", "</arg_value>", "<arg_key>", '<|"|>', "<tool_call|>",
           "</atem:parameter>", "</atem:invoke>", "</atem:function_calls>", "<|tool_call_end|>", "<|start|>",
           "<|message|>", "<|call|>", "<|end|>", "<|return|>", "[TOOL_CALLS]", "<｜tool▁call▁end｜>",
           "<|tool_call_end|>", "<|eot|>", "<|eom|>", "<|im_end|>", "<turn|>", "</s>", "<|eot_id|>"]
codes = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=200).filter(
    lambda code: not any(marker in code for marker in MARKERS) and code.strip() == code)
typed = st.fixed_dictionaries({"a": st.integers(-10**12, 10**12)}, optional={
    "scale": st.floats(-1e6, 1e6, allow_nan=False).filter(lambda x: not float(x).is_integer()),
    "exact": st.booleans(), "more": st.lists(st.integers(-99, 99), max_size=4)})


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(code=codes, arguments=typed)
def test_a_dialect_parses_the_calls_it_writes(dialect, code, arguments):
    parser = get_dialect(dialect)
    calls = [FunctionCall("code_interpreter", {"code": code}), FunctionCall("add", arguments)]
    calls = calls if parser.multiple_calls else calls[:1]
    turn = parser.parse(parser.call_text(calls), TOOLS)
    assert [(c.name, c.arguments, c.error) for c in turn.calls] == [(c.name, c.arguments, None) for c in calls]


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_text_around_calls_is_the_content(dialect):
    parser = get_dialect(dialect)
    if dialect in ("llama3_json", "pythonic", "openai", "atem"):  # a turn of calls holds no free text here
        assert parser.parse("The answer is \\boxed{42}.").content == "The answer is \\boxed{42}."
        return
    text = "Let me compute.\n" + parser.call_text([FunctionCall("code_interpreter", {"code": "print(1)"})])
    turn = parser.parse(text, TOOLS)
    assert turn.content.strip() == "Let me compute." and turn.calls[0].arguments == {"code": "print(1)"}


# --- Malformed calls are answered in the dialect's own terms ----------------------------------------------------

MALFORMED = {
    "hermes": '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=code_interpreter>\n<parameter=code>\nprint(1)\n</parameter>\n</tool_call>",
    "openai": '<|channel|>commentary to=functions.code_interpreter <|constrain|>json<|message|>{"code": print(1)}',
    "llama3_json": '{"name": "code_interpreter", "parameters": {"code": "print(1)"}',
    "glm45": "<tool_call>code_interpreter\n<arg_key>code</arg_key>\nprint(1)\n</tool_call>",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>code_interpreter\n{}"
                   "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "deepseek_v31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>code_interpreter{\"code\": 1}<｜tool▁call▁end｜>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.code_interpreter:0{}<|tool_call_end|>"
               "<|tool_calls_section_end|>",
    "mistral": '[TOOL_CALLS]code_interpreter[ARGS]{"code": print(1)}',
    "lfm2": "<|tool_call_start|>[code_interpreter(code=print(1))]<|tool_call_end|>",
    "pythonic": "[code_interpreter('print(1)')]",
    "gemma4": "<|tool_call>call:code_interpreter{code:<|\"|>print(1)}<tool_call|>",
    "atem": '<atem:function_calls>\n<atem:invoke name="code_interpreter">\n<atem:parameter name="code">print(1)'
            '\n</atem:invoke>\n</atem:function_calls>',
}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_a_malformed_call_gets_an_error_showing_the_dialects_syntax(dialect):
    parser = get_dialect(dialect)
    (call,) = parser.parse(MALFORMED[dialect], TOOLS).calls
    assert call.error and call.arguments is None
    example = parser.call_text([FunctionCall("code_interpreter", {"code": "..."})])
    if dialect == "hermes":  # its markers are Qwen's special tokens: the JSON alone (see Hermes.fault)
        example = example.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>") + " as the tool call's JSON."
    assert call.error.endswith(example), call.error


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_unknown_functions_missing_and_mistyped_parameters_are_errors(dialect):
    parser = get_dialect(dialect)

    def error_of(call: FunctionCall) -> str:
        (parsed,) = parser.parse(parser.call_text([call]), TOOLS).calls
        assert parsed.arguments is None
        return parsed.error

    unknown = error_of(FunctionCall("python", {"code": "1"}))
    assert "unknown function 'python'" in unknown and "'code_interpreter', 'add'" in unknown
    assert "add needs the parameter 'a'" in error_of(FunctionCall("add", {"scale": 1.5}))
    mistyped = error_of(FunctionCall("add", {"a": "seven"}))
    assert "'a'" in mistyped and "integer" in mistyped


def test_harmony_reads_the_call_after_the_analysis_and_the_answer_from_the_final_channel():
    parser = get_dialect("openai")
    turn = parser.parse('<|channel|>analysis<|message|>Compute it.<|end|><|start|>assistant to=functions.'
                        'code_interpreter<|channel|>commentary <|constrain|>json<|message|>'
                        '{"code": "print(1)"}<|call|>',
                        TOOLS)
    assert [(c.name, c.arguments) for c in turn.calls] == [("code_interpreter", {"code": "print(1)"})]
    final = parser.parse("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>"
                         "\\boxed{42}<|return|>", TOOLS)
    assert final.calls == () and final.content == "\\boxed{42}"
    (builtin,) = parser.parse("<|channel|>analysis to=python<|message|>print(1)<|call|>", TOOLS).calls
    assert "not a function" in builtin.error


def test_qwen3_coder_reads_a_function_without_its_tool_call_wrapper():
    turn = get_dialect("qwen3_coder").parse("Compute.\n<function=code_interpreter>\n<parameter=code>\nprint(1)\n"
                                            "</parameter>\n</function>", TOOLS)
    assert turn.calls[0].arguments == {"code": "print(1)"} and turn.content == "Compute.\n"


def test_arguments_are_unchecked_without_tools():
    (call,) = get_dialect("qwen3_coder").parse(
        "<tool_call>\n<function=anything>\n<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>").calls
    assert (call.name, call.arguments, call.error) == ("anything", {"n": "7"}, None)


def test_a_call_cut_off_inside_its_block_is_unfinished():
    turn = get_dialect("hermes").parse('<tool_call>\n{"name": "code_interpreter", "argu')
    assert turn.unfinished and not turn.calls


# --- Hostile text: linear time, bounded nesting, never an exception ---------------------------------------------

def hostile_inputs(size: int) -> dict[str, str]:
    """Texts that make a naive parser quadratic or recursive: openers without closers, deep nesting."""
    return {
        "open tags": "<tool_call>" * (size // 11),
        "open tags with text": ("<tool_call>x" + "<function=f>" + "<parameter=p>" + "<arg_key>") * (size // 40),
        "deep brackets": "<tool_call>" + "[" * size + "</tool_call>",
        "deep json": '<tool_call>{"name": "f", "arguments": ' + '{"a": ' * (size // 6) + "</tool_call>",
        "python list": "<|tool_call_start|>[f(a=" + "[" * size + "]<|tool_call_end|>",
        "python calls": "[" + "f(a=1), " * (size // 8) + "]",
        "unclosed strings": "[f(a='" + "x" * size + ")]",
        "harmony messages": "<|start|>assistant to=functions.f<|channel|>commentary<|message|>{" * (size // 60),
        "deepseek": "<｜tool▁calls▁begin｜>" + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n" * (size // 40),
        "kimi": "<|tool_calls_section_begin|>" + "<|tool_call_begin|>functions.f:0" * (size // 30),
        "mistral": "[TOOL_CALLS]" * (size // 12),
        "gemma": "<|tool_call>call:f{" + '<|"|>a<|"|>:' * (size // 12),
        "atem": "<atem:function_calls>" + '<atem:invoke name="f">' * (size // 22),
        "unary minus": "[f(a=" + "-" * size + "1)]",
        "json calls": '{"name": "f", "parameters": {}}; ' * (size // 34),
        "deep braces": "{" * size,
        "unclosed parameters": "<tool_call><function=f>" + "".join(f"<parameter=k{i}>v" for i in range(size // 20)),
    }


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_hostile_text_is_parsed_in_linear_time(dialect):
    parser = get_dialect(dialect)
    for what, text in hostile_inputs(1_000_000).items():
        start = time.perf_counter()
        turn = parser.parse(text, TOOLS)
        elapsed = time.perf_counter() - start
        # Linear work on 1 MB takes well under a second; a quadratic scan of these inputs takes minutes. The bound is
        # generous because the test machine's cores are shared.
        assert elapsed < 10, f"{dialect} took {elapsed:.1f}s on {what}"
        assert all(call.error or call.arguments is not None for call in turn.calls)


fragments = st.sampled_from(["<tool_call>", "</tool_call>", "<function=code_interpreter>", "<parameter=code>",
                             "</parameter>", "</function>", "{", "}", "[", "]", "(", ")", '"', "'", ",", "=", ":",
                             "\\", "\n", "code", "code_interpreter", '"name": ', '"arguments": ', "<arg_key>",
                             "</arg_key>", "<arg_value>", "</arg_value>", "<|start|>", "<|message|>", "<|call|>",
                             "to=functions.code_interpreter", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>",
                             "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "```json", "[TOOL_CALLS]", "[ARGS]",
                             "<|tool_call_start|>", "<|tool_call_end|>", "<|tool_call>", "<tool_call|>", "call:",
                             '<|"|>', "<atem:function_calls>", '<atem:invoke name="', '">', "<atem:parameter name=\"",
                             "</atem:parameter>", "</atem:invoke>", "</atem:function_calls>", "True", "1", "-"])


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@settings(max_examples=150, deadline=None)
@given(text=st.lists(st.one_of(fragments, st.text(max_size=5)), max_size=60).map("".join))
def test_fuzzed_text_gives_calls_or_errors_never_an_exception(dialect, text):
    turn = get_dialect(dialect).parse(text, TOOLS)
    for call in turn.calls:
        assert (call.error is None) == (call.arguments is not None)
        assert call.error is None or call.error.strip()


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_a_number_past_pythons_digit_limit_is_an_error_never_an_exception(dialect):
    text = get_dialect(dialect).call_text([FunctionCall("code_interpreter", {"code": "x"})])
    turn = get_dialect(dialect).parse(text.replace('"x"', "9" * 6000).replace("'x'", "9" * 6000), TOOLS)
    assert all(call.ok or len(call.error) < 600 for call in turn.calls)


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_a_dialect_declares_the_markers_it_is_detected_by(dialect):
    """Each dialect's module says what in a template shows its syntax (and registers it): a template holding only
    one of those marker groups is detected as that dialect."""
    groups = get_dialect(dialect).markers
    assert groups
    for group in groups:
        assert detect_dialect(" ... ".join(group)) == dialect


# --- Templates that do not render the tools: the system prompt carries them --------------------------------------

@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_the_system_prompt_shows_the_schema_and_a_call_the_dialect_parses(dialect):
    prompt = tool_system_prompt(dialect, TOOLS)
    assert json.dumps(CODE_INTERPRETER_TOOL, ensure_ascii=False) in prompt
    example = get_dialect(dialect).call_text([FunctionCall("code_interpreter", {"code": "..."})])
    assert example in prompt
    assert get_dialect(dialect).parse(example, TOOLS).calls[0].arguments == {"code": "..."}


@pytest.mark.parametrize("name", [n for n in TOOL_TEMPLATES if n.startswith("deepseek")])
def test_a_deepseek_template_shows_the_tools_through_the_system_prompt(name):
    tok = template_tokenizer(name)
    system = {"role": "system", "content": tool_system_prompt(detect_dialect(tok.chat_template), TOOLS)}
    rendered = tok.apply_chat_template([system, {"role": "user", "content": "q"}], tokenize=False,
                                       add_generation_prompt=True)
    assert "code_interpreter" in rendered and "<｜tool▁calls▁begin｜>" in rendered


def test_renders_tool_calls_knows_which_templates_drop_them():
    assert not renders_tool_calls(resolve_chat_template("lfm2"), "lfm2")
    assert not renders_tool_calls(resolve_chat_template("deepseek_r1_distill"), "deepseek_v3")
    assert renders_tool_calls(resolve_chat_template("qwen3_8"), "qwen3_coder")
    assert tool_call_shape(resolve_chat_template("deepseekv3"), "deepseek_v3").arguments_as_string
    assert not tool_call_shape(resolve_chat_template("deepseekv3_training"), "deepseek_v3").arguments_as_string


def test_get_dialect_names_the_choices():
    assert get_dialect("qwen3_xml") is get_dialect("qwen3_coder")
    with pytest.raises(ValueError, match=r"unknown tool-call dialect 'xml'.*qwen3_coder"):
        get_dialect("xml")


def test_the_dialects_import_nothing_heavy():
    """The parsers are on every step's path: importing them loads neither torch, TRL, vLLM nor transformers."""
    import subprocess
    import sys

    code = ("import sys, retool_env.dialects; heavy = [m for m in ('torch', 'trl', 'vllm', 'transformers') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
