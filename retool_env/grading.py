"""Answer extraction and grading: the reward signal, so a right answer must never be graded wrong.

Three layers, cheapest first:

1. `extract_answer` takes the model's final answer: the last brace-matched `\\boxed{}` / `\\fbox{}` (preferring the
   last `<answer>` block), else an `Answer:` line. Code blocks and interpreter output are ignored.
2. A fast path in this process: DAPO/Minerva-style normalisation with their known faults fixed (spaces, quotes, a
   trailing period, `\\text{}`, `x=`, units and degrees, `\\dfrac`, Unicode minus, thousands separators, leading
   zeros) and an exact comparison of integers, decimals and fractions. DAPO and AIME answers end here in
   microseconds.
3. math-verify for everything else (sets, intervals, tuples, radicals, expressions), in worker processes with a
   hard timeout. math-verify's own timeouts use `signal.alarm`, which breaks off the main thread (verl's wrapper
   silently scores 0 in a worker thread), and sympy can spin on inputs like `10^{10^{10}}`; so each worker is a
   fresh interpreter (never a fork of the trainer: no torch, no `__main__` re-import) that a timed-out call kills
   and replaces. A timeout is "not equivalent", counted in `grading_stats()`, never an exception.

`strict_box_correct` reproduces verl's `math_dapo` strict box check exactly, so a run can log what the verl recipe
would have rewarded next to the real verdict (`Grade.strict_correct`).

The worker side (`_serve_math_verify`) lives in this file and is run by path, without importing `retool_env`, so
this module must import nothing outside the standard library at module level.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

DEFAULT_TIMEOUT = 5.0
"""Seconds one math-verify comparison may take before it counts as not equivalent (math-verify's own default).
Typical comparisons take 1-100 ms; the margin keeps a loaded machine from failing right answers."""

MAX_ANSWER_CHARS = 1000
"""Longer predictions are rejected unread: no MATH-500 answer is over 160 characters, and sympy can choke on them."""

_SOFT_TIMEOUT_FRACTION = 0.8  # the worker's own alarm fires first, so a kill (and a restart) is rarely needed

WORKER_STARTUP_TIMEOUT = 60.0
"""Seconds a new worker may take to import math-verify (not counted against a comparison's timeout)."""

# ------------------------------------------------------------------------------------------------------------------
# Extraction
# ------------------------------------------------------------------------------------------------------------------

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"\\[{}]|[{}]")  # an escaped brace is content, not structure
_SPECIAL_TOKEN = re.compile(r"<\|[^|<>]{1,40}\|>")
# Program text and tool output are not the model's answer: code that prints "\\boxed{42}" must not score.
_NOT_ANSWER_TEXT = re.compile(
    r"```.*?(?:```|\Z)|<(code|interpreter|tool_call|tool_response)>.*?(?:</\1>|\Z)", re.DOTALL | re.IGNORECASE
)
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.DOTALL | re.IGNORECASE)
_ANSWER_LINE = re.compile(r"(?i)\banswer\s*(?:\*\*)?\s*[:：]\s*(?:\*\*)?[ \t]*([^\n]*)")
_MATH_SPAN = re.compile(r"(?<!\\)\$+((?:[^$\\]|\\.)+?)(?<!\\)\$+")  # "\\$" is a dollar sign, not math
_MAX_UNBALANCED_BOXES = 8  # bounds the work on hostile text full of unclosed "\boxed{"


def _braced_content(text: str, start: int) -> str | None:
    """The text from `start` (just after an opening brace) to its matching closing brace, or None if unclosed."""
    depth = 1
    for match in _BRACE.finditer(text, start):
        token = match.group()
        if token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            if depth == 0:
                return text[start : match.start()]
    return None


def _last_box(text: str) -> str | None:
    """Content of the last closed `\\boxed{}`/`\\fbox{}`; an unclosed (truncated) box is skipped."""
    starts = [m.end() for m in _BOX_OPEN.finditer(text)]
    for start in reversed(starts[-_MAX_UNBALANCED_BOXES:]):
        content = _braced_content(text, start)
        if content is not None:
            return content.strip()
    return None


