"""Prompt templates, rendered once through the tokenizer's own chat template.

A template turns a raw problem into chat messages; the tool format supplies the tool schema (hermes) or none (the
paper's inline `<code>` format). The problem must be the raw statement: an already-templated prompt (DAPO's
"Solve the following math problem step by step..." wrapper) is templated twice, the bug of slime and its vLLM port.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from retool_env.tokens import Tokenizer

# The ReTool paper's code-interpreter prompt (ReTool-SFT's `ci_user_prompt_template_v3`), one user message.
RETOOL_USER = """Solve the following problem step by step. You now have the ability to selectively write executable Python code to enhance your reasoning process. The Python code will be executed by an external sandbox, and the output (wrapped in `<interpreter>output_str</interpreter>`) can be returned to aid your reasoning and help you arrive at the final answer. The Python code should be complete scripts, including necessary imports. 
Each code snippet is wrapped with `<code>
```python
code snippet
```
</code>`.
The last part of your response should be in the following format:
<answer>
\\boxed{'The final answer goes here.'}
</answer>

*user question:*
{problem}

Remember to place the final answer in the last part using the format: 
<answer>
\\boxed{'The final answer goes here.'}
</answer>"""  # noqa: W291, E501 (the paper's template verbatim: trailing spaces, a long first line)

# DAPO-Math-17k's instruction wrapper (its `prompt` column), as the verl recipe sends it.
DAPO_USER = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)

# slime's examples/retool system prompt, used with Hermes tool calling.
SLIME_SYSTEM = (
    "You are a helpful assistant that can use Python tools to solve mathematical problems. When you need to "
    "perform calculations, use the code_interpreter tool to execute code and get results."
)
BOXED_SUFFIX = "\n\nPut your final answer in \\boxed{}."


@dataclass(frozen=True)
class PromptTemplate:
    """How a raw problem becomes chat messages: an optional system message and a user message in which
    `{problem}` is replaced by the raw problem (plain replacement: templates and problems are full of braces)."""

    user: str
    system: str | None = None

    def messages(self, problem: str) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self.system}] if self.system else []
        return [*messages, {"role": "user", "content": self.user.replace("{problem}", problem)}]


PROMPTS: dict[str, PromptTemplate] = {
    "retool": PromptTemplate(user=RETOOL_USER),
    "dapo": PromptTemplate(user=DAPO_USER),
    "slime": PromptTemplate(user="{problem}" + BOXED_SUFFIX, system=SLIME_SYSTEM),
    "plain": PromptTemplate(user="{problem}" + BOXED_SUFFIX),
}


def get_prompt(prompt: str | PromptTemplate) -> PromptTemplate:
    if isinstance(prompt, PromptTemplate):
        return prompt
    if prompt not in PROMPTS:
        raise ValueError(f"unknown prompt {prompt!r}; choose one of {sorted(PROMPTS)} or pass a PromptTemplate")
    return PROMPTS[prompt]


def render_prompt(tokenizer: Tokenizer, template: PromptTemplate, problem: str, tools: list[dict] | None) -> list[int]:
    """Token ids of the chat prompt, ending with the assistant generation header. Templated exactly once."""
    ids = tokenizer.apply_chat_template(template.messages(problem), tools=tools or None, add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    return list(ids)


def prompt_messages(prompt: PromptTemplate, problem: str, system_prompt: str | None) -> list[dict[str, Any]]:
    """The prompt's chat messages, with `system_prompt` (the tools, for a template that does not render them)
    joined to the system message."""
    messages = prompt.messages(problem)
    if system_prompt is None:
        return messages
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": messages[0]["content"] + "\n\n" + system_prompt}, *messages[1:]]
    return [{"role": "system", "content": system_prompt}, *messages]
