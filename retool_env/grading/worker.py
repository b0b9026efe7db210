"""The math-verify worker's main loop: a fresh interpreter runs this file by path (`python worker.py`).

It never imports `retool_env` (so the trainer's package, and whatever it imports, stays out of the worker) and
imports nothing outside the standard library before `serve()` has taken its own directory off `sys.path`.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

# sympy imports much of itself on first use: one of each kind of comparison, so no real call pays for it.
_WARM_UP = [
    ("1", "1"), ("\\frac{1}{2}", "0.5"), ("(1,2)", "(2,1)"), ("x=5", "5"), ("\\{1,2\\}", "\\{1,3\\}"),
    ("[1,3)", "(1,3]"), ("y=2x+3", "y=3x+2"), ("70\\sqrt{2}", "70"), ("x^2+1", "(x+1)^2"), ("\\frac{\\pi}{2}", "\\pi"),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}2\\\\1\\end{pmatrix}"), ("2i+1", "1+2i"),
]
MEMORY_LIMIT = 4 << 30  # a runaway sympy expansion raises MemoryError instead of swapping the machine


class _SoftTimeout(BaseException):
    """Raised by SIGALRM inside the worker; a BaseException so math-verify's `except Exception` cannot swallow it."""


def serve() -> None:
    """Read {"pred", "gold", "soft_timeout"} lines, answer {"ready"} once, then {"equal"} / {"timeout"} / {"error"}."""
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # this package's modules must not shadow anything math-verify imports
    import logging
    import resource
    import signal

    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything sympy prints goes to stderr, not into the protocol

    def reply(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY or soft > MEMORY_LIMIT:
            resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, hard))
    except (ValueError, OSError):
        pass
    try:
        logging.disable(logging.WARNING)
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

        config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
        latex, expression = config[:1], config[1:]

        def read_whole(pred: str) -> list[Any]:
            """The answer as LaTeX, else as a plain expression only if that reads all of it: math-verify's own
            fallback reads the last number of a text it cannot parse (`42 \\sim 43` as 43), a hedge that pays."""
            parsed = parse("\\boxed{" + pred + "}", extraction_config=latex, parsing_timeout=None)
            if any(not isinstance(item, str) for item in parsed):
                return parsed
            plain = parse(pred, extraction_config=expression, parsing_timeout=None)
            return plain if plain and plain[-1].strip() == pred.strip() else parsed

        def equal(pred: str, gold: str) -> bool:
            gold_parsed = parse("\\boxed{" + gold + "}", extraction_config=config, parsing_timeout=None)
            return bool(verify(gold_parsed, read_whole(pred), timeout_seconds=None))

        for pred, gold in _WARM_UP:
            equal(pred, gold)
    except Exception as exc:
        reply({"ready": False, "error": f"math-verify unavailable in the grading worker: {exc!r}"})
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise _SoftTimeout

    signal.signal(signal.SIGALRM, on_alarm)
    reply({"ready": True})
    for line in sys.stdin:
        try:
            request = json.loads(line)
            signal.setitimer(signal.ITIMER_REAL, max(0.01, float(request["soft_timeout"])))
            try:
                message: dict[str, Any] = {"equal": equal(request["pred"], request["gold"])}
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _SoftTimeout:
            message = {"timeout": True}
        except Exception as exc:  # math-verify catches most of its own errors; anything else is "not equal"
            message = {"equal": False, "note": repr(exc)[:200]}
        reply(message)


if __name__ == "__main__":
    serve()
