"""deepseek_v3: DeepSeek-V3 and DeepSeek-R1 (and the R1-Distill template), calls inside a tool-calls section.

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>code_interpreter
    ```json
    {"code": "print(6 * 7)"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Several calls per section. The templates read `function.arguments` as a JSON string and render no tool schemas:
the system prompt must describe them (`tool_system_prompt`). vLLM: `--tool-call-parser deepseek_v3`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from retool_env.dialects.base import Dialect, FunctionCall, RawCall, Scan, arguments_object, scan_blocks

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


class DeepSeekV3(Dialect):
    name = "deepseek_v3"
    markers = (("tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json",),
               ("<｜tool▁sep｜>' + tool['function']['name']",))
    end_tokens = ("<｜end▁of▁sentence｜>",)
    arguments_as_string = True
    call_blocks = ((CALLS_BEGIN, CALLS_END), (CALL_BEGIN, CALL_END))

    def _scan(self, text: str) -> Scan:
        scan = Scan()
        content, section = text, ""
        opened = text.find(CALLS_BEGIN)
        if opened >= 0:  # the section's end marker is optional: R1-Distill's template leaves it out for one call
            content = text[:opened]
            section, _, after = text[opened + len(CALLS_BEGIN):].partition(CALLS_END)
            content += after
        scan.content.append(content)
        calls = scan_blocks(section, CALL_BEGIN, CALL_END, lambda body: [self.read_call(body)])
        scan.calls, scan.unfinished = calls.calls, calls.unfinished
        return scan

    def read_call(self, body: str) -> RawCall:
        kind, sep, rest = body.partition(SEP)
        if not sep:
            return RawCall(None, error=f"a call needs function{SEP}NAME before its arguments")
        name, _, arguments = rest.partition("\n")
        arguments = arguments.strip()
        if arguments.startswith("```"):
            arguments = arguments.removeprefix("```json").removeprefix("```").removesuffix("```").strip()
        return RawCall(name.strip(), *arguments_object(arguments, "arguments"))

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        body = "\n".join(f"{CALL_BEGIN}function{SEP}{call.name}\n```json\n"
                         f"{json.dumps(call.arguments, ensure_ascii=False)}\n```{CALL_END}" for call in calls)
        return f"{CALLS_BEGIN}{body}{CALLS_END}"


DeepSeekV3.register()
