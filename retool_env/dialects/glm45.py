"""glm45: GLM-4.5/4.6 (GLM-4-MoE), a function name then `<arg_key>`/`<arg_value>` pairs inside `<tool_call>`.

    <tool_call>code_interpreter
    <arg_key>code</arg_key>
    <arg_value>print(6 * 7)</arg_value>
    </tool_call>

Values are text, strings as written and other values as JSON, typed by the tool's schema. Several calls per turn;
results go in an `<|observation|>` turn. vLLM: `--tool-call-parser glm45`.
"""

from __future__ import annotations

from collections.abc import Sequence

from retool_env.dialects.base import Dialect, FunctionCall, RawCall, Scan, find_blocks, scan_blocks, value_text


def read_glm_call(body: str) -> list[RawCall]:
    name_end = body.find("<arg_key>")
    name = (body if name_end < 0 else body[:name_end]).strip()
    if not name:
        return [RawCall(None, error="the <tool_call> block does not start with the function name")]
    arguments: dict[str, str] = {}
    rest = "" if name_end < 0 else body[name_end:]
    keys = list(find_blocks(rest, "<arg_key>", "</arg_key>"))
    for index, (_, key, closed) in enumerate(keys):
        if key is None:
            break
        if not closed:
            return [RawCall(name, error="an <arg_key> is not closed with </arg_key>")]
        after = keys[index + 1][0]  # the text up to the next <arg_key>: it holds this key's value
        value_start = after.find("<arg_value>")
        value_end = after.rfind("</arg_value>")
        if value_start < 0 or value_end < value_start:
            return [RawCall(name, error=f"<arg_key>{key.strip()}</arg_key> is not followed by "
                                        f"<arg_value>...</arg_value>")]
        arguments[key.strip()] = after[value_start + len("<arg_value>"):value_end]
    return [RawCall(name, arguments, text_valued=True)]


class Glm45(Dialect):
    name = "glm45"
    markers = (("<arg_key>",),)
    aliases = ("glm4_moe",)
    end_tokens = ("<|user|>", "<|endoftext|>")
    stop_strings = ("<|observation|>",)
    call_blocks = (("<tool_call>", "</tool_call>"),)

    def _scan(self, text: str) -> Scan:
        return scan_blocks(text, "<tool_call>", "</tool_call>", read_glm_call)

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        blocks = []
        for call in calls:
            pairs = "".join(f"<arg_key>{key}</arg_key>\n<arg_value>"
                            f"{value_text(value)}"
                            f"</arg_value>\n" for key, value in call.arguments.items())
            blocks.append(f"<tool_call>{call.name}\n{pairs}</tool_call>")
        return "\n".join(blocks)


Glm45.register()
