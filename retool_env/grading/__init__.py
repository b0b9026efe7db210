"""Answer extraction and grading: the reward signal, so a right answer must never be graded wrong.

Extraction policy (what counts as the model's final answer), applied to the model's own text only:

- Code blocks, `<code>`/`<interpreter>`/tool-call blocks and special tokens are never read: code that prints
  `\\boxed{42}` earns nothing. When there is an `<answer>` block, only the last one is read.
- Boxes (`\\boxed{}`, `\\fbox{}`, brace-matched; a truncated box is skipped, a box inside a box is content):
  several boxes are one answer, joined as math-verify reads them. `\\boxed{1} and \\boxed{2}` is "1, 2" and
  equals a gold `1,2`; a value boxed twice counts once. Listing alternatives is never rewarded: `\\boxed{1} or
  \\boxed{2}` is a two-part answer, so it fails a one-part gold `2` (and so does a boxed guess later corrected in
  a second box: commit to one answer).
- `Answer:` lines (DAPO's prompt asks for one): the value, not the first symbol. The sentence ends at ". " before a
  capital letter (Minerva's "I hope it is correct." is dropped); in prose the value follows the last "is", "are" or
  "equals" (`Final Answer: The largest $n$ is 34.` states 34); a `$...$` span is unwrapped.
- The last stated final answer wins: an answer line after the last box beats it when it says "Final Answer:" or
  opens a line (`So \\boxed{255} is the interest. Final Answer: The final answer is $10,455$.` answers 10,455); a
  box after an answer line beats the line. A mid-sentence "...the answer: we are done" never beats a box.
- Thousands separators (`10,455`, `10\\,455`, `10{,}455`) are read only in groups of three after a first group of
  1-3 digits that does not start with 0: `0,111` is not 111.

Four layers grade the extracted answer, cheapest first:

1. `extract_answer` (extraction.py), the policy above.
2. `stated_values` (alternatives.py): an answer states one value, or a name and that value; every value a relation
   states must equal the gold (`\\frac{84}{2} = 43` and `x = 41 = 42` are right for no gold), and "or", `\\lor`,
   `\\vee`, lines outside a matrix and elided lists are never an answer. A `%` is a unit on both sides (`42\\%` is
   42, never 0.42).
3. A fast path in this process (normalization.py): DAPO/Minerva-style normalisation with their known faults fixed
   (spaces, quotes, a trailing period, `\\text{}`, `x=`, units and degrees, `\\dfrac`, Unicode minus, thousands
   separators, leading zeros) and an exact comparison of integers, decimals and fractions. DAPO and AIME answers
   end here in microseconds.
4. math-verify for everything else (sets, intervals, tuples, radicals, expressions), in worker processes with a
   hard timeout (pool.py runs worker.py in fresh interpreters). The answer must parse whole: math-verify's habit
   of reading the last number of a text it cannot parse (`42 \\sim 43` read as 43) is not used.

`strict_box_correct` reproduces verl's `math_dapo` strict box check exactly, so a run can log what the verl recipe
would have rewarded next to the real verdict (`Grade.strict_correct`).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import Any

from .alternatives import stated_values
from .extraction import MAX_ANSWER_CHARS, extract_answer, strict_box_correct
from .normalization import Verdict, clean, drop_percent, fast_verdict, normalize_answer
from .pool import WORKER_STARTUP_TIMEOUT, close_grading_pool, compare, count, grading_stats

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_ANSWER_CHARS",
    "WORKER_STARTUP_TIMEOUT",
    "Grade",
    "agrade",
    "close_grading_pool",
    "extract_answer",
    "grade",
    "grading_stats",
    "is_equivalent",
    "normalize_answer",
    "stated_values",
    "strict_box_correct",
]

DEFAULT_TIMEOUT = 5.0
"""Seconds one math-verify comparison may take before it counts as not equivalent (math-verify's own default).
Typical comparisons take 1-100 ms; the margin keeps a loaded machine from failing right answers."""


@dataclass(frozen=True)
class Grade:
    """The verdict on one episode's final answer.

    `method` says what decided it: "exact" or "numeric" (fast path), "math_verify", "timeout", "error" (the worker
    failed), "rejected" (malformed, or over `MAX_ANSWER_CHARS`: then `pred` is cut there), "alternatives" (the
    answer lists or relates alternatives: see `stated_values`) or "none" (no answer found). `strict_correct` is
    verl's strict box verdict on the same text, a metric to log beside `correct`.
    """

    correct: bool
    pred: str | None
    method: str
    strict_correct: bool = False
    timed_out: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _in_process_verdict(pred: str, gold: str) -> Verdict | None:
    count("calls")
    verdict = fast_verdict(pred, gold)
    if verdict is not None:
        count("rejected" if verdict.method == "rejected" else "fast_path")
    return verdict


def _math_verify_verdict(pred: str, gold: str, timeout: float) -> Verdict:
    return compare(drop_percent(clean(pred)), drop_percent(clean(gold)), timeout)


_ALTERNATIVES = Verdict(False, "alternatives")


@dataclass(frozen=True)
class _Comparison:
    """The values an answer states (see `stated_values`) and the fast path's verdict on each (None: math-verify's)."""

    gold: str
    values: tuple[str, ...]
    fast: tuple[Verdict | None, ...]

    @property
    def settled(self) -> Verdict | None:
        """The verdict when the fast path alone decides it: a value graded wrong, or every value graded right."""
        if not self.values:
            return _ALTERNATIVES
        wrong = next((verdict for verdict in self.fast if verdict is not None and not verdict.correct), None)
        return wrong or (None if None in self.fast else self.fast[-1])

    def finish(self, timeout: float) -> Verdict:
        """The verdict, asking math-verify about the values the fast path left open (blocking)."""
        verdict = _ALTERNATIVES
        for value, fast in zip(self.values, self.fast, strict=True):
            verdict = fast or _math_verify_verdict(value, self.gold, timeout)
            if not verdict.correct:
                break
        return verdict


def _compare(pred: str, gold: str) -> _Comparison:
    values = stated_values(pred, gold)
    if values is None:
        count("calls")
        count("rejected")
        return _Comparison(gold, (), ())
    return _Comparison(gold, tuple(values), tuple(_in_process_verdict(value, gold) for value in values))


def is_equivalent(pred: str, gold: str, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Whether an extracted answer equals the gold: every value it states (see `stated_values`), fast path first,
    then math-verify with a hard timeout.

    Safe from any thread and inside a running event loop (it blocks; use `agrade` there); never raises for any
    string input; a timeout counts as not equivalent.
    """
    comparison = _compare(str(pred), str(gold))
    return (comparison.settled or comparison.finish(timeout)).correct