def _answer_line(text: str) -> str | None:
    """The last `Answer: X` line (DAPO's prompt asks for one), with `$...$` and markdown stripped."""
    matches = _ANSWER_LINE.findall(text)
    if not matches:
        return None
    line = matches[-1][: MAX_ANSWER_CHARS + 1].strip().strip("*").strip()  # longer is rejected anyway
    span = _MATH_SPAN.search(line)
    if span:
        line = span.group(1)
    line = line.strip().rstrip(".").strip()
    return line or None


def extract_answer(text: str) -> str | None:
    """The model's final answer: last `\\boxed{}`/`\\fbox{}` (inside the last `<answer>` block when there is one),
    else the last `Answer:` line, else None. Code blocks, `<interpreter>` output and special tokens are ignored."""
    text = _SPECIAL_TOKEN.sub("", _NOT_ANSWER_TEXT.sub("\n", text))
    blocks = _ANSWER_BLOCK.findall(text)
    if blocks:
        block = blocks[-1]
        found = _last_box(block) or _answer_line(block)
        if found:
            return found
        bare = block.strip()
        if bare and len(bare) <= MAX_ANSWER_CHARS and "\\boxed" not in bare:
            return _answer_line("Answer: " + bare.replace("\n", " "))
    return _last_box(text) or _answer_line(text)


def strict_box_correct(text: str, gold: str) -> bool:
    """verl/slime `math_dapo.compute_score(..., strict_box_verify=True)` exactly: the last `\\boxed{` within the last
    100 characters, braces counted without escapes, compared to the gold as an exact string (no strip)."""
    tail = text[-100:]
    start = tail.rfind("\\boxed{")
    extracted = "[INVALID]"  # verl's placeholder for "no box"; kept so the comparison is byte-for-byte theirs
    if start >= 0:
        depth = 0
        for i in range(start, len(tail)):
            if tail[i] == "{":
                depth += 1
            elif tail[i] == "}":
                depth -= 1
                if depth == 0:
                    extracted = tail[start + len("\\boxed{") : i]
                    break
    return extracted == str(gold)


# ------------------------------------------------------------------------------------------------------------------
# Fast path: normalisation and exact numbers
# ------------------------------------------------------------------------------------------------------------------

_UNICODE = {"−": "-", "–": "-", "π": "\\pi", "∞": "\\infty", "°": "^\\circ", "\u00a0": " ", "×": "\\times"}
_DIGIT_GROUP = re.compile(r"(?<=\d)\\,(?=\d{3}\b)")  # 10\,000
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
_SPACING = re.compile(r"\\(?:displaystyle|left|right|quad|qquad|[,;:! ])|~")
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_TEXT = re.compile(r"\\(?:text|textbf|textrm|textnormal|mathrm|mbox)\s*\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\frac\s*([0-9a-zA-Z])\s*([0-9a-zA-Z])")
_SQRT_SHORT = re.compile(r"\\sqrt\s*([0-9a-zA-Z])")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree")
_ASSIGNMENT = re.compile(r"^(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?\w+\}?)?\s*=(?!=)\s*")
# Words need whitespace between them: "(?:[A-Za-z]+\s*)+" backtracks exponentially on "5 aaaa...a!".
_UNIT_SUFFIX = re.compile(r"^([-+]?[\d.,]+(?:/\d+)?)\s*([A-Za-z]+(?:\s+[A-Za-z]+)*)\s*(?:\^\s*\{?[23]\}?)?$")
# fmt: off
_UNIT_WORDS = frozenset(
    {
        "unit", "units", "square", "sq", "cubic", "cm", "mm", "m", "km", "meter", "meters", "metre", "metres", "inch",
        "inches", "in", "foot", "feet", "ft", "yard", "yards", "yd", "mile", "miles", "mi", "mph", "hour", "hours",
        "hr", "hrs", "minute", "minutes", "min", "mins", "second", "seconds", "sec", "s", "day", "days", "week",
        "weeks", "month", "months", "year", "years", "dollar", "dollars", "cent", "cents", "degree", "degrees", "pound",
        "pounds", "lb", "lbs", "ounce", "ounces", "oz", "gram", "grams", "g", "kg", "liter", "liters", "litre",
        "litres", "l", "ml", "gallon", "gallons", "people", "students", "ways", "points", "edges", "times", "percent"
    }
)
# fmt: on
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_INT = re.compile(r"^[-+]?\d+$")
_DECIMAL = re.compile(r"^[-+]?(?:\d+\.\d*|\.\d+)$")
_FRAC = re.compile(r"^([-+]?)\\frac\{([-+]?\d+)\}\{([-+]?\d+)\}$")
_SLASH = re.compile(r"^([-+]?\d+)/(\d+)$")
_BASE_NUMERAL = re.compile(r"^((?=[0-9A-Z]*\d)[0-9A-Z]+)_\{?(\d{1,2})\}?$")  # 52_8, A3_{11}: not x_1
_WORDS = re.compile(r"^[A-Za-z][A-Za-z ]+$")
_MAX_DIGITS = 200  # int() of a huge digit string is slow (and capped by Python); such answers go to math-verify


