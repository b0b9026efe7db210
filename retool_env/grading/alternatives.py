"""Answers that list or relate alternatives: the values an answer states, so that a hedge never pays.

An answer states one value, or a name and that value (`x = 42`, `f(x) = 2x`). A relation states a value on each
side, so every side but a leading name must equal the gold on its own: `\\frac{84}{2} = 42` is right for 42, and
`\\frac{84}{2} = 43` (a false equation), `x = 41 = 42` (a chain) and `42 \\approx 43` are right for no gold. Inside
brackets, where a side cannot be compared with the gold on its own, a relation must follow a name:
`(x = 1, y = 2)` is an answer, `(\\frac{84}{2} = 43, 5)` is not. Alternatives are never an answer: the word "or",
`\\lor`, `\\vee`, lines outside a matrix (`\\begin{cases} 42 \\\\ 43 \\end{cases}`), an elided list
(`1, 2, \\ldots, 100`), a value with another number in a unit-like tail (`42 \\text{ (possibly 43)}`). When the
gold itself has one of these forms, it is compared whole, as written.

One linear scan over tokens, no recursion: hostile text costs its length.
"""

from __future__ import annotations

import re
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
# break `\\\\` among them), a bracket, a comma.
_TOKEN = re.compile(r"(?<![<>!=:])=(?!=)|:=|\\(?P<edge>begin|end)\s*\{(?P<env>[^{}]*)\}|\\[A-Za-z]+|\\.|[{}()\[\],]")
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


def _relations(text: str) -> bool:
    return any(_is_relation(match.group()) for match in _TOKEN.finditer(text))


def stated_values(pred: str, gold: str) -> list[str] | None:
    """The values `pred` states, each of which must equal `gold` for the answer to be right; None when `pred` lists
    or relates alternatives. An answer with no relation states itself."""
    if len(pred) > MAX_ANSWER_CHARS or _PLAIN_NUMBER.fullmatch(pred):
        return [pred]  # over the limit: rejected unread by the fast path
    if _DISJUNCTION.search(pred) and not _DISJUNCTION.search(gold):
        return None
    if _ELIDED_LIST.search(pred) and not _ELIDED_LIST.search(gold):
        return None
    text = clean(pred)
    if _unread_number(text) and not _unread_number(clean(gold)):
        return None  # a value, and another one where math-verify reads a unit
    if _relations(gold):
        return [pred]
    lines_allowed = "\\\\" in gold
    # Per open bracket or environment, and the whole answer below them: where its current element (after the bracket
    # or the last comma) starts, whether that element has had a relation, and whether it is a matrix.
    levels: list[list[Any]] = [[0, False, False]]
    sides: list[str] = []
    side_start, listed, all_named = 0, False, True
    for match in _TOKEN.finditer(text):
        token, level = match.group(), levels[-1]
        edge = match.group("edge")
        if token in _OPEN or edge == "begin":
            levels.append([match.end(), False, edge == "begin" and match.group("env").strip() in _MATRICES])
        elif token in _CLOSE or edge == "end":
            if len(levels) > 1:
                levels.pop()
        elif token == "\\\\" and not level[2] and not lines_allowed:
            return None  # lines outside a matrix (cases, aligned, substack) list alternatives
        elif token == ",":
            level[:2] = [match.end(), False]
            listed = listed or len(levels) == 1
        elif _is_relation(token):
            follows_name = not level[1] and _names_something(text[level[0] : match.start()])
            level[1] = True
            if len(levels) > 1 and not follows_name:
                return None  # inside brackets, only `name = value`: a side cannot be compared with the gold alone
            if len(levels) == 1:
                all_named = all_named and follows_name
                sides.append(text[side_start : match.start()])
                side_start = match.end()
    if listed:  # `a = 1, b = 2`: a list of `name = value`, compared whole
        return [pred] if all_named else None
    if not sides:
        return [pred]
    sides.append(text[side_start:])
    if _names_something(sides[0]):
        sides = sides[1:]  # `x = 42` states 42
    values = [side.strip() for side in sides if side.strip()]
    return values or None
