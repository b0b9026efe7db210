"""The in-process fast path: DAPO/Minerva-style normalisation with their known faults fixed, and an exact
comparison of integers, decimals and fractions. DAPO and AIME answers are decided here in microseconds."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from .extraction import BOX_OPEN, MAX_ANSWER_CHARS, SPECIAL_TOKEN, braced_content

_UNICODE = {"−": "-", "–": "-", "π": "\\pi", "∞": "\\infty", "°": "^\\circ", "\u00a0": " ", "×": "\\times"}
_DIGIT_GROUP = re.compile(r"(?<=\d)\\,(?=\d{3}\b)")  # 10\,000: a separator, then judged by _THOUSANDS
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
_PERCENT = re.compile(r"\\?%")
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
_THOUSANDS = re.compile(r"^[-+]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")  # never a leading "0," group: 0,111 is not 111
_ZERO_GROUP = re.compile(r"^[-+]?0(?:,\d{3})+(?:\.\d+)?$")
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


def clean(s: str) -> str:
    """Light clean-up both paths share: what math-verify itself gets wrong (quotes, `6.`, Unicode minus)."""
    s = SPECIAL_TOKEN.sub("", s).strip()
    for before, after in _UNICODE.items():
        s = s.replace(before, after)
    while True:
        unwrapped = _strip_delimiters(s)
        box = BOX_OPEN.match(unwrapped)
        if box and braced_content(unwrapped, box.end()) == unwrapped[box.end() : -1]:
            unwrapped = unwrapped[box.end() : -1]
        unwrapped = _strip_quotes(unwrapped.strip())
        if unwrapped.endswith(".") and not unwrapped.endswith("..."):
            unwrapped = unwrapped[:-1].rstrip()
        if unwrapped == s:
            return s
        s = unwrapped


def drop_percent(s: str) -> str:
    """A percent sign is a unit, read one way on both sides: `42\\%` is 42, so it equals a gold 42 or `42\\%` and
    never 0.42 (math-verify reads it both ways, which would pay one hedge for two golds)."""
    return _PERCENT.sub("", s)


def normalize_answer(s: str) -> str:
    """Canonical string for comparison (a percent sign dropped: see `drop_percent`)."""
    s = clean(s)
    s = _DIGIT_GROUP.sub(",", s).replace("{,}", ",")
    s = _SPACING.sub(" ", s).replace("\\$", "")
    for _ in range(3):  # \text{\textbf{x}}
        s = _TEXT.sub(r"\1", s)
    s = _strip_quotes(s.strip())
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = _DEGREES.sub("", s)
    s = drop_percent(s)
    assignment = _ASSIGNMENT.match(s)
    if assignment and "=" not in s[assignment.end() :]:
        s = s[assignment.end() :]
    s = s.strip().rstrip(".").strip()
    unit = _UNIT_SUFFIX.match(s)
    if unit and all(word.lower() in _UNIT_WORDS for word in unit.group(2).split()):
        s = unit.group(1)
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return "".join(s.split())


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
class Verdict:
    correct: bool
    method: str
    timed_out: bool = False


def fast_verdict(pred: str, gold: str) -> Verdict | None:
    """Decide in-process when the answer is a plain number or normalises to the gold; None means "ask math-verify"."""
    pred, gold = pred.strip(), gold.strip()
    if pred == gold:
        return Verdict(True, "exact")
    plain = _numeric_verdict(_as_number(pred), _as_number(gold))  # DAPO/AIME answers end here, unnormalised
    if plain is not None:
        return plain
    if len(pred) > MAX_ANSWER_CHARS or pred.count("{") != pred.count("}"):
        return Verdict(False, "rejected")
    norm_pred, norm_gold = normalize_answer(pred), normalize_answer(gold)
    if not norm_pred:
        return Verdict(False, "rejected")
    if norm_pred == norm_gold:
        return Verdict(True, "exact")
    if _ZERO_GROUP.match(norm_pred):  # math-verify reads "0\\,111" as 111: a digit group after 0 is no number
        return Verdict(False, "numeric")
    words = _WORDS.match(norm_pred) and _WORDS.match(norm_gold) and len(norm_gold) > 1
    if words and norm_pred.casefold() == norm_gold.casefold():
        return Verdict(True, "exact")
    gold_base = _BASE_NUMERAL.match(norm_gold)
    if gold_base:  # math-verify drops the subscript, so it calls "52_9" equal to "52_8"
        pred_base = _BASE_NUMERAL.match(norm_pred.upper())
        same_digits = (pred_base.group(1) if pred_base else norm_pred).casefold() == gold_base.group(1).casefold()
        return Verdict(same_digits and (pred_base is None or pred_base.group(2) == gold_base.group(2)), "exact")
    return _numeric_verdict(_as_number(norm_pred), _as_number(norm_gold))


def _numeric_verdict(pred: tuple[Fraction, bool] | None, gold: tuple[Fraction, bool] | None) -> Verdict | None:
    """Exact comparison of two plain numbers; None when either is not one, or when rounding may matter."""
    if pred is None or gold is None:
        return None
    (p, p_decimal), (g, g_decimal) = pred, gold
    if p == g:
        return Verdict(True, "numeric")
    if p_decimal != g_decimal and not _terminates(g if p_decimal else p):
        return None  # a rounded decimal against 1/3: math-verify compares to 6 places
    return Verdict(False, "numeric")