def _strip_quotes(s: str) -> str:
    while len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"`":
        s = s[1:-1].strip()
    return s


def _strip_delimiters(s: str) -> str:
    """`$x$`, `$$x$$`, `\\(x\\)`, `\\[x\\]` -> x; not "$a$ and $b$", nor a trailing escaped dollar `\\$`."""
    for left, right in _DELIMITERS:
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            inner = s[len(left) : len(s) - len(right)]
            if not (right == "$" and inner.endswith("\\")) and not _UNESCAPED_DOLLAR.search(inner):
                return inner.strip()
    return s


def _clean(s: str) -> str:
    """Light clean-up both paths share: what math-verify itself gets wrong (quotes, `6.`, Unicode minus)."""
    s = _SPECIAL_TOKEN.sub("", s).strip()
    for before, after in _UNICODE.items():
        s = s.replace(before, after)
    while True:
        unwrapped = _strip_delimiters(s)
        box = _BOX_OPEN.match(unwrapped)
        if box and _braced_content(unwrapped, box.end()) == unwrapped[box.end() : -1]:
            unwrapped = unwrapped[box.end() : -1]
        unwrapped = _strip_quotes(unwrapped.strip())
        if unwrapped.endswith(".") and not unwrapped.endswith("..."):
            unwrapped = unwrapped[:-1].rstrip()
        if unwrapped == s:
            return s
        s = unwrapped


def normalize_answer(s: str) -> tuple[str, bool]:
    """Canonical string for comparison, and whether a percent sign was dropped (then "0.25" may equal "25\\%")."""
    s = _clean(s)
    s = _DIGIT_GROUP.sub("", s).replace("{,}", ",")
    s = _SPACING.sub(" ", s).replace("\\$", "")
    for _ in range(3):  # \text{\textbf{x}}
        s = _TEXT.sub(r"\1", s)
    s = _strip_quotes(s.strip())
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = _DEGREES.sub("", s)
    percent = s.rstrip().endswith("%")
    s = s.rstrip().removesuffix("\\%").removesuffix("%")
    assignment = _ASSIGNMENT.match(s)
    if assignment and "=" not in s[assignment.end() :]:
        s = s[assignment.end() :]
    s = s.strip().rstrip(".").strip()
    unit = _UNIT_SUFFIX.match(s)
    if unit and all(word.lower() in _UNIT_WORDS for word in unit.group(2).split()):
        s = unit.group(1)
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return "".join(s.split()), percent


def _as_number(s: str) -> tuple[Fraction, bool] | None:
    """(value, is_decimal) for an integer, decimal or fraction written plainly; None for anything else."""
    if len(s) > _MAX_DIGITS:
        return None
    if _INT.match(s):
        return Fraction(int(s)), False
    if _DECIMAL.match(s):
        return Fraction(s), True
    match = _FRAC.match(s) or _SLASH.match(s)
    if match is None:
        return None
    groups = match.groups()
    sign = -1 if len(groups) == 3 and groups[0] == "-" else 1
    numerator, denominator = int(groups[-2]), int(groups[-1])
    if denominator == 0:
        return None
    return sign * Fraction(numerator, denominator), False


def _terminates(value: Fraction) -> bool:
    """True when the fraction has a finite decimal expansion (denominator 2^a 5^b)."""
    d = value.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


@dataclass(frozen=True)
class _Verdict:
    correct: bool
    method: str
    timed_out: bool = False


