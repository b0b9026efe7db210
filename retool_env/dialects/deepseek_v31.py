"""deepseek_v31: DeepSeek-V3.1 and later, `NAME<｜tool▁sep｜>{json}` inside the same tool-calls section as V3.

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>code_interpreter<｜tool▁sep｜>{"code": "print(6 * 7)"}
    <｜tool▁call▁end｜><｜tool▁calls▁end｜>

(one line, wrapped here).

vLLM: `--tool-call-parser deepseek_v31`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from retool_env.dialects.base import FunctionCall, RawCall, arguments_object
from retool_env.dialects.deepseek_v3 import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP, DeepSeekV3


class DeepSeekV31(DeepSeekV3):
    name = "deepseek_v31"
    markers = (("<｜tool▁sep｜>' + tool['function']['arguments']",), ("<｜tool▁calls▁begin｜>",))
    detect_after = ("deepseek_v3",)

    def read_call(self, body: str) -> RawCall:
        name, sep, arguments = body.partition(SEP)
        if not sep:
            return RawCall(None, error=f"a call needs NAME{SEP} before its arguments")
        return RawCall(name.strip(), *arguments_object(arguments.strip(), "arguments"))

    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        body = "".join(f"{CALL_BEGIN}{call.name}{SEP}{json.dumps(call.arguments, ensure_ascii=False)}{CALL_END}"
                       for call in calls)
        return f"{CALLS_BEGIN}{body}{CALLS_END}"


DeepSeekV31.register()
