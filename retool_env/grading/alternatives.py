"""Answers that list or relate alternatives: the values an answer states, so that a hedge never pays.

An answer states one value, or a name and that value (`x = 42`, `f(x) = 2x`). A relation states a value on each
side, so every side but a leading name must equal the gold on its own: `\\frac{84}{2} = 42` is right for 42, and
`\\frac{84}{2} = 43` (a false equation), `x = 41 = 42` (a chain) and `42 \\approx 43` are right for no gold. Inside
brackets, where a side cannot be compared with the gold on its own, a relation must follow a name:
`(x = 1, y = 2)` is an answer, `(\\frac{84}{2} = 43, 5)` is not. Against a gold that is itself an equation (or a
set-builder) an answer is compared whole, with no more relations than the gold has: `y = 2x + 3 = 3x + 2` is a
chain. Alternatives are never an answer: the word "or", `\\lor`, `\\vee`, lines outside a matrix
(`\\begin{cases} 42 \\\\ 43 \\end{cases}`), an elided list (`1, 2, \\ldots, 100`), a value with another number in
a unit-like tail (`42 \\text{ (possibly 43)}`). When the gold itself has one of these forms, the answer may too.

One linear scan over tokens, no recursion: hostile text costs its length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .extraction import MAX_ANSWER_CHARS
from .normalization import clean

_RELATION_MACROS = frozenset({
    "approx", "approxeq", "simeq", "sim", "cong", "equiv", "doteq", "coloneqq", "eqqcolon", "to", "rightarrow",
    "longrightarrow", "Rightarrow", "Longrightarrow", "implies", "iff", "Leftrightarrow", "leftrightarrow",
    "Longleftrightarrow", "mapsto", "mid",
})  # fmt: skip
_PLAIN_NUMBER = re.compile(r"\s*[-+]?\d+(?:\.\d+)?\s*")  # DAPO and AIME answers: nothing to scan
_DISJUNCTION = re.compile(r"(?<![A-Za-z\\])or(?![A-Za-z])|\\(?:lor|vee)(?![A-Za-z])", re.IGNORECASE)
_ELLIPSIS = r"(?:\\[lc]?dots[bc]?(?![A-Za-z])|\.\.\.|…)"
_ELIDED_LIST = re.compile(rf",\s*{_ELLIPSIS}|{_ELLIPSIS}\s*,")  # `1, 2, \ldots, 100`: a range, not a value
# math-verify drops an answer's tail from its first text group on, as a unit, when the answer ends in a brace (and a
# power): a number there (`42 \text{ (possibly 43)}`, `42 \text{ (} 43 \text{)}`) would go unread.
_TEXT_OPEN = re.compile(r"\\(?:text(?:normal|bf|it|rm)?|mbox|math(?:rm|it|bf))\s*\{")
_UNIT_POWER = re.compile(r"\}\s*(?:\^\s*\{?\s*\d\s*\}?|\{\^\s*\d\s*\})?\s*$")
# `=` alone (not `<=`, `>=`, `!=`, `==`), `:=`, an environment's start or end, a macro, an escaped character (a line
# break `\\\\` among them), a bracket, a comma that is no thousands separator (`10,\\!080`).
_TOKEN = re.compile(r"(?<![<>!=:])=(?!=)|:=|\\(?P<edge>begin|end)\s*\{(?P<env>[^{}]*)\}|\\[A-Za-z]+|\\.|[{}()\[\]]"
                    r"|(?<!\d),|,(?!\s*(?:\\!\s*)?\d{3}(?!\d))")
_OPEN = frozenset({"{", "(", "[", "\\{"})
_CLOSE = frozenset({"}", ")", "]", "\\}"})
_MATRICES = frozenset({"matrix", "pmatrix", "bmatrix", "Bmatrix", "vmatrix", "Vmatrix", "smallmatrix", "array"})
_GREEK = (r"alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|rho|sigma|"
          r"tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|Phi|Psi|Omega")
# A variable: a letter that is not part of a macro's name, or a Greek letter other than pi (a number).
_VARIABLE = re.compile(rf"(?<![\\A-Za-z])[A-Za-z]|\\(?:{_GREEK})(?![A-Za-z])")


def _is_relation(token: str) -> bool:
    return token in ("=", ":=") or (token[0] == "\\" and token[1:] in _RELATION_MACROS)


def _names_something(side: str) -> bool:
    """Whether a relation's side names an unknown (`x`, `f(x)`, `a_1`, `\\theta`, `\\text{area}`) rather than
    states a value (`\\frac{84}{2}`, `2\\pi`)."""
    return _VARIABLE.search(side) is not None


def _unread_number(text: str) -> bool:
    """Whether `text` is a value followed by a unit-like tail that holds a number (see `_TEXT_OPEN`)."""
    text_group = _TEXT_OPEN.search(text)
    if text_group is None or not text[: text_group.start()].strip():
        return False
    power = _UNIT_POWER.search(text, text_group.start())
    return power is not None and any(c.isdigit() for c in text[text_group.start() : power.start()])


@dataclass
class _Shape:
    """What one scan finds in an answer: its sides at the top level (split at relations), and the forms below it."""

    sides: list[str] = field(default_factory=list)
    listed: bool = False  # commas at the top level: `a = 1, b = 2`
    all_named: bool = True  # every top-level relation follows a name within its comma-separated element
    nested: bool = False  # a relation inside brackets
    nested_unnamed: bool = False  # one not after a name, or a second one in its element: `(\\frac{84}{2} = 43, 5)`
    lines: bool = False  # a line break outside a matrix: `\\begin{cases} 42 \\\\ 43 \\end{cases}`

    @property
    def relations(self) -> int:
        return len(self.sides) - 1


def _shape(text: str) -> _Shape:
    """One pass over `text`'s tokens, keeping per open bracket or environment (and the top level below them) where its
    current element starts (after the bracket or the last comma), whether that element has had a relation, and
    whether it is a matrix."""
    shape = _Shape()
    levels: list[list[Any]] = [[0, False, False]]
    side_start = 0
    for match in _TOKEN.finditer(text):
        token, level, edge = match.group(), levels[-1], match.group("edge")
        if token in _OPEN or edge == "begin":
            levels.append([match.end(), False, edge == "begin" and match.group("env").strip() in _MATRICES])
        elif token in _CLOSE or edge == "end":
            if len(levels) > 1:
                levels.pop()
        elif token == "\\\\":
            shape.lines = shape.lines or not level[2]
        elif token == ",":
            level[:2] = [match.end(), False]
            shape.listed = shape.listed or len(levels) == 1
        elif _is_relation(token):
            follows_name = not level[1] and _names_something(text[level[0] : match.start()])
            level[1] = True
            if len(levels) > 1:
                shape.nested = True
                shape.nested_unnamed = shape.nested_unnamed or not follows_name
            else:
                shape.all_named = shape.all_named and follows_name
                shape.sides.append(text[side_start : match.start()])
                side_start = match.end()
    shape.sides.append(text[side_start:])
    return shape


def stated_values(pred: str, gold: str) -> list[str] | None:
    """The values `pred` states, each of which must equal `gold` for the answer to be right; None when `pred` lists
    or relates alternatives. An answer with no relation states itself."""
    if len(pred) > MAX_ANSWER_CHARS or _PLAIN_NUMBER.fullmatch(pred):
        return [pred]  # over the limit: rejected unread by the fast path
    if _DISJUNCTION.search(pred) and not _DISJUNCTION.search(gold):
        return None
    if _ELIDED_LIST.search(pred) and not _ELIDED_LIST.search(gold):
        return None
    text, gold_text = clean(pred), clean(gold)
    if _unread_number(text) and not _unread_number(gold_text):
        return None  # a value, and another one where math-verify reads a unit
    shape, gold_shape = _shape(text), _shape(gold_text)
    if shape.lines and not gold_shape.lines:
        return None  # lines outside a matrix (cases, aligned, substack) list alternatives
    if gold_shape.relations or gold_shape.nested:  # an equation or a set-builder: compared whole, chains refused
        return [pred] if shape.relations <= gold_shape.relations else None
    if shape.nested_unnamed:
        return None  # inside brackets, only `name = value`: a side cannot be compared with the gold alone
    if shape.listed:  # `a = 1, b = 2`: a list of `name = value`, compared whole
        return [pred] if shape.all_named else None
    if not shape.relations:
        return [pred]
    sides = shape.sides[1:] if _names_something(shape.sides[0]) else shape.sides  # `x = 42` states 42
    values = [side.strip() for side in sides if side.strip()]
    return values or None