def _fast_verdict(pred: str, gold: str) -> _Verdict | None:
    """Decide in-process when the answer is a plain number or normalises to the gold; None means "ask math-verify"."""
    pred, gold = pred.strip(), gold.strip()
    if pred == gold:
        return _Verdict(True, "exact")
    plain = _numeric_verdict(_as_number(pred), _as_number(gold))  # DAPO/AIME answers end here, unnormalised
    if plain is not None:
        return plain
    if len(pred) > MAX_ANSWER_CHARS or pred.count("{") != pred.count("}"):
        return _Verdict(False, "rejected")
    norm_pred, pred_percent = normalize_answer(pred)
    norm_gold, gold_percent = normalize_answer(gold)
    if not norm_pred:
        return _Verdict(False, "rejected")
    if norm_pred == norm_gold:
        return _Verdict(True, "exact")
    words = _WORDS.match(norm_pred) and _WORDS.match(norm_gold) and len(norm_gold) > 1
    if words and norm_pred.casefold() == norm_gold.casefold():
        return _Verdict(True, "exact")
    gold_base = _BASE_NUMERAL.match(norm_gold)
    if gold_base:  # math-verify drops the subscript, so it calls "52_9" equal to "52_8"
        pred_base = _BASE_NUMERAL.match(norm_pred.upper())
        same_digits = (pred_base.group(1) if pred_base else norm_pred).casefold() == gold_base.group(1).casefold()
        return _Verdict(same_digits and (pred_base is None or pred_base.group(2) == gold_base.group(2)), "exact")
    return _numeric_verdict(_as_number(norm_pred), _as_number(norm_gold), pred_percent != gold_percent)


def _numeric_verdict(
    pred: tuple[Fraction, bool] | None, gold: tuple[Fraction, bool] | None, percent_mismatch: bool = False
) -> _Verdict | None:
    """Exact comparison of two plain numbers; None when either is not one, or when rounding may matter."""
    if pred is None or gold is None:
        return None
    (p, p_decimal), (g, g_decimal) = pred, gold
    if p == g:
        return _Verdict(True, "numeric")
    if percent_mismatch:
        return None  # "25\%" against "0.25": math-verify knows percentages
    if p_decimal != g_decimal and not _terminates(g if p_decimal else p):
        return None  # a rounded decimal against 1/3: math-verify compares to 6 places
    return _Verdict(False, "numeric")


# ------------------------------------------------------------------------------------------------------------------
# Statistics
# ------------------------------------------------------------------------------------------------------------------

_stats: Counter[str] = Counter()
_stats_lock = threading.Lock()


def _count(key: str, n: int = 1) -> None:
    with _stats_lock:
        _stats[key] += n


def grading_stats(reset: bool = False) -> dict[str, int]:
    """Counters for a trainer to log: calls, fast-path and math-verify decisions, timeouts, worker errors/starts."""
    keys = ("calls", "fast_path", "math_verify_calls", "timeouts", "errors", "rejected", "worker_starts")
    with _stats_lock:
        snapshot = {key: _stats[key] for key in keys}
        if reset:
            _stats.clear()
    return snapshot


# ------------------------------------------------------------------------------------------------------------------
# The math-verify worker pool
# ------------------------------------------------------------------------------------------------------------------

# Load this file as a standalone module in a fresh interpreter: no retool_env import, cwd not on sys.path.
_BOOTSTRAP = (
    "import importlib.util, sys\n"
    "del sys.path[0]\n"
    "spec = importlib.util.spec_from_file_location('_retool_grading_worker', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "sys.modules[spec.name] = module\n"
    "spec.loader.exec_module(module)\n"
    "module._serve_math_verify()\n"
)