@dataclass(frozen=True)
class _FirstPass:
    """What `grade` and `agrade` know before math-verify: the answer, verl's verdict, and the fast path's."""

    pred: str | None
    strict: bool
    comparison: _Comparison | None

    @property
    def needs_math_verify(self) -> bool:
        return self.comparison is not None and self.comparison.settled is None

    def finish(self, verdict: Verdict | None = None) -> Grade:
        verdict = verdict or (self.comparison.settled if self.comparison else None)
        if verdict is None or self.pred is None:
            return Grade(False, self.pred, "none", strict_correct=self.strict)
        pred = self.pred if len(self.pred) <= MAX_ANSWER_CHARS else self.pred[:MAX_ANSWER_CHARS] + "..."  # for logs
        return Grade(verdict.correct, pred, verdict.method, strict_correct=self.strict, timed_out=verdict.timed_out)


def _first_pass(model_text: str, gold: str) -> _FirstPass:
    pred = extract_answer(model_text)
    strict = strict_box_correct(model_text, gold)
    return _FirstPass(pred, strict, None if pred is None else _compare(pred, gold))


def grade(model_text: str, gold: str, *, timeout: float = DEFAULT_TIMEOUT) -> Grade:
    """Grade the model-generated text of an episode (never interpreter output) against the gold answer."""
    first = _first_pass(model_text, str(gold))
    if first.comparison is None or not first.needs_math_verify:
        return first.finish()
    return first.finish(first.comparison.finish(timeout))


_INLINE_CHARS = 4096
"""Texts up to this length are read inline (tens of microseconds); longer ones in an executor thread, so that one
long answer does not hold up the event loop every episode shares."""


async def agrade(model_text: str, gold: str, *, timeout: float = DEFAULT_TIMEOUT) -> Grade:
    """`grade` for event loops: extraction and the fast path run inline for a short text (else in an executor
    thread), a math-verify call waits in an executor thread."""
    gold = str(gold)
    loop = asyncio.get_running_loop()
    if len(model_text) <= _INLINE_CHARS:
        first = _first_pass(model_text, gold)
    else:
        first = await loop.run_in_executor(None, _first_pass, model_text, gold)
    if first.comparison is None or not first.needs_math_verify:
        return first.finish()
    return first.finish(await loop.run_in_executor(None, first.comparison.finish, timeout))