class _Worker:
    """One math-verify process spoken to over a pipe, one JSON line each way."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C aimed at the trainer does not kill a worker mid-call
        )
        self._buffer = b""
        self._poll = select.poll()  # not select.select: a trainer's descriptors can be numbered past 1024
        self._poll.register(self.proc.stdout.fileno(), select.POLLIN)
        self.ready = False
        _count("worker_starts")

    def _read_line(self, deadline: float) -> dict[str, Any] | None:
        """The next reply, or None when the deadline passes or the worker died."""
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._poll.poll(remaining * 1000):
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def call(self, request: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """Send a request and wait up to `timeout` for the reply (after the worker is ready)."""
        if not self.ready:
            hello = self._read_line(time.monotonic() + WORKER_STARTUP_TIMEOUT)
            if not hello or not hello.get("ready"):
                return {"error": (hello or {}).get("error", "math-verify worker failed to start")}
            self.ready = True
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            return None
        return self._read_line(time.monotonic() + timeout)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()


class _FairSlots:
    """First come, first served hand-off of worker slots: with `queue.Queue` a thread that puts a slot back and
    asks again at once can take it ahead of waiting threads, and starve them for seconds."""

    def __init__(self, items: list[_Worker | None]) -> None:
        self._free = deque(items)
        self._waiting: deque[tuple[threading.Event, list[_Worker | None]]] = deque()
        self._lock = threading.Lock()

    def get(self) -> _Worker | None:
        with self._lock:
            if self._free and not self._waiting:
                return self._free.popleft()
            ticket: tuple[threading.Event, list[_Worker | None]] = (threading.Event(), [])
            self._waiting.append(ticket)
        ticket[0].wait()
        return ticket[1][0]

    def put(self, item: _Worker | None) -> None:
        with self._lock:
            if not self._waiting:
                self._free.append(item)
                return
            event, box = self._waiting.popleft()
        box.append(item)
        event.set()


class _Pool:
    """A fixed number of worker slots; a caller holds one slot per comparison, so any thread can call."""

    def __init__(self, size: int) -> None:
        self._live: set[_Worker] = set()
        self._lock = threading.Lock()
        self.closed = False
        # All workers start together (in parallel, in the background) when the first comparison needs one.
        self._slots = _FairSlots([self._new_worker() for _ in range(size)])

    def _new_worker(self) -> _Worker | None:
        """A started worker, or None if no process can be started now (the next caller tries again)."""
        try:
            worker = _Worker()
        except OSError:
            return None
        with self._lock:
            self._live.add(worker)
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._live.discard(worker)

    def compare(self, pred: str, gold: str, timeout: float) -> _Verdict:
        worker = self._slots.get()
        try:
            if worker is None or worker.proc.poll() is not None:
                worker = self._new_worker()
            if worker is None:
                _count("errors")
                return _Verdict(False, "error")
            reply = worker.call({"pred": pred, "gold": gold, "soft_timeout": _SOFT_TIMEOUT_FRACTION * timeout}, timeout)
            if reply is None or "error" in reply:
                # Hung (or dead): kill it and start the replacement now, so its start-up overlaps other work.
                self._discard(worker)
                worker = None if self.closed else self._new_worker()
                if reply is None:
                    _count("timeouts")
                    return _Verdict(False, "timeout", timed_out=True)
                _count("errors")
                return _Verdict(False, "error")
            if reply.get("timeout"):
                _count("timeouts")
                return _Verdict(False, "timeout", timed_out=True)
            return _Verdict(bool(reply.get("equal")), "math_verify")
        finally:
            self._slots.put(worker)

    def close(self) -> None:
        self.closed = True
        with self._lock:
            workers, self._live = list(self._live), set()
        for worker in workers:
            worker.kill()


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _default_pool_size() -> int:
    """`RETOOL_GRADING_WORKERS`, else min(4, cpus): most answers never reach math-verify."""
    configured = os.environ.get("RETOOL_GRADING_WORKERS", "")
    return max(1, int(configured)) if configured.isdigit() else max(1, min(4, os.cpu_count() or 1))


def _get_pool() -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is None or _pool.closed:
            _pool = _Pool(_default_pool_size())
        return _pool


def close_grading_pool() -> None:
    """Stop the math-verify workers now (they restart on the next call); also runs at interpreter exit."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.close()


def _forget_pool_after_fork() -> None:
    """A forked child (the sandbox forks) must not share the parent's worker pipes; it builds its own if needed."""
    global _pool, _pool_lock, _stats_lock
    _pool, _pool_lock, _stats_lock = None, threading.Lock(), threading.Lock()


atexit.register(close_grading_pool)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


# ------------------------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grade:
    """The verdict on one episode's final answer.

    `method` says what decided it: "exact" or "numeric" (fast path), "math_verify", "timeout", "error" (the worker
    failed), "rejected" (malformed, or over `MAX_ANSWER_CHARS`: then `pred` is cut there) or "none" (no answer
    found). `strict_correct` is verl's strict box verdict on the same text, a metric to log beside `correct`.
    """

    correct: bool
    pred: str | None
    method: str
    strict_correct: bool = False
    timed_out: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _in_process_verdict(pred: str, gold: str) -> _Verdict | None:
    _count("calls")
    verdict = _fast_verdict(pred, gold)
    if verdict is not None:
        _count("rejected" if verdict.method == "rejected" else "fast_path")
    return verdict


def _math_verify_verdict(pred: str, gold: str, timeout: float) -> _Verdict:
    _count("math_verify_calls")
    return _get_pool().compare(_clean(pred), _clean(gold), timeout)


def is_equivalent(pred: str, gold: str, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Whether an extracted answer equals the gold: fast path first, then math-verify with a hard timeout.

    Safe from any thread and inside a running event loop (it blocks; use `agrade` there); never raises for any
    string input; a timeout counts as not equivalent.
    """
    pred, gold = str(pred), str(gold)
    return (_in_process_verdict(pred, gold) or _math_verify_verdict(pred, gold, timeout)).correct


def _grade_from(pred: str | None, verdict: _Verdict | None, strict: bool) -> Grade:
    if verdict is None:
        return Grade(False, pred, "none", strict_correct=strict)
    pred = pred if pred is None or len(pred) <= MAX_ANSWER_CHARS else pred[:MAX_ANSWER_CHARS] + "..."  # for logs
    return Grade(verdict.correct, pred, verdict.method, strict_correct=strict, timed_out=verdict.timed_out)


def grade(model_text: str, gold: str, *, timeout: float = DEFAULT_TIMEOUT) -> Grade:
    """Grade the model-generated text of an episode (never interpreter output) against the gold answer."""
    gold = str(gold)
    pred = extract_answer(model_text)
    strict = strict_box_correct(model_text, gold)
    if pred is None:
        return _grade_from(None, None, strict)
    verdict = _in_process_verdict(pred, gold) or _math_verify_verdict(pred, gold, timeout)
    return _grade_from(pred, verdict, strict)


async def agrade(model_text: str, gold: str, *, timeout: float = DEFAULT_TIMEOUT) -> Grade:
    """`grade` for event loops: the fast path runs inline, a math-verify call waits in an executor thread."""
    gold = str(gold)
    pred = extract_answer(model_text)
    strict = strict_box_correct(model_text, gold)
    if pred is None:
        return _grade_from(None, None, strict)
    verdict = _in_process_verdict(pred, gold)
    if verdict is None:
        loop = asyncio.get_running_loop()
        verdict = await loop.run_in_executor(None, _math_verify_verdict, pred, gold, timeout)
    return _grade_from(pred, verdict, strict)


# ------------------------------------------------------------------------------------------------------------------
# Worker process side (runs in a fresh interpreter started by _Worker)
# ------------------------------------------------------------------------------------------------------------------


# sympy imports much of itself on first use: one of each kind of comparison, so no real call pays for it.
_WARM_UP = [
    ("1", "1"), ("\\frac{1}{2}", "0.5"), ("(1,2)", "(2,1)"), ("x=5", "5"), ("\\{1,2\\}", "\\{1,3\\}"),
    ("[1,3)", "(1,3]"), ("y=2x+3", "y=3x+2"), ("70\\sqrt{2}", "70"), ("x^2+1", "(x+1)^2"), ("\\frac{\\pi}{2}", "\\pi"),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}2\\\\1\\end{pmatrix}"), ("2i+1", "1+2i"),
]


class _SoftTimeout(BaseException):
    """Raised by SIGALRM inside the worker; a BaseException so math-verify's `except Exception` cannot swallow it."""


def _serve_math_verify() -> None:
    """Worker loop: read {"pred", "gold", "soft_timeout"} lines, answer {"equal"} / {"timeout"} / {"error"}."""
    import logging
    import resource
    import signal

    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything sympy prints goes to stderr, not into the protocol

    def reply(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = 4 << 30  # a runaway sympy expansion raises MemoryError instead of swapping the machine
        if soft == resource.RLIM_INFINITY or soft > limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):
        pass
    try:
        logging.disable(logging.WARNING)
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

        config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

        def equal(pred: str, gold: str) -> bool:
            gold_parsed = parse("\\boxed{" + gold + "}", extraction_config=config, parsing_timeout=None)
            pred_parsed = parse("\\boxed{" + pred + "}", extraction_config=config, parsing_timeout=None)
            return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))

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
